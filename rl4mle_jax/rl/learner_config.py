"""Hyper-parameters of the PPO learner (a frozen dataclass; build it from a ConfigDict).

No JAX here: config files import this module, and the allowed values of every mode live here
once (rl.ppo, rl.duration and rl.state import them).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

CRITIC_MODES = ("separate", "shared", "none")
KL_MODES = ("none", "loss", "reward")
ADVANTAGE_ESTIMATORS = ("gae", "grpo", "rloo")  # rl.advantages registers one function each
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")  # rl.ppo.aggregate
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")  # rl.ppo.kl_penalty
ENTROPY_SCHEDULES = ("constant", "linear", "cosine")  # rl.ppo.entropy_coef_schedule
LR_SCHEDULES = ("constant", "cosine")  # rl.state.make_schedule
DURATION_MODES = ("off", "batch_mean", "log1p", "inverse_inclusion")  # rl.duration ("a-b" too)
OFF_POLICY_MODES = ("none", "decoupled", "tis")  # rl.off_policy
FAILURE_CREDIT_MODES = ("sequence", "error_line")  # rollout.credit


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Defaults follow verl's PPO and the paper (lr 1e-5, clip 0.2, γ = λ = 1)."""

    # Optimisation. Schedule steps count optimizer updates (ppo_epochs × num_minibatches per
    # train_step), as optax counts them.
    actor_lr: float = 1e-5
    critic_lr: float = 1e-5
    lr_schedule: str = "constant"  # "constant" | "cosine" (after linear warmup)
    warmup_steps: int = 0
    total_steps: int = 0  # cosine horizon, in optimizer updates
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    # Passes over one batch.
    ppo_epochs: int = 1
    num_minibatches: int = 1
    micro_batch_size: int = 0  # rows per forward/backward; 0 = the whole minibatch
    shuffle: bool = True
    # Losses (rl.ppo).
    agg_mode: str = "token-mean"
    # Weight of the policy-gradient (clipped surrogate) term; 0 is a control, not a method: the
    # policy then learns from the entropy and KL terms alone, never from the reward (is the
    # default's gain its entropy minimisation alone? configs/sweep_control.py).
    pg_coef: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip_c: float | None = 3.0
    value_clip_eps: float | None = 0.5
    vf_coef: float = 0.5  # weight of the value loss in the shared-trunk loss
    # The loss subtracts entropy_coef x the token entropy of the tempered policy: > 0 is PPO's
    # entropy bonus, < 0 minimises entropy (sharpens every position of every trained row).
    entropy_coef: float = 0.0
    entropy_coef_end: float = 0.0
    # > 0: the entropy term's gradient reaches only the positions where the tempered policy's
    # most likely token already has probability >= entropy_gate (the term's value, the
    # "entropy" metric, still counts every position). With entropy_coef < 0 this sharpens the
    # confident positions, where a rare sampled token garbles a line, and leaves the uncertain
    # ones (which model, which hyper-parameter) to the reward (configs/sweep_gate.py).
    entropy_gate: float = 0.0
    # True: of those positions, the gradient reaches only the ones where sharpening moves mass
    # the way the policy gradient does: in a row with advantage >= 0 where the row's own token
    # is the most likely one, in a row with advantage < 0 where it is not (a rare token that
    # garbled the line: mass goes back to the top one). Left out: a confident mistake (the top
    # token itself is what failed, e.g. the warm start's `GridSearchCV(LogisticRegression(
    # max_iter=1)` + newline at p ~0.99 on food-reviews), which the gated term would otherwise
    # sharpen in every row that reaches it, and a rare token that worked. Measured: that token
    # still ended surer than under the warm start on 4 of 4 seeds (docs/sweep_agree/flip.md).
    entropy_agree: bool = False
    # With entropy_agree: the entropy gradient's weight at the positions it leaves out (0: none;
    # -1: reversed, so the term raises the entropy there and pushes the way the policy gradient
    # does). Why reverse: at a confident mistake the policy gradient's push on the held token
    # is |A| (1 - p), ~0.1 at p ~0.99, which the gated term's 2 x p (1 - p) log(p / (1 - p))
    # cancels in the default; left out, the push is that 0.1 alone; reversed, twice it. In a
    # failed row the reversal also flattens its confident shared tokens (imports, boilerplate),
    # which the valid rows' term sharpens. Measured (configs/sweep_agree.py, 12 seeds on three
    # tasks, docs/sweep_agree/flip.md): -1 is within its standard errors of the default
    # (reward +0.36 ± 0.41, valid rate +0.013 ± 0.033), and the broken line stayed.
    entropy_disagree: float = 0.0
    entropy_decay_steps: int = 0  # in train steps; 0 = constant
    entropy_schedule: str = "linear"
    kl_mode: str = "none"  # "none" | "loss" | "reward"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    # Advantages (rl.advantages) and duration weights (rl.duration).
    advantage_estimator: str = "gae"
    # Without batch["group_ids"]: rows [g·G, (g+1)·G) form a group (share a baseline); 0: the
    # whole batch is one group (rloo: every sample's baseline is the mean of the others').
    group_size: int = 1
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool | None = None  # None: the estimator's default (gae yes, groups no)
    # A batch whose scores are all equal has no policy signal: advantages 0, the critic still
    # learns (rl.advantages.compute_advantages(zero_flat)); False: whitened critic noise.
    zero_flat_batches: bool = True
    # "off" | "batch_mean" | "log1p" | "inverse_inclusion" (1/p̂ of the arrival model,
    # rl.arrival; the batch carries "inclusion")
    duration_weighting: str = "batch_mean"
    duration_max_weight: float | None = None  # cap on a normalised Δt weight (None: the paper's)
    # Off-policy correction for stale samples (rl.off_policy): "none" (PPO's ratio against the
    # sampler's log-probs), "decoupled" (Hilton et al. 2021, as in AReaL) or "tis" (truncated
    # importance sampling). The cap C on the behaviour weight π_prox/π_behav: decoupled leaves
    # out tokens whose weight exceeds it (None: keeps all), tis truncates the weight at it.
    off_policy: str = "none"
    off_policy_cap: float | None = 2.0
    # Which tokens an episode's advantage applies to: "sequence" (the paper: every response
    # token) or "error_line" (a syntax error's: only the tokens of the line the parser names,
    # the batch's "credit_mask"; rollout/credit.py). Critic targets are the same in both.
    failure_credit: str = "sequence"
    # Model side.
    critic: str = "separate"  # "separate" | "shared" | "none"
    temperature: float = 1.0  # sampling temperature the behaviour log-probs were taken at
    # The sampler's truncation (sampling.truncate_logits), applied to the learner's tempered
    # logits before every log-prob and entropy; the token a row was given is always kept (it was
    # in the behaviour set; a later policy may push it below the floor, and its log-prob must
    # stay finite). 0 / 1.0 / 0.0: no truncation.
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    remat: bool = False  # rematerialise decoder layers in the backward pass (saves memory)
    # Query rows per chunk of the causal attention (models.qwen2.attention_chunk_size; the same
    # result up to float rounding, the masked upper triangle mostly skipped): 128 made the
    # default run's train step ~2x faster on CPU. 0: one [T, T] block per layer.
    attention_chunk: int = 128

    def __post_init__(self):
        def check(name: str, allowed: tuple[str, ...]):
            if getattr(self, name) not in allowed:
                raise ValueError(f"LearnerConfig.{name}={getattr(self, name)!r} is not one of "
                                 f"{allowed}")
        check("critic", CRITIC_MODES)
        check("kl_mode", KL_MODES)
        check("advantage_estimator", ADVANTAGE_ESTIMATORS)
        check("agg_mode", AGG_MODES)
        check("kl_estimator", KL_ESTIMATORS)
        check("entropy_schedule", ENTROPY_SCHEDULES)
        check("lr_schedule", LR_SCHEDULES)
        check("off_policy", OFF_POLICY_MODES)
        check("failure_credit", FAILURE_CREDIT_MODES)
        if self.off_policy_cap is not None and not self.off_policy_cap >= 1:
            raise ValueError(f"LearnerConfig.off_policy_cap must be None or >= 1 (a fresh token's "
                             f"behaviour weight is 1), got {self.off_policy_cap}")
        if self.off_policy == "tis" and self.off_policy_cap is None:
            raise ValueError("LearnerConfig.off_policy='tis' truncates the behaviour weight at "
                             "off_policy_cap; set it (e.g. 2.0), or use off_policy='decoupled' "
                             "for an uncapped weight")
        if self.duration_weighting.replace("-", "_") not in DURATION_MODES:
            raise ValueError(f"LearnerConfig.duration_weighting={self.duration_weighting!r} is "
                             f"not one of {DURATION_MODES}")
        if self.duration_max_weight is not None and not self.duration_max_weight > 0:
            raise ValueError(f"LearnerConfig.duration_max_weight must be None or > 0, got "
                             f"{self.duration_max_weight}")
        if self.advantage_estimator == "gae" and self.critic == "none":
            raise ValueError("advantage_estimator='gae' needs a critic; use critic='separate' "
                             "or 'shared', or a group estimator ('grpo', 'rloo')")
        for name in ("ppo_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"LearnerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 0:
            raise ValueError(f"LearnerConfig.group_size must be >= 0 (0: the whole batch), got "
                             f"{self.group_size}")
        if self.attention_chunk < 0:
            raise ValueError(f"LearnerConfig.attention_chunk must be >= 0 (0: one [T, T] block), "
                             f"got {self.attention_chunk}")
        if self.micro_batch_size < 0:
            raise ValueError(f"LearnerConfig.micro_batch_size must be >= 0, got "
                             f"{self.micro_batch_size}")
        if not (math.isfinite(self.pg_coef) and self.pg_coef >= 0):
            raise ValueError(f"LearnerConfig.pg_coef must be finite and >= 0 (1: the paper's loss, "
                             f"0: no policy gradient), got {self.pg_coef}")
        if not 0 <= self.entropy_gate < 1:
            raise ValueError(f"LearnerConfig.entropy_gate must be in [0, 1) (a top-token "
                             f"probability; 0: every position), got {self.entropy_gate}")
        if not -1 <= self.entropy_disagree <= 0:
            raise ValueError(f"LearnerConfig.entropy_disagree must be in [-1, 0] (0: left out, "
                             f"-1: reversed), got {self.entropy_disagree}")
        if self.entropy_disagree and not self.entropy_agree:
            raise ValueError("LearnerConfig.entropy_disagree weighs the positions entropy_agree "
                             "leaves out: set entropy_agree=True with it")
        if self.temperature <= 0:
            raise ValueError(f"LearnerConfig.temperature must be > 0, got {self.temperature}")
        if self.top_k < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p < 1:
            raise ValueError(f"LearnerConfig: top_k={self.top_k} (>= 0), top_p={self.top_p} "
                             f"(in (0, 1]) and min_p={self.min_p} (in [0, 1)) out of range")

    @property
    def uses_critic(self) -> bool:
        return self.critic != "none"

    @property
    def uses_ref(self) -> bool:
        return self.kl_mode != "none" and self.kl_coef > 0

    @classmethod
    def from_dict(cls, d: Any) -> LearnerConfig:
        """From a dict/ConfigDict; unknown keys are an error naming them."""
        d = dict(d.to_dict() if hasattr(d, "to_dict") else d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise KeyError(f"unknown learner config keys {unknown}; known: {sorted(known)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
