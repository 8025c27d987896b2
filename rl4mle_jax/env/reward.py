"""The paper's reward: failure −10 + 0.1 per milestone; no training −10; valid → grader score.

`compute_reward` is a pure function of what happened (parsed action, instrumented program,
sandbox result with the witness's evidence, grade report, nonce). Running a program and grading
it happens in one place, `env.execute.run_and_grade` (its `.reward` is this module's record).

Milestones (partial credit) rest on evidence, not on text. With the witness (the launcher's
audit and profile hooks, sandbox/witness.py) a milestone counts when its marker was printed with
this run's nonce *and* the witness saw the event itself (an input file opened, a library fit
call, ...). Evidence that fails authentication, or a run in which the witness refused an escape
attempt, earns no milestone credit and no training credit. Without a witness (a backend that
has none) the printed markers are checked as in the paper, with the textual introspection test.

Outcome rules, in order:
  1. no runnable code (no block, empty, syntax error)         → failure, no credit
  2. a submission file exists but no model was trained        → no_model_training (−10)
     (witness: no library training call was observed; without witness: no fit-like call in the
     code, or the model_trained marker was placed but not printed)
  3. timeout / oom / killed                                    → failure + milestone credit
  4. status ok or error with a submission that grades valid   → grader score (normalised)
  5. otherwise (no file, invalid file)                         → failure + milestone credit
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rl4mle_jax.env.actions import Action
from rl4mle_jax.env.instrument import (
    InstrumentedProgram,
    scan_markers,
    suspects_introspection,
)
from rl4mle_jax.env.instrument_static import MILESTONES
from rl4mle_jax.env.metrics import oriented_score
from rl4mle_jax.env.tracebacks import parse_error

NORMALISATIONS = ("raw", "flipped", "rescaled", "auto")
# "auto": the paper's flipped score where the task's baseline scores within this of 0 (AUC,
# accuracy, log loss, RMSLE: a valid program's reward stays far above a failure's -10);
# rescaled against the references where it does not (an RMSE of 22.8 in a price's units,
# flipped, would pay a valid program -22.8, less than a failure).
AUTO_FLIPPED_MAX_ABS = 1.0
# "rescaled" (and "auto" where it rescales): one reward unit is the baseline-to-strong gap on
# the reward split, but never less than this many standard errors of a score there (the
# task's `reference_se`). A gap below what the split resolves (titanic-survival's references
# differ by 0.0096 AUC, a score's standard error there is 0.03) would otherwise pay a
# noise-level difference between two programs several reward units, and with a failure at
# -10 a valid program slightly worse than the baseline would be paid about what a failure is.
# Two: a difference the split resolves at ~95% confidence is worth at most one unit. The
# default of RewardConfig.rescale_min_se.
RESCALE_MIN_SE = 2.0
# Where milestone credit comes from: "witness" (a printed marker with the nonce that the
# witness corroborates; markers alone when no witness ran), "markers" (the paper's rule: printed
# markers with the nonce, no corroboration; forgeable, kept for reproducing the paper).
MILESTONE_EVIDENCE = ("witness", "markers")


@dataclass(frozen=True)
class RewardConfig:
    """Reward constants; defaults are the paper's values."""

    failure_reward: float = -10.0
    milestone_reward: float = 0.1
    no_training_reward: float = -10.0
    milestones: tuple[str, ...] = MILESTONES
    # raw | flipped (sign flipped when lower is better) | rescaled | auto (flipped, or rescaled
    # where the task's baseline score is over AUTO_FLIPPED_MAX_ABS in size)
    normalisation: str = "flipped"
    baseline_key: str = "baseline"  # reference_scores names used by "rescaled"
    strong_key: str = "strong"
    require_training: bool = True
    dynamic_training_check: bool = True
    grade_on_error: bool = True  # grade a submission written before a crash
    milestone_evidence: str = "witness"  # see MILESTONE_EVIDENCE
    # "rescaled" (and "auto" where it rescales): one reward unit is at least this many standard
    # errors of a score on the split (see RESCALE_MIN_SE); 0: the references' gap alone.
    rescale_min_se: float = RESCALE_MIN_SE

    def __post_init__(self):
        if not (self.rescale_min_se >= 0 and math.isfinite(self.rescale_min_se)):
            raise ValueError(f"rescale_min_se must be a finite number >= 0 (0: the references' "
                             f"gap alone), got {self.rescale_min_se}")
        if self.milestone_evidence not in MILESTONE_EVIDENCE:
            raise ValueError(f"milestone_evidence must be one of {MILESTONE_EVIDENCE}, "
                             f"got {self.milestone_evidence!r}")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}, "
                             f"got {self.normalisation!r}")
        unknown = set(self.milestones) - set(MILESTONES)
        if unknown:
            raise ValueError(f"unknown milestones {sorted(unknown)}; known: {MILESTONES}")


