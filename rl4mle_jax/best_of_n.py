"""Best-of-N evaluation of both kinds (solve from scratch, improve the best), picked honestly.

Candidates are sampled from the policy: N/2 solve prompts, then N/2 improve prompts built on
the best valid solve candidate (the paper's test-time protocol runs both kinds and keeps the
better). Every candidate runs on the reward split (carved from the public training data) and on
the test split. The pick is made on the reward split only and its test score is reported; the
paper's own protocol (the best *test* score of N, which peeks at the test labels) is reported
beside it, labelled as such. With `reuse` > 0 a candidate byte-identical to an earlier one of
the same evaluation takes that one's records instead of running again, at most `reuse` times
per run (the loop's `run.reuse_runs` rule): a small policy writes the same program again and
again (about 13 distinct programs among 27 in a best-of-32 of the tiny default).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from typing import Any

import jax
import numpy as np

from rl4mle_jax.env import prompts as prompts_lib
from rl4mle_jax.env.actions import extract_action
from rl4mle_jax.env.execute import arun_and_grade
from rl4mle_jax.env.metrics import oriented_score
from rl4mle_jax.env.tasks import SELECT_CARVE, select_splits
from rl4mle_jax.run_config import PICK_RULES


@dataclasses.dataclass
class Candidate:
    kind: str  # "solve" | "improve"
    code: str | None
    failure: str | None
    reward_split: dict | None = None  # the run's reward record on the reward split
    test_split: dict | None = None
    duration_s: float | None = None
    reused_run: bool = False  # its records are an identical earlier candidate's (`reuse`)
    prompt_tokens: int | None = None  # token lengths (the loop's warm-up forecasts from them)
    response_tokens: int | None = None
    # A candidate that never ran because its code block does not parse (or is empty): that
    # block and the parser's message, kept for reading the evaluation's failures; never run.
    failed_code: str | None = None
    failure_message: str | None = None

    def score(self, split: str) -> float | None:
        """The grader's score where the reward rules call the run valid (trained, graded)."""
        return valid_score(self.reward_split if split == "reward" else self.test_split)

    def boot(self, split: str) -> list[float] | None:
        """The grader's replicates of `score(split)` (`GradeReport.score_boot`), if any."""
        return valid_boot(self.reward_split if split == "reward" else self.test_split)


def valid_score(rec: dict | None) -> float | None:
    """A run record's score where the reward rules call the run valid, else None."""
    return rec["score"] if rec and rec.get("status") == "valid" else None


def valid_boot(rec: dict | None) -> list[float] | None:
    """The grader's replicates of `valid_score(rec)` (`GradeReport.score_boot`), if any."""
    if valid_score(rec) is None:
        return None
    return (rec.get("grade") or {}).get("score_boot")


class SharedRuns:
    """Which candidates of one evaluation run, and which take an identical earlier one's run:
    each run serves its program at most `reuse` more times, then the next copy runs afresh
    (so a program whose result varies is re-drawn at a fixed rate). reuse 0: every one runs."""

    def __init__(self, reuse: int = 0):
        self.reuse = int(reuse)
        self._owner: dict[str, list] = {}  # code -> [the candidate that ran it, times reused]

    def assign(self, cands: list[Candidate]) -> tuple[list[Candidate],
                                                     list[tuple[Candidate, Candidate]]]:
        """(the candidates to run, [(a copy, the candidate whose run it takes)])."""
        to_run, copies = [], []
        for c in cands:
            if c.code is None:
                continue
            owner = self._owner.get(c.code)
            if owner is not None and owner[1] < self.reuse:
                owner[1] += 1
                copies.append((c, owner[0]))
            else:
                self._owner[c.code] = [c, 0]
                to_run.append(c)
        return to_run, copies


# ---------------------------------------------------------------- the pick
# "max": the best reward-split score (the loop trains on that split, so over a run the policy
# drifts toward programs whose reward-split score is high by chance as well as by merit);
# "cv": among the finalists, the best mean over the reward split and the selection splits
# (carves of public train the loop never trains on); "cv_median": their median (one split's
# lucky carve cannot carry a finalist); "folds": the selection splits alone.
FINALIST_K_SE = 3.0  # finalists: within this many paired standard errors of the best
MAX_FINALISTS = 10  # (RunConfig.eval_finalist_se / eval_finalists; 2.0 and 6 until 2026-12-07)
PICK_K_SE = 2.0  # beats_on_folds: a challenger must win by more than this many paired s.e.


