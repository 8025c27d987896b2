"""SFT rescue: when RL has no signal to learn from, a few supervised steps on a reference.

PPO learns from reward differences. Two states give it none: every recent batch has equal
rewards (all −10, say: no separation), or the policy keeps missing what a known solution
already reaches (a demonstration, a user-supplied program, or the best solution the run ever
found scores far above anything the policy has produced lately). `RescueMonitor` watches the
learner's batches for either and says when to rescue; the loop then runs a targeted SFT update
on the reference (the solve prompt → the reference's plan and code, the policy's own sharded
train path, `Learner.sft_update`), and continues RL. A rescue that brings no separation within
`patience_steps` batches means the task is out of reach for this policy: the loop stops with
that message (one task) rather than burn its budget on −10s, or, in multi-task training, drops
the task from the mix (rollout/task_mix.py) and trains on the others (one monitor per task,
fed that task's rows of each batch).

Rules, per learner step (the batch's rewards):
  no separation: all of the last `window_steps` batches have reward spread (max − min) ≤ tol;
  reference gap: a reference's reward exceeds the best batch reward of each of the last
    `window_steps` batches by at least `margin`.
A rescue needs `window_steps` batches since the last one (the window refills), and at most
`max_rescues` happen per run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

SEPARATION_TOL = 1e-9


@dataclasses.dataclass
class RescueMonitor:
    window_steps: int = 4
    margin: float = 0.05
    patience_steps: int = 8
    max_rescues: int = 2
    spreads: list[float] = dataclasses.field(default_factory=list)  # per batch: max - min
    bests: list[float] = dataclasses.field(default_factory=list)  # per batch: max reward
    valid_rates: list[float] = dataclasses.field(default_factory=list)
    rescues: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def observe(self, rewards: Any, valid: Any, versions: Any = None) -> bool:
        """One learner batch: its rewards, which of them are valid and (optionally) the policy
        version that sampled each. Rows sampled before the last rescue's version show the
        policy it replaced, so they are left out, and a batch with none left is not counted
        (episodes in flight during a rescue would otherwise judge it). Returns whether the
        batch counted."""
        r, v = np.asarray(rewards, np.float64), np.asarray(valid, bool)
        since = self.rescues[-1].get("version") if self.rescues else None
        if versions is not None and since is not None:
            keep = np.asarray(versions) >= since
            r, v = r[keep], v[keep]
        if r.size == 0:
            return False
        self.spreads.append(float(r.max() - r.min()))
        self.bests.append(float(r.max()))
        self.valid_rates.append(float(np.mean(v)))
        return True

    @property
    def _since_last(self) -> int:
        return len(self.bests) - (self.rescues[-1]["at_batch"] if self.rescues else 0)

    def reason(self, reference_reward: float | None) -> str | None:
        """Why to rescue now ("no_separation" / "reference_gap"), or None."""
        w = self.window_steps
        if len(self.rescues) >= self.max_rescues or self._since_last < w:
            return None
        if all(s <= SEPARATION_TOL for s in self.spreads[-w:]):
            return "no_separation"
        if reference_reward is not None and \
                max(self.bests[-w:]) + self.margin <= reference_reward:
            return "reference_gap"
        return None

    def record(self, reason: str, reference: dict[str, Any], losses: list[float],
               version: int | None = None) -> dict:
        """Note a rescue made now (`version`: the policy version it published; later batches
        count only rows sampled from it on); returns its record (completed by `outcome`)."""
        w = self.window_steps
        rec = {"at_batch": len(self.bests), "reason": reason, "version": version,
               "sft_steps": len(losses),
               "reference": {k: reference.get(k) for k in ("origin", "reward", "score")},
               "sft_loss_first": losses[0] if losses else None,
               "sft_loss_last": losses[-1] if losses else None,
               "valid_rate_before": float(np.mean(self.valid_rates[-w:])),
               "best_before": max(self.bests[-w:])}
        self.rescues.append(rec)
        return rec

    def outcome(self) -> dict[str, Any] | None:
        """The last rescue's outcome once `window_steps` batches followed it (else None)."""
        if not self.rescues or "valid_rate_after" in self.rescues[-1]:
            return None
        rec, w = self.rescues[-1], self.window_steps
        after = self.valid_rates[rec["at_batch"]:]
        if len(after) < w:
            return None
        rec["valid_rate_after"] = float(np.mean(after[:w]))
        rec["separated_after"] = any(s > SEPARATION_TOL for s in
                                     self.spreads[rec["at_batch"]:rec["at_batch"] + w])
        return rec

    def give_up(self) -> str | None:
        """A message when the last rescue brought no separation within patience_steps."""
        if not self.rescues:
            return None
        rec = self.rescues[-1]
        after = self.spreads[rec["at_batch"]:]
        if len(after) >= self.patience_steps and \
                all(s <= SEPARATION_TOL for s in after[:self.patience_steps]):
            return (f"SFT rescue ({rec['reason']}, on {rec['reference']['origin']}) brought no "
                    f"reward separation within {self.patience_steps} learner steps: every "
                    "batch still has equal rewards, so RL has nothing to learn from on this "
                    "task with this policy (check `python experiments/filter.py` for it)")
        return None

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> RescueMonitor:
        return cls(**d)


