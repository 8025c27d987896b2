"""Finished episodes → the learner's fixed-shape batch (left-padded prompt, right-padded response).

Every batch has the shape [B, P + R]: P is the longest prompt of the batch rounded up to a
multiple of `length_bucket` (at most max prompt tokens), R the same for the responses; with
length_bucket=0 they are the configured maxima. Padding never changes a loss or an advantage
(the masks exclude pads, positions count only real tokens), only the cost: a batch of ~480 prompt
+ ~265 response tokens is 512 + 320 wide instead of 512 + 768. Each (P, R) compiles the train
step once; there are at most ceil(max/bucket) of each, and `ShapeForecast` says which (P, R)
the next batches will likely have, so the loop compiles those ahead while episodes run (the
first step of a shape then costs no compile). Position t of `old_logprobs` holds
log p(tokens[t] | tokens[<t]) — the sampler's behaviour log-prob for response tokens, 0
elsewhere.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

# What Δt measures (see episode_durations); the config's run.duration_source is one of these.
DURATION_SOURCES = ("episode", "execution")
DURATION_FLOOR_S = 0.05  # the least Δt (a response without runnable code has none)


def episode_durations(experiences: Sequence[Any], source: str = "episode",
                      floor_s: float = DURATION_FLOOR_S) -> np.ndarray:
    """Δt per episode for the duration-aware weights, float32 [B].

    source "episode": the wall-clock from dispatch to return (sampling + instrumentation +
    execution + grading), i.e. exactly the time that makes fast actions come back more often in
    the asynchronous pool; "execution": the sandbox time of the program only (the paper's
    measurement; responses without runnable code then get `floor_s`).
    """
    if source == "episode":
        dt = [e.finished_at - e.started_at for e in experiences]
    elif source == "execution":
        dt = [e.duration_s for e in experiences]
    else:
        raise ValueError(f"duration source must be one of {DURATION_SOURCES}, got {source!r}")
    return np.maximum(np.asarray(dt, np.float32), floor_s)


def bucket_length(n: int, bucket: int, cap: int) -> int:
    """The least multiple of `bucket` >= n (at least one bucket), at most `cap`; 0: cap."""
    if bucket <= 0:
        return cap
    return min(cap, max(1, -(-n // bucket)) * bucket)


def build_batch(experiences: Sequence[Any], max_prompt: int, max_response: int, pad_id: int,
                duration_source: str = "episode",
                duration_floor_s: float = DURATION_FLOOR_S,
                length_bucket: int = 0,
                pad_to: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """tokens, attention_mask, response_mask, old_logprobs, credit_mask [B, P+R]; rewards,
    dt_s [B]. credit_mask: the response tokens a row's advantage applies to under
    `learner.failure_credit="error_line"` (an experience's `credit_span`, else its whole
    response; rollout/credit.py).

    length_bucket: P and R are the batch's longest prompt and response rounded up to a
    multiple of it (capped at max_prompt / max_response); 0 pads to the maxima.
    pad_to: (P, R) exactly instead (each at least the batch's longest).
    """
    for e in experiences:
        if len(e.prompt_ids) > max_prompt:
            raise ValueError(f"episode {e.episode_id}: prompt has {len(e.prompt_ids)} tokens, "
                             f"over max_prompt_tokens={max_prompt}")
        if len(e.response_ids) > max_response:
            raise ValueError(f"episode {e.episode_id}: response has {len(e.response_ids)} "
                             f"tokens, over max_response_tokens={max_response}")
    longest_p = max((len(e.prompt_ids) for e in experiences), default=0)
    longest_r = max((len(e.response_ids) for e in experiences), default=0)
    p, r = (batch_shape(experiences, max_prompt, max_response, length_bucket) if pad_to is None
            else pad_to)
    if p < longest_p or r < longest_r:
        raise ValueError(f"pad_to={pad_to} is shorter than the batch's longest prompt "
                         f"{longest_p} or response {longest_r}")
    b, t = len(experiences), p + r
    tokens = np.full((b, t), pad_id, np.int32)
    attention = np.zeros((b, t), np.int32)
    response = np.zeros((b, t), np.float32)
    old_logprobs = np.zeros((b, t), np.float32)
    credit = np.zeros((b, t), np.float32)
    for i, e in enumerate(experiences):
        prompt, resp = list(e.prompt_ids), list(e.response_ids)
        if len(e.logprobs) != len(resp):
            raise ValueError(f"episode {e.episode_id}: {len(e.logprobs)} logprobs for "
                             f"{len(resp)} response tokens")
        tokens[i, p - len(prompt):p] = prompt
        attention[i, p - len(prompt):p + len(resp)] = 1
        tokens[i, p:p + len(resp)] = resp
        response[i, p:p + len(resp)] = 1.0
        old_logprobs[i, p:p + len(resp)] = e.logprobs
        span = getattr(e, "credit_span", None)
        lo, hi = (0, len(resp)) if span is None else span
        if span is not None and not 0 <= lo < hi <= len(resp):
            raise ValueError(f"episode {e.episode_id}: credit_span {span} is not within its "
                             f"{len(resp)} response tokens")
        credit[i, p + lo:p + hi] = 1.0
    return {
        "tokens": tokens,
        "attention_mask": attention,
        "response_mask": response,
        "old_logprobs": old_logprobs,
        "credit_mask": credit,
        "rewards": np.asarray([e.reward for e in experiences], np.float32),
        "dt_s": episode_durations(experiences, duration_source, duration_floor_s),
    }


def batch_shape(experiences: Sequence[Any], max_prompt: int, max_response: int,
                length_bucket: int) -> tuple[int, int]:
    """The batch's own padded (P, R): its longest prompt and longest response, each rounded up
    to a multiple of `length_bucket` and capped at the maxima (0: the maxima)."""
    return (bucket_length(max((len(e.prompt_ids) for e in experiences), default=0),
                          length_bucket, max_prompt),
            bucket_length(max((len(e.response_ids) for e in experiences), default=0),
                          length_bucket, max_response))


def smallest_cover(shape: tuple[int, int], compiled: Collection[tuple[int, int]]
                   ) -> tuple[int, int] | None:
    """The compiled (P', R') with P' >= P and R' >= R and the fewest tokens P' + R' (then the
    fewest prompt columns), or None: the shape a batch of `shape` can run padded to without a
    compile (padding changes no loss, only the cost)."""
    p, r = shape
    fits = [s for s in compiled if s[0] >= p and s[1] >= r]
    return min(fits, key=lambda s: (s[0] + s[1], s[0])) if fits else None


def compile_pays_off(prob: float, steps_left: float, step_s_per_token: float, tokens: int,
                     cover_tokens: int | None, compile_s: float, cost_share: float,
                     payback: float = 1.0) -> bool:
    """Whether compiling the train step ahead for a batch shape of `tokens` (P + R) is worth
    its cost, where a batch of that shape otherwise runs padded to a compiled shape of
    `cover_tokens` (`smallest_cover`; None: no compiled shape holds it, so its first step
    would compile inside the step: always worth compiling ahead).

    The expected saving is prob x steps_left steps at that shape (`ShapeForecast`'s
    probability per batch) times what each saves, step_s_per_token x (cover_tokens - tokens)
    (a step's time taken as proportional to its tokens); the cost is the compile's share of
    the machine the loop runs on, compile_s x cost_share (on the CPU backend the compile takes
    one of the host's cores away from the sampler, the sandbox and the learner: 1 / cores; on
    an accelerator it runs on the host beside the device: 0). Worth it when the saving is at
    least `payback` times the cost (payback 0: always)."""
    if cover_tokens is None or payback <= 0 or cost_share <= 0:
        return True
    saving = prob * max(steps_left, 0.0) * step_s_per_token * max(cover_tokens - tokens, 0)
    return saving >= payback * compile_s * cost_share


class ShapeForecast:
    """The padded (P, R) that the next learner batch will likely have, from recent episodes.

    With F(p, r) the share of the last `window` episodes whose bucketed prompt is <= p and
    bucketed response <= r, a batch of B episodes drawn from them fits in (p, r) with
    probability G(p, r) = F(p, r)^B, so its shape is exactly (p_i, r_j) on the grid of observed
    buckets with probability
        G(p_i, r_j) - G(p_i-1, r_j) - G(p_i, r_j-1) + G(p_i-1, r_j-1).
    (The loop's batches are the first B to finish, not a random draw; the forecast only picks
    what to compile ahead, so a miss costs one compile in the step, as without it.)
    """

    def __init__(self, batch_size: int, max_prompt: int, max_response: int, length_bucket: int,
                 window: int = 64):
        self.batch_size, self.bucket = batch_size, length_bucket
        self.max_prompt, self.max_response = max_prompt, max_response
        self.seen: collections.deque[tuple[int, int]] = collections.deque(maxlen=window)

    def observe(self, prompt_len: int, response_len: int) -> None:
        self.seen.append((bucket_length(prompt_len, self.bucket, self.max_prompt),
                          bucket_length(response_len, self.bucket, self.max_response)))

    def probabilities(self) -> dict[tuple[int, int], float]:
        """{(P, R): probability} over the grid of observed buckets (sums to 1); {} if none."""
        if not self.seen:
            return {}
        obs = np.asarray(self.seen)  # [n, 2]
        ps, rs = np.unique(obs[:, 0]), np.unique(obs[:, 1])
        fits = (obs[:, 0, None, None] <= ps[None, :, None]) & (obs[:, 1, None, None]
                                                                <= rs[None, None, :])
        g = np.pad(fits.mean(0) ** self.batch_size, ((1, 0), (1, 0)))  # G with G(p_0, .) = 0
        exact = g[1:, 1:] - g[:-1, 1:] - g[1:, :-1] + g[:-1, :-1]
        return {(int(p), int(r)): float(exact[i, j]) for i, p in enumerate(ps)
                for j, r in enumerate(rs) if exact[i, j] > 0}

    def likely(self, min_prob: float) -> list[tuple[int, int]]:
        """The (P, R) with probability >= min_prob, most likely first."""
        probs = self.probabilities()
        return sorted((s for s, q in probs.items() if q >= min_prob), key=lambda s: -probs[s])