def finalists(cands: list[dict], direction: str, k_se: float = FINALIST_K_SE,
              max_finalists: int = MAX_FINALISTS, distinct_outcomes: bool = True
              ) -> list[dict]:
    """The candidates (as `Candidate` dicts) a selection looks at again: one per distinct
    program valid on the reward split (its best run), those whose reward-split score is within
    `k_se` paired standard errors (the grader's shared resamples) of the best's, best first, at
    most `max_finalists`. Without replicates only the best and exact ties are in.

    distinct_outcomes: programs whose reward-split runs are identical (the same score and the
    same replicates, i.e. the same predictions on every resample: programs that differ only in
    comments, names or dead code) take one place, the first candidate's, so that the places go
    to different models."""
    from rl4mle_jax.study import paired_se

    best_of: dict[str, dict] = {}
    for c in cands:
        s = valid_score(c.get("reward_split"))
        if c.get("code") is None or s is None:
            continue
        old = best_of.get(c["code"])
        if old is None or oriented_score(s, direction) > oriented_score(
                valid_score(old["reward_split"]), direction):
            best_of[c["code"]] = c
    ranked = sorted(best_of.values(), reverse=True, key=lambda c: oriented_score(
        valid_score(c["reward_split"]), direction))
    if distinct_outcomes:
        first: dict[Any, dict] = {}
        for c in ranked:
            first.setdefault(_outcome(c), c)
        ranked = list(first.values())
    if not ranked:
        return []
    top = ranked[0]
    top_s = oriented_score(valid_score(top["reward_split"]), direction)
    out = [top]
    for c in ranked[1:]:
        gap = top_s - oriented_score(valid_score(c["reward_split"]), direction)
        se = paired_se(valid_boot(top["reward_split"]), valid_boot(c["reward_split"]))
        if gap <= 1e-12 or (se is not None and gap <= k_se * se):
            out.append(c)
    return out[:max(1, int(max_finalists))]


def _outcome(c: dict) -> Any:
    """A candidate's reward-split outcome: its score and replicates (its code where the record
    has no replicates, so that only identical programs share one)."""
    boot = valid_boot(c["reward_split"])
    if not boot:
        return c["code"]
    return (valid_score(c["reward_split"]), tuple(float(x) for x in boot))


def pick_candidate(cands: list[dict], direction: str, rule: str = "max",
                   select: dict[str, dict[str, dict]] | None = None,
                   folds: list[str] | None = None, k_se: float = FINALIST_K_SE,
                   max_finalists: int = MAX_FINALISTS, distinct_outcomes: bool = True
                   ) -> dict | None:
    """The candidate `rule` (PICK_RULES) picks; None when none is valid on the reward split.

    select: {program: {selection split: its run's reward record}} for the finalists; a
    finalist that is not valid on every one of `folds` ranks after those that are (a program
    that fails on other rows of the same data is not the one to hand in)."""
    if rule not in PICK_RULES:
        raise ValueError(f"pick rule must be one of {PICK_RULES}, got {rule!r}")
    fin = finalists(cands, direction, k_se, max_finalists, distinct_outcomes)
    if not fin or rule == "max" or not folds:
        return fin[0] if fin else None

    return max(fin, key=lambda c: rule_key(c, direction, rule, (select or {}).get(c["code"], {}),
                                           folds))


def rule_key(c: dict, direction: str, rule: str, runs: dict[str, dict], folds: list[str]
             ) -> tuple[bool, float, float]:
    """What `rule` ranks a finalist by (larger is better): (valid on every one of `folds`, its
    mean oriented score over the folds, and the reward split too under "cv" (the median of
    those under "cv_median"), then its reward split score). runs: {selection split: the
    finalist's run record there}."""
    reward = oriented_score(valid_score(c["reward_split"]), direction)
    fold = [valid_score(runs.get(sp)) for sp in folds]
    scores = [oriented_score(s, direction) for s in fold if s is not None]
    if rule in ("cv", "cv_median"):
        scores.append(reward)
    if not scores:
        centre = float("-inf")
    elif rule == "cv_median":
        centre = float(np.median(scores))
    else:
        centre = float(sum(scores) / len(scores))
    return all(s is not None for s in fold), centre, reward


