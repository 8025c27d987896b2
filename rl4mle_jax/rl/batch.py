"""Host-side check of a learner batch against the contract (before it enters the jitted step).

Keys and shapes: tokens, attention_mask, response_mask, old_logprobs, ref_logprobs,
values_old, credit_mask (the tokens an advantage applies to, for failure_credit='error_line')
[B, T]; rewards, dt_s (Δt, s), group_ids, fresh, inclusion (p̂ of
`rl.arrival`, for duration_weighting='inverse_inclusion') [B]. Which keys are required depends
on the learner config (`required_batch_keys`). Host (numpy) arrays are also checked for values:
finite floats, token ids within the vocabulary, dt_s >= 0.

values_old is optional when the step makes one update from one forward over the whole batch
(`old_values_in_step`): the critic's values at the current params are then that forward's own
values, so the step takes them from it (under stop_gradient) instead of from a separate pass.
fresh (optional, 1 for rows sampled with the params being trained) selects the rows of the
behaviour log-prob gap metric; without it every row counts.
prox_logprobs [B, T] (optional, several updates per step only): the learner's log-probs at the
step's starting params (`rl.off_policy`'s π_prox, e.g. from the values_old pass); without them
a step with an off-policy correction computes them with one more forward.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax.rl.learner_config import LearnerConfig

Batch = dict[str, Any]
BT_KEYS = ("tokens", "attention_mask", "response_mask", "old_logprobs", "ref_logprobs",
           "values_old", "prox_logprobs", "credit_mask")
B_KEYS = ("rewards", "dt_s", "group_ids", "fresh", "inclusion")
_INT_KEYS = ("tokens", "group_ids")


def single_pass(config: LearnerConfig) -> bool:
    """One optimizer update from one forward over the whole batch, at the current params."""
    return config.ppo_epochs == 1 and config.num_minibatches == 1 and not config.micro_batch_size


def old_values_in_step(config: LearnerConfig) -> bool:
    """Whether the step can take values_old from its own forward (no separate pass needed)."""
    return config.uses_critic and single_pass(config)


def required_batch_keys(config: LearnerConfig) -> tuple[str, ...]:
    keys = ["tokens", "attention_mask", "response_mask", "old_logprobs", "rewards", "dt_s"]
    if config.uses_critic and not old_values_in_step(config):
        keys.append("values_old")
    if config.uses_ref:
        keys.append("ref_logprobs")
    if config.advantage_estimator != "gae":
        keys.append("group_ids")
    if config.duration_weighting.replace("-", "_") == "inverse_inclusion":
        keys.append("inclusion")  # p̂ per row from rl.arrival.ArrivalModel.inclusion
    if config.failure_credit != "sequence":
        keys.append("credit_mask")  # rollout.collate.build_batch, from rollout.credit
    return tuple(keys)


def _check_values(key: str, x: np.ndarray, vocab_size: int | None) -> None:
    if key == "tokens" and vocab_size is not None and x.size:
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"batch['tokens'] has id {lo if lo < 0 else hi} outside "
                             f"[0, vocab_size={vocab_size})")
    elif x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        rows = np.unique(np.argwhere(~np.isfinite(x))[:, 0]).tolist()
        raise ValueError(f"batch[{key!r}] has non-finite values in rows {rows[:10]}")
    if key == "dt_s" and np.any(x < 0):
        raise ValueError(f"batch['dt_s'] has negative values: {x[x < 0].tolist()[:10]}")
    if key == "credit_mask" and np.any((x != 0) & (x != 1)):
        raise ValueError("batch['credit_mask'] must hold only 0 and 1")
    if key == "inclusion" and np.any((x <= 0) | (x > 1)):
        bad = x[(x <= 0) | (x > 1)]
        raise ValueError(f"batch['inclusion'] must be in (0, 1], got {bad.tolist()[:10]}")


def prepare_batch(batch: Batch, config: LearnerConfig, batch_divisor: int = 1,
                  vocab_size: int | None = None) -> Batch:
    """The batch with exactly the keys the step uses, cast (int32 ids, float32 otherwise).

    Fills `dt_s` with ones when duration weighting is off and `group_ids` from
    `group_size` (consecutive rows; 0: all rows one group) when a group estimator needs them
    and none are given.
    batch_divisor: the batch must split evenly over the data×fsdp devices.
    """
    batch = dict(batch)
    if "tokens" not in batch:
        raise KeyError("batch has no 'tokens' [B, T]")
    if np.ndim(batch["tokens"]) != 2:
        raise ValueError(f"batch['tokens'] must be [B, T], got shape {np.shape(batch['tokens'])}")
    b, t = np.shape(batch["tokens"])
    if "dt_s" not in batch and config.duration_weighting == "off":
        batch["dt_s"] = np.ones((b,), np.float32)
    if "group_ids" not in batch and config.advantage_estimator != "gae":
        g = config.group_size or b  # 0: the whole batch is one group
        if b % g:
            raise ValueError(f"batch size {b} is not a multiple of group_size {g}")
        batch["group_ids"] = np.arange(b, dtype=np.int32) // g
    keys = required_batch_keys(config)
    optional = ((["values_old"] if config.uses_critic else []) + ["fresh"]
                + ([] if single_pass(config) else ["prox_logprobs"]))
    keys = keys + tuple(k for k in optional if k in batch and k not in keys)
    missing = [k for k in keys if k not in batch]
    if missing:
        raise KeyError(f"batch is missing {missing} (have {sorted(batch)}); this learner config "
                       f"needs {list(keys)}")
    out = {}
    for k in keys:
        shape = tuple(np.shape(batch[k]))
        want = (b, t) if k in BT_KEYS else (b,)
        if shape != want:
            raise ValueError(f"batch[{k!r}] has shape {shape}, expected {want} "
                             f"(tokens is {(b, t)})")
        x = batch[k]
        if isinstance(x, jax.Array):  # device data: no host round trip for value checks
            out[k] = x.astype(jnp.int32 if k in _INT_KEYS else jnp.float32)
        else:
            x = np.asarray(x)
            _check_values(k, x, vocab_size)
            out[k] = x.astype(np.int32 if k in _INT_KEYS else np.float32)
    if b % batch_divisor:
        raise ValueError(f"batch size {b} is not a multiple of the data×fsdp mesh size "
                         f"{batch_divisor}")
    if b % config.num_minibatches:
        raise ValueError(f"batch size {b} is not a multiple of num_minibatches "
                         f"{config.num_minibatches}")
    n_mb = b // config.num_minibatches
    if config.micro_batch_size and n_mb % config.micro_batch_size:
        raise ValueError(f"minibatch size {n_mb} is not a multiple of micro_batch_size "
                         f"{config.micro_batch_size}")
    return out
