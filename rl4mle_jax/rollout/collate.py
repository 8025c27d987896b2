"""Finished episodes → the learner's fixed-shape batch (left-padded prompt, right-padded response).

Every batch has the shape [B, P + R]: P is the longest prompt of the batch rounded up to a
multiple of `length_bucket` (at most max prompt tokens), R the same for the responses; with
length_bucket=0 they are the configured maxima. Padding never changes a loss or an advantage
(the masks exclude pads, positions count only real tokens), only the cost: a batch of ~480 prompt
+ ~265 response tokens is 512 + 320 wide instead of 512 + 768. Each (P, R) compiles the train
step once; there are at most ceil(max/bucket) of each. Position t of `old_logprobs` holds
log p(tokens[t] | tokens[<t]) — the sampler's behaviour log-prob for response tokens, 0
elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
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
                length_bucket: int = 0) -> dict[str, np.ndarray]:
    """tokens, attention_mask, response_mask, old_logprobs [B, P+R]; rewards, dt_s [B].

    length_bucket: P and R are the batch's longest prompt and response rounded up to a
    multiple of it (capped at max_prompt / max_response); 0 pads to the maxima.
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
    p = bucket_length(longest_p, length_bucket, max_prompt)
    b, t = len(experiences), p + bucket_length(longest_r, length_bucket, max_response)
    tokens = np.full((b, t), pad_id, np.int32)
    attention = np.zeros((b, t), np.int32)
    response = np.zeros((b, t), np.float32)
    old_logprobs = np.zeros((b, t), np.float32)
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
    return {
        "tokens": tokens,
        "attention_mask": attention,
        "response_mask": response,
        "old_logprobs": old_logprobs,
        "rewards": np.asarray([e.reward for e in experiences], np.float32),
        "dt_s": episode_durations(experiences, duration_source, duration_floor_s),
    }