@dataclass
class RewardRecord:
    """Everything that went into one reward, JSON-serialisable (the experience log keeps it)."""

    reward: float
    status: str  # "valid" | "failure" | "no_model_training"
    failure_reason: str | None = None  # no_code_block, syntax_error, timeout, runtime_error, ...
    milestones: list[str] = field(default_factory=list)
    milestone_credit: float = 0.0
    score: float | None = None  # the grader's raw score
    normalised_score: float | None = None
    normalisation: str = "flipped"
    direction: str | None = None
    grade: dict | None = None
    exec_status: str | None = None
    exit_code: int | None = None
    duration_s: float = 0.0  # Δt of the program itself
    timeout_s: float | None = None
    submission_exists: bool = False
    error: dict | None = None  # {type, line, source, message} mapped to the original code
    nonce: str | None = None
    nonce_verified: bool = False  # markers were trusted and at least one carried the nonce
    markers_trusted: bool = True
    forged_marker_lines: int = 0
    stdout_truncated: bool = False
    static_training: bool | None = None
    instrumentation: dict = field(default_factory=dict)
    # "witness" (markers corroborated by the witness), "markers" (printed markers only),
    # "untrusted" (the witness's evidence failed authentication or it refused an escape)
    evidence_source: str = "markers"
    witnessed: list[str] = field(default_factory=list)  # milestones the witness observed
    witness_refused: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# ---------------------------------------------------------------- helpers
def normalise_score(score: float, direction: str, refs: dict, cfg: RewardConfig,
                    se: float | None = None) -> tuple[float, str]:
    """Score in the configured scale; returns (value, normalisation actually used). `se`: the
    standard error of a score on the split (GradeReport.reference_se), which floors the
    rescaled unit at `cfg.rescale_min_se` x se (`rescale_unit`)."""
    if direction not in ("higher", "lower"):
        raise ValueError(f"direction must be 'higher' or 'lower', got {direction!r}")
    sign = oriented_score(1.0, direction)  # +1 when higher is better, else -1
    if cfg.normalisation == "raw":
        return score, "raw"
    if cfg.normalisation == "flipped":
        return sign * score, "flipped"
    base = refs.get(cfg.baseline_key)
    if not rescales(refs, cfg):
        if cfg.normalisation == "auto":
            return sign * score, "flipped (auto)" if base is not None else \
                "flipped (auto, no reference scores)"
        return sign * score, "flipped (no reference scores)"
    scale = rescale_unit(refs, cfg, se)
    return sign * (score - base) / scale, "rescaled (auto)" if cfg.normalisation == "auto" \
        else "rescaled"


def rescales(refs: dict, cfg: RewardConfig) -> bool:
    """Whether `normalise_score` puts a score against these references: under "rescaled" when
    they have a baseline, under "auto" when that baseline is over AUTO_FLIPPED_MAX_ABS in size
    (elsewhere the score is flipped)."""
    base = refs.get(cfg.baseline_key)
    if base is None or cfg.normalisation not in ("rescaled", "auto"):
        return False
    return cfg.normalisation == "rescaled" or abs(base) > AUTO_FLIPPED_MAX_ABS


def rescale_unit(refs: dict, cfg: RewardConfig, se: float | None = None) -> float:
    """The score difference worth one reward unit under "rescaled": |strong - baseline| on the
    split (|baseline| where there is no strong reference or it equals the baseline), at least
    `cfg.rescale_min_se` x `se` where the split's standard error is known."""
    base, strong = refs[cfg.baseline_key], refs.get(cfg.strong_key)
    scale = abs(strong - base) if strong is not None and strong != base else max(abs(base), 1e-8)
    if se is not None and math.isfinite(se):
        scale = max(scale, cfg.rescale_min_se * se)
    return scale