def sft_batch(tokenizer: Any, prompt: str, responses: list[str], max_prompt: int,
              max_response: int) -> dict[str, np.ndarray]:
    """The SFT batch of a rescue: one prompt (the loop's solve prompt) and the reference
    response(s), in `warmstart.sft.make_batch`'s layout (prompt shared, left-padded)."""
    from rl4mle_jax.warmstart.sft import SFTExample, bucket_len, make_batch

    p = tuple(tokenizer.encode(prompt))
    if len(p) > max_prompt:
        raise ValueError(f"rescue prompt has {len(p)} tokens > max_prompt_tokens={max_prompt}")
    exs = []
    for r in responses:
        ids = tuple(tokenizer.encode(r)) + (tokenizer.eos_id,)
        if len(ids) > max_response:
            raise ValueError(f"rescue reference has {len(ids)} tokens > max_response_tokens="
                             f"{max_response}; it cannot be a response of this policy")
        exs.append(SFTExample(p, ids, "solve"))
    return make_batch(exs, bucket_len(len(p)), bucket_len(max(len(e.response_ids) for e in exs)),
                      tokenizer.pad_id, shared_prompt=True)


def sft_update(learner: Any, state: Any, batch: dict[str, np.ndarray], lr: float, steps: int,
               target_loss: float | None = None, min_steps: int = 1
               ) -> tuple[Any, list[float]]:
    """Supervised steps on `batch` with a fresh Adam(lr), on the learner's mesh and shardings:
    `steps` of them, or with `target_loss` at least `min_steps` and then until the mean token
    loss is <= target_loss (at most `steps`). Only the policy moves (critic and PPO optimizer
    states are left as they are: the actor's Adam moments then lag the jump, which its next
    updates absorb). Compiled per call: rescues are rare."""
    import jax
    import optax

    from rl4mle_jax import sharding as shd
    from rl4mle_jax.warmstart.sft import make_sft_step

    opt = optax.adam(lr)
    step = make_sft_step(learner.model_config, opt)  # the warm start's step; shardings follow
    params = state.policy_params                     # the sharded params it is given
    opt_state = jax.jit(opt.init)(params)
    b = jax.device_put(batch, shd.replicated(learner.mesh))  # a few rows: on every device
    losses = []
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, b)
        losses.append(float(loss))  # the loss before this step's update
        if target_loss is not None and i + 1 >= min_steps and losses[-1] <= target_loss:
            break
    return state.replace(policy_params=params), losses


def load_references(comps: Any, reference_file: str = "") -> list[dict[str, Any]]:
    """The run's fixed references for `comps.task`: its warm start's valid demonstrations of
    that task (a multi-task warm start holds every task's; each reward re-derived from its
    score under the run's reward config, which may normalise differently from the warm
    start's), and a user's own solution (run and graded once on the reward split, like any
    episode)."""
    import json
    from pathlib import Path

    from rl4mle_jax.env.reward import normalise_score

    task = comps.task
    refs: list[dict[str, Any]] = []
    ws = comps.source.get("warmstart")
    demos = Path(ws).parent / "demos.jsonl" if ws else None
    if demos is not None and demos.is_file():
        for line in demos.read_text().splitlines():
            d = json.loads(line)
            if d.get("task_id", task.id) != task.id:
                continue
            if d.get("valid") and d.get("reward") is not None:
                reward = float(d["reward"]) if d.get("score") is None else normalise_score(
                    float(d["score"]), task.direction,
                    (task.reference_scores or {}).get("reward", {}), comps.reward_cfg,
                    (task.reference_se or {}).get("reward"))[0]
                refs.append({"origin": f"demonstration ({d.get('family')})", "plan": d["plan"],
                             "code": d["code"], "reward": reward, "score": d.get("score")})
    if reference_file:
        from rl4mle_jax.env.execute import run_and_grade

        code = Path(reference_file).expanduser().read_text()
        run = run_and_grade(code, comps.task, comps.sandbox, cfg=comps.reward_cfg,
                            timeout_s=comps.episode_cfg.timeout_s)
        if run.reward.status != "valid":
            raise ValueError(f"rescue.reference_file {reference_file}: not a valid solution on "
                             f"the reward split ({run.reward.failure_reason})")
        refs.append({"origin": f"reference_file {reference_file}",
                     "plan": "A solution that is known to work.", "code": code,
                     "reward": float(run.reward.reward), "score": run.reward.score})
    return refs


def best_reference(fixed: list[dict[str, Any]], buffer_best: dict[str, Any] | None,
                   fits: Any = None) -> dict[str, Any] | None:
    """The highest-reward reference that `fits` (the policy's response budget): a fixed one,
    or the best solution the run ever held."""
    cands = list(fixed)
    if buffer_best is not None:
        cands.append({"origin": f"best solution so far (episode {buffer_best.get('episode_id')})",
                      "plan": "Write the best solution found so far.",
                      "code": buffer_best["code"], "reward": float(buffer_best["reward"]),
                      "score": (buffer_best.get("record") or {}).get("score")})
    if fits is not None:
        cands = [r for r in cands if fits(r)]
    return max(cands, key=lambda r: r["reward"], default=None)