async def _run_candidates(cands: list[Candidate], task: Any, sandbox: Any, timeout_s: float,
                          concurrency: int, shared: SharedRuns | None = None) -> None:
    """Each candidate through the one run-and-grade step, on the reward and the test split
    (or, for a copy `shared` assigns, the records of the identical candidate that ran)."""
    sem = asyncio.Semaphore(concurrency)
    to_run, copies = (shared or SharedRuns(0)).assign(cands)

    async def one(c: Candidate) -> None:  # assign() leaves out candidates without code
        for split in ("reward", "test"):
            async with sem:
                run = await arun_and_grade(c.code, task, sandbox, split=split,
                                           timeout_s=timeout_s)
            rec = run.reward.to_dict()
            if split == "reward":
                c.reward_split, c.duration_s = rec, run.duration_s
            else:
                c.test_split = rec

    await asyncio.gather(*(one(c) for c in to_run))
    for c, src in copies:
        c.reward_split = None if src.reward_split is None else dict(src.reward_split)
        c.test_split = None if src.test_split is None else dict(src.test_split)
        c.duration_s, c.reused_run = src.duration_s, True


def _sample_codes(comps: Any, params: Any, prompts: list[str], rng: jax.Array, kind: str,
                  temperature: float, max_new_tokens: int,
                  truncation: dict[str, Any] | None = None) -> list[Candidate]:
    tok = comps.tokenizer
    ids = [tok.encode(p) for p in prompts]
    out = comps.sampler.generate(params, ids, rng, max_new_tokens=max_new_tokens,
                                 temperature=temperature, **(truncation or {}))
    cands = []
    for i in range(len(prompts)):
        action = extract_action(tok.decode(out.tokens[i, :out.lengths[i]].tolist(),
                                                 skip_special_tokens=True))
        cands.append(Candidate(kind, action.code if action.ok else None, action.failure,
                               prompt_tokens=len(ids[i]), response_tokens=int(out.lengths[i]),
                               failed_code=None if action.ok else action.code,
                               failure_message=action.message))
    return cands


def token_lengths(evaluation: dict[str, Any]) -> list[tuple[int, int]]:
    """(prompt, response) token lengths of an evaluation's candidates (single- or multi-task
    record); evaluations written before the lengths were recorded give none."""
    records = ([evaluation] if "tasks" not in evaluation
               else list(evaluation["tasks"].values()))
    return [(c["prompt_tokens"], c["response_tokens"]) for r in records
            for c in r.get("candidates", []) if c.get("prompt_tokens") is not None]


def prompt_kwargs(comps: Any) -> dict[str, Any]:
    """How the loop renders prompts for this policy: its budget, chat template and tokenizer."""
    chat = comps.tokenizer.apply_chat_template if comps.tokenizer.is_chat else None
    return dict(cfg=comps.prompt_cfg, chat_template=chat,
                count_tokens=lambda s: len(comps.tokenizer.encode(s)))


def solve_prompt_text(comps: Any) -> str:
    """The loop's solve prompt for `comps.task` (what a zero-shot sample is asked)."""
    return prompts_lib.solve_prompt(comps.context, **prompt_kwargs(comps)).text