def reward_replicates(records: Sequence[dict | None], cfg: RewardConfig) -> np.ndarray | None:
    """The grader's bootstrap replicates of each valid record's score (`grade.score_boot`) in
    the reward's scale (`normalise_score`, which is affine in the score), [B, K]; NaN rows for
    records without them (failures, logs from before replicates). None when no row has any."""
    rows: list[np.ndarray | None] = []
    for rec in records:
        grade = (rec or {}).get("grade") or {}
        boot = grade.get("score_boot")
        if (rec or {}).get("status") != "valid" or not boot or rec.get("direction") is None:
            rows.append(None)
            continue
        refs = grade.get("reference_scores") or {}
        value, _ = normalise_score(np.asarray(boot, np.float64), rec["direction"], refs, cfg,
                                   grade.get("reference_se"))
        rows.append(np.asarray(value, np.float64))
    k = max((r.size for r in rows if r is not None), default=0)
    if k == 0:
        return None
    out = np.full((len(rows), k), np.nan)
    for i, r in enumerate(rows):
        if r is not None:
            out[i, :r.size] = r
    return out


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _grade_dict(report: Any) -> dict | None:
    if report is None:
        return None
    if isinstance(report, dict):
        return dict(report)
    if hasattr(report, "to_dict"):
        return report.to_dict()
    return asdict(report)


def witness_view(evidence: Any) -> dict | None:
    """The witness's report reduced to what the rules use, or None when no witness ran.

    trusted: every evidence line authenticated, no escape attempt refused, and the witness ran
    (a witness that reports an `error` proves nothing, so it earns nothing: safe by default).
    """
    if not isinstance(evidence, dict):
        return None
    refused = [str(r)[:120] for r in (evidence.get("refused") or [])][:16]
    ms = [m for m in (evidence.get("milestones") or []) if m in MILESTONES]
    trusted = evidence.get("verified") is True and not refused and not evidence.get("error")
    return {"trusted": trusted, "milestones": ms if trusted else [], "refused": refused}


def _untrained(source: str, witness: dict | None, program: InstrumentedProgram,
               scan: Any, trusted: bool, rec: RewardRecord, cfg: RewardConfig) -> str | None:
    """Why a run with a submission counts as "no model training", or None if it trained."""
    if source == "witness":
        if "model_trained" in witness["milestones"]:
            return None
        # A fit-like call in the text that never ran (dead code, a string, its own function).
        return "model_training_not_reached" if program.static_training else "no_model_training"
    if source == "untrusted":
        return "witness_untrusted"
    # No witness: a fit-like call in the code, and its marker printed when markers are trusted.
    if not program.static_training:
        return "no_model_training"
    dynamic_untrained = (cfg.dynamic_training_check and trusted and scan is not None
                         and "model_trained" in program.milestones
                         and "model_trained" not in scan.milestones
                         and not rec.stdout_truncated)
    return "model_training_not_reached" if dynamic_untrained else None


