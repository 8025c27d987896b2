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
import json
from typing import Any

import jax

from rl4mle_jax.env import prompts as prompts_lib
from rl4mle_jax.env.actions import extract_action
from rl4mle_jax.env.execute import arun_and_grade
from rl4mle_jax.env.metrics import oriented_score


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

    def score(self, split: str) -> float | None:
        """The grader's score where the reward rules call the run valid (trained, graded)."""
        rec = self.reward_split if split == "reward" else self.test_split
        return rec["score"] if rec and rec.get("status") == "valid" else None

    def boot(self, split: str) -> list[float] | None:
        """The grader's replicates of `score(split)` (`GradeReport.score_boot`), if any."""
        rec = self.reward_split if split == "reward" else self.test_split
        if self.score(split) is None:
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
                               prompt_tokens=len(ids[i]), response_tokens=int(out.lengths[i])))
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
              concurrency: int = 2, reuse: int = 0, truncation: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    """Samples N candidates of both kinds and reports the honest pick and the paper's number.

    reuse: how many identical later candidates one run serves (`SharedRuns`; 0: all run).
    truncation: top_k / top_p / min_p for `Sampler.generate` (the loop's; None: none).
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
    pick = max(cands, key=lambda c: oriented_score(c.score("reward"), direction))
    oracle = max(cands, key=lambda c: oriented_score(c.score("test"), direction))
    valid = [c for c in cands if c.score("reward") is not None]
    return {
        "n": len(cands),
        "direction": direction,
        "valid_rate": len(valid) / max(len(cands), 1),
        "runs": sum(c.code is not None and not c.reused_run for c in cands),
        "pick": {"kind": pick.kind, "reward_score": pick.score("reward"),
                 "test_score": pick.score("test"), "code": pick.code,
                 # the grader's bootstrap replicates of the test score (study.learning_check
                 # pairs them across evaluations for the pick change's standard error)
                 "test_score_boot": pick.boot("test")},
        "paper_protocol_best_test_score": oracle.score("test"),
        "by_kind": {k: {"n": sum(c.kind == k for c in cands),
                        "valid": sum(c.kind == k and c.score("reward") is not None
                                     for c in cands)} for k in ("solve", "improve")},
        "candidates": [dataclasses.asdict(c) for c in cands],
    }


def save_eval(result: dict[str, Any], path: Any) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
