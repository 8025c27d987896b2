"""Finished episodes → the learner's fixed-shape batch (left-padded prompt, right-padded response).

Every batch has the shape [B, P + R] with P = max prompt tokens and R = max response tokens, so
the learner compiles once per run. Position t of `old_logprobs` holds log p(tokens[t] |
tokens[<t]) — the sampler's behaviour log-prob for response tokens, 0 elsewhere.
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


def build_batch(experiences: Sequence[Any], max_prompt: int, max_response: int, pad_id: int,
                duration_source: str = "episode",
                duration_floor_s: float = DURATION_FLOOR_S) -> dict[str, np.ndarray]:
    """tokens, attention_mask, response_mask, old_logprobs [B, P+R]; rewards, dt_s [B]."""
    b, p, t = len(experiences), max_prompt, max_prompt + max_response
    tokens = np.full((b, t), pad_id, np.int32)
    attention = np.zeros((b, t), np.int32)
    response = np.zeros((b, t), np.float32)
    old_logprobs = np.zeros((b, t), np.float32)
    for i, e in enumerate(experiences):
        prompt, resp = list(e.prompt_ids), list(e.response_ids)
        if len(prompt) > p:
            raise ValueError(f"episode {e.episode_id}: prompt has {len(prompt)} tokens, over "
                             f"max_prompt_tokens={p}")
        if len(resp) > max_response:
            raise ValueError(f"episode {e.episode_id}: response has {len(resp)} tokens, over "
                             f"max_response_tokens={max_response}")
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