# ---------------------------------------------------------------- the reward
def compute_reward(action: Action | None, program: InstrumentedProgram | None, exec_result: Any,
                   grade_report: Any, nonce: str | None, cfg: RewardConfig = RewardConfig(),
                   timeout_s: float | None = None) -> RewardRecord:
    """Reward and its record for one episode (see the module docstring for the rules).

    Paper, environment instrumentation: r = −10 + 0.1 · #milestones for a failure, −10 for a
    submission without model training, the grader's score (sign flipped when lower is better)
    for a valid submission; constants in `RewardConfig`. Milestones count only with evidence.
    """
    if action is not None and not action.ok:
        return RewardRecord(cfg.failure_reward, "failure", action.failure,
                            normalisation=cfg.normalisation,
                            error={"type": action.failure, "line": None, "source": None,
                                   "message": action.message})
    if exec_result is None:
        raise ValueError("compute_reward needs the sandbox result of a runnable action")
    stdout = _get(exec_result, "stdout", "") or ""
    code = program.original if program is not None else (action.code if action else "")
    scan = scan_markers(stdout, nonce) if nonce else None
    placed = set(program.milestones) if program is not None else set()
    # A correct nonce on a milestone that has no marker in the program proves a copied nonce.
    copied = scan is not None and any(m not in placed for m in scan.milestones)
    witness = witness_view(_get(exec_result, "evidence"))
    printed = scan.milestones if scan is not None else ()
    if cfg.milestone_evidence == "witness" and witness is not None:
        source = "witness" if witness["trusted"] else "untrusted"
        trusted = witness["trusted"] and not copied
        reached = [m for m in printed if trusted and m in witness["milestones"]
                   and m in cfg.milestones]
    else:  # the paper's rule: printed markers, guarded by the textual introspection test
        source = "markers"
        trusted = not suspects_introspection(code) and not copied
        reached = [m for m in printed if trusted and m in cfg.milestones]
    rec = RewardRecord(
        reward=cfg.failure_reward, status="failure", milestones=reached,
        normalisation=cfg.normalisation, exec_status=_get(exec_result, "status"),
        exit_code=_get(exec_result, "exit_code"),
        duration_s=float(_get(exec_result, "duration_s", 0.0) or 0.0), timeout_s=timeout_s,
        submission_exists=bool(_get(exec_result, "submission_exists", False)), nonce=nonce,
        nonce_verified=bool(trusted and scan and scan.n_valid_lines > 0),
        markers_trusted=trusted, forged_marker_lines=scan.n_forged_lines if scan else 0,
        stdout_truncated=bool(_get(exec_result, "stdout_truncated", False)),
        static_training=program.static_training if program is not None else None,
        instrumentation=({**program.verification, "method": program.method,
                          "milestones_placed": list(program.milestones)}
                         if program is not None else {}),
        grade=_grade_dict(grade_report), evidence_source=source,
        witnessed=list(witness["milestones"]) if witness else [],
        witness_refused=list(witness["refused"]) if witness else [])
    rec.milestone_credit = round(cfg.milestone_reward * len(reached), 10)
    status = rec.exec_status
    if status in ("error", "oom", "killed") or (status == "ok" and not rec.submission_exists):
        rec.error = parse_error(_get(exec_result, "stderr", "") or "", program)

    if rec.submission_exists and cfg.require_training and program is not None:
        untrained = _untrained(source, witness, program, scan, trusted, rec, cfg)
        if untrained is not None:
            rec.status, rec.reward = "no_model_training", cfg.no_training_reward
            rec.failure_reason = untrained
            return rec

    def failure(reason: str) -> RewardRecord:
        rec.failure_reason = reason
        rec.reward = cfg.failure_reward + rec.milestone_credit
        return rec

    if status == "timeout":
        return failure("timeout")
    if status in ("oom", "killed"):
        return failure(status)
    if status == "error" and not (cfg.grade_on_error and rec.submission_exists):
        return failure("runtime_error")
    if not rec.submission_exists:
        return failure("no_submission")
    if grade_report is None:
        raise ValueError("a submission exists: compute_reward needs its grade report")
    if not _get(grade_report, "valid", False):
        return failure(f"invalid_submission:{_get(grade_report, 'reason')}")
    score = float(_get(grade_report, "score"))
    if not math.isfinite(score):
        return failure("invalid_submission:non_finite_score")
    rec.direction = _get(grade_report, "direction")
    refs = _get(grade_report, "reference_scores", {}) or {}
    rec.score = score
    rec.normalised_score, rec.normalisation = normalise_score(
        score, rec.direction, refs, cfg, _get(grade_report, "reference_se"))
    rec.status, rec.reward = "valid", rec.normalised_score
    if cfg.normalisation in ("auto", "rescaled"):  # never below a failure with every milestone
        rec.reward = max(rec.reward, valid_floor(cfg))
    return rec


def valid_floor(cfg: RewardConfig) -> float:
    """The least a valid submission is paid under "auto" and "rescaled": what a failure that
    reached every milestone gets (a valid run reached them all). An unbounded loss (an RMSE of
    1e12 from a program that predicts garbage) would otherwise outweigh a whole batch, and a
    weak valid program on a task whose references are close would be paid less than a failure
    (the policy would learn to fail); normalised_score keeps the unclipped value. The paper's
    "flipped" and "raw" are left as they are."""
    return cfg.failure_reward + cfg.milestone_reward * len(cfg.milestones)