def best_of_n(comps: Any, params: Any, n: int, rng: jax.Array, temperature: float = 0.7,
              concurrency: int = 2, reuse: int = 0, truncation: dict[str, Any] | None = None,
              pick: str = "max", select_folds: int = 0, finalist_se: float = FINALIST_K_SE,
              max_finalists: int = MAX_FINALISTS) -> dict[str, Any]:
    """Samples N candidates of both kinds and reports the honest pick and the paper's number.

    reuse: how many identical later candidates one run serves (`SharedRuns`; 0: all run).
    truncation: top_k / top_p / min_p for `Sampler.generate` (the loop's; None: none).
    pick, select_folds, finalist_se, max_finalists: the pick rule, its selection splits and
    its finalists (`select_pick`).
    """
    task, direction = comps.task, comps.task.direction
    if n <= 0:  # evaluation switched off (e.g. in quick tests)
        return {"n": 0, "direction": direction, "valid_rate": None, "pick": {},
                "paper_protocol_best_test_score": None, "by_kind": {}, "candidates": [],
                "runs": 0}
    timeout = comps.episode_cfg.timeout_s
    max_new = comps.prompt_cfg.max_response_tokens
    kw = prompt_kwargs(comps)
    solve_prompt = solve_prompt_text(comps)
    k_solve, k_improve = jax.random.split(rng)
    n_solve = n - n // 2
    cands = _sample_codes(comps, params, [solve_prompt] * n_solve, k_solve, "solve",
                          temperature, max_new, truncation)
    shared = SharedRuns(reuse)
    asyncio.run(_run_candidates(cands, task, comps.sandbox, timeout, concurrency, shared))
    seed = max(cands, key=lambda c: oriented_score(c.score("reward"), direction))
    if n // 2:
        if seed.score("reward") is not None:  # its outcome: "No error detected, ... score"
            prompt = prompts_lib.improve_prompt(comps.context, seed.code, seed.reward_split,
                                                **kw).text
            kind = "improve"
        else:  # nothing to improve on: the second half also starts from scratch
            prompt, kind = solve_prompt, "solve"
        more = _sample_codes(comps, params, [prompt] * (n // 2), k_improve, kind,
                             temperature, max_new, truncation)
        asyncio.run(_run_candidates(more, task, comps.sandbox, timeout, concurrency, shared))
        cands += more
    oracle = max(cands, key=lambda c: oriented_score(c.score("test"), direction))
    valid = [c for c in cands if c.score("reward") is not None]
    result = {
        "n": len(cands),
        "direction": direction,
        "valid_rate": len(valid) / max(len(cands), 1),
        "runs": sum(c.code is not None and not c.reused_run for c in cands),
        "pick": {},
        "paper_protocol_best_test_score": oracle.score("test"),
        "by_kind": {k: {"n": sum(c.kind == k for c in cands),
                        "valid": sum(c.kind == k and c.score("reward") is not None
                                     for c in cands)} for k in ("solve", "improve")},
        "candidates": [dataclasses.asdict(c) for c in cands],
    }
    return select_pick(result, task, comps.sandbox, pick, select_folds, timeout, concurrency,
                       finalist_se, max_finalists)


def _pick_record(c: dict, rule: str) -> dict[str, Any]:
    return {"rule": rule, "kind": c["kind"], "reward_score": valid_score(c["reward_split"]),
            "test_score": valid_score(c["test_split"]), "code": c["code"],
            # the grader's bootstrap replicates of the test score (study.learning_check
            # pairs them across evaluations for the pick change's standard error)
            "test_score_boot": valid_boot(c["test_split"])}


def select_pick(result: dict[str, Any], task: Any, sandbox: Any, rule: str = "max",
                folds: int = 0, timeout_s: float | None = None, concurrency: int = 2,
                finalist_se: float = FINALIST_K_SE, max_finalists: int = MAX_FINALISTS
                ) -> dict[str, Any]:
    """Sets `result["pick"]` (a single-task evaluation) by `rule` (PICK_RULES), running the
    finalists (`finalists`: `finalist_se`, `max_finalists`) on `folds` selection splits first
    where `rule` needs them; the reward-split maximum's pick is kept as `result["pick_max"]`
    beside it. Runs already in `result["selection"]` are not repeated, so an evaluation made
    (or cached) under one rule can be re-picked under another (`needs_repick`). Returns
    `result`."""
    if rule not in PICK_RULES:
        raise ValueError(f"pick rule must be one of {PICK_RULES}, got {rule!r}")
    cands, direction = result.get("candidates") or [], result["direction"]
    if not cands:
        return result
    top = pick_candidate(cands, direction, "max")
    splits = select_splits(folds) if rule != "max" else []
    runs = selection_runs(result)  # {program's sha256: {split: record}}
    sel = result["selection"]
    fin = finalists(cands, direction, finalist_se, max_finalists) if splits else []
    if len(fin) > 1:
        run_on_folds([c["code"] for c in fin], task, sandbox, splits, runs, timeout_s,
                     concurrency)
    sel["finalists"], sel["folds"] = len(fin), splits
    by_code = {c["code"]: runs.get(code_key(c["code"]), {}) for c in fin}
    chosen = (pick_candidate(cands, direction, rule, by_code, splits, finalist_se,
                             max_finalists) if len(fin) > 1 else top)
    if chosen is None:  # nothing valid: the first candidate stands for the evaluation
        chosen = cands[0]
    result["pick"] = _pick_record(chosen, rule)
    if rule != "max":  # the maximum needs no finalists (`needs_repick`)
        result["pick"]["finalist_rule"] = _finalist_rule(finalist_se, max_finalists)
    if splits:
        result["pick"]["select_scores"] = {sp: valid_score(r) for sp, r in
                                           by_code.get(chosen["code"], {}).items()}
    result["pick_max"] = _pick_record(top if top is not None else cands[0], "max")
    return result


def _finalist_rule(finalist_se: float, max_finalists: int) -> dict[str, Any]:
    return {"k_se": float(finalist_se), "max": int(max_finalists), "distinct_outcomes": True}


def needs_repick(result: dict[str, Any], rule: str, finalist_se: float = FINALIST_K_SE,
                 max_finalists: int = MAX_FINALISTS) -> bool:
    """Whether a (cached) single-task evaluation's pick was made otherwise than `rule` with
    these finalists would make it. Picks recorded before the finalist rule was (2 standard
    errors, 6, programs of one outcome each in) count as made with that rule."""
    pick = result.get("pick") or {}
    if pick.get("rule", "max") != rule or "pick_max" not in result:
        return True
    if rule == "max":  # the maximum needs no finalists
        return False
    made = pick.get("finalist_rule") or {"k_se": 2.0, "max": 6, "distinct_outcomes": False}
    return made != _finalist_rule(finalist_se, max_finalists)


def run_on_folds(codes: list[str], task: Any, sandbox: Any, folds: list[str],
                 runs: dict[str, dict[str, dict]], timeout_s: float | None = None,
                 concurrency: int = 2) -> None:
    """Runs each program on each selection split it has no record of in `runs` ({program's
    sha256: {split: record}}, filled in place: status, score, the grader's replicates)."""
    todo = [(code, sp) for code in dict.fromkeys(codes) for sp in folds
            if sp not in runs.get(code_key(code), {})]
    if not todo:
        return

    async def go() -> None:
        sem = asyncio.Semaphore(concurrency)

        async def one(code: str, sp: str) -> None:
            async with sem:
                run = await arun_and_grade(code, task, sandbox, split=sp, timeout_s=timeout_s)
            rec = run.reward.to_dict()
            runs.setdefault(code_key(code), {})[sp] = {
                "status": rec["status"], "score": rec.get("score"),
                "grade": {"score_boot": (rec.get("grade") or {}).get("score_boot")},
                "duration_s": rec.get("duration_s")}

        await asyncio.gather(*(one(*t) for t in todo))

    asyncio.run(go())


def beats_on_folds(challenger: dict[str, dict], incumbent: dict[str, dict], folds: list[str],
                   direction: str, k_se: float = PICK_K_SE) -> bool:
    """Whether a program beats another on the selection splits `folds` (each's runs there,
    {split: record}): valid on every fold, and where the other is too, its mean oriented score
    over the folds is better by more than `k_se` paired standard errors of the difference (the
    grader's shared resamples per fold; without replicates, by any margin). Where the other
    fails on a fold it is beaten."""
    from rl4mle_jax.study import mean_se, paired_se

    ch = [valid_score(challenger.get(sp)) for sp in folds]
    inc = [valid_score(incumbent.get(sp)) for sp in folds]
    if not folds or any(x is None for x in ch):
        return False
    if any(x is None for x in inc):
        return True
    gap = float(np.mean([oriented_score(a, direction) - oriented_score(b, direction)
                         for a, b in zip(ch, inc)]))
    se = mean_se([paired_se(valid_boot(incumbent[sp]), valid_boot(challenger[sp]))
                  for sp in folds])
    return gap > (k_se * se if se is not None else 0.0)


def selection_runs(result: dict[str, Any]) -> dict[str, dict[str, dict]]:
    """An evaluation's selection runs ({program's sha256: {split: record}}, to fill in place),
    emptied first where they were made on another carve of the selection splits
    (`tasks.SELECT_CARVE`)."""
    sel = result.setdefault("selection", {"runs": {}})
    if not _this_carve(sel):
        sel["runs"], sel["carve"] = {}, SELECT_CARVE
    return sel.setdefault("runs", {})


def _this_carve(sel: dict[str, Any]) -> bool:
    """Whether an evaluation's `selection` record was made on the current carve."""
    return sel.get("carve") == SELECT_CARVE


def runs_of(result: dict[str, Any], code: str) -> dict[str, dict]:
    """{selection split: record} of `code` in an evaluation's selection runs (none where they
    were made on another carve)."""
    sel = result.get("selection") or {}
    if not _this_carve(sel):
        return {}
    return (sel.get("runs") or {}).get(code_key(code), {})


def code_key(code: str) -> str:
    """How `run_on_folds` keys a program's selection runs."""
    return hashlib.sha256(code.encode()).hexdigest()


def save_eval(result: dict[str, Any], path: Any) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
