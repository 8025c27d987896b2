"""SFT pairs for one task: solve, improve and instrumentation (prompt, response, kind) triples.

Solve and improve prompts come from `env.prompts.solve_prompt` / `improve_prompt`, the ones the
RL loop and the evaluation render, as plain text (the tiny model has no chat template). No jax.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import numpy as np

from rl4mle_jax.env import prompts
from rl4mle_jax.env.instrument_lm import LM_MARKER, lm_instrument_prompt, verify_lm_instrumentation
from rl4mle_jax.env.instrument_static import MILESTONES, static_placements
from rl4mle_jax.warmstart.config import WarmStartConfig
from rl4mle_jax.warmstart.demo_runs import Demo


def plain_solve_prompt(task, libraries: Sequence[str], prompt_config, count_tokens,
                       split: str = "reward") -> str:
    """The plain-text (non-chat) solve prompt the tiny model is tuned on and sampled with."""
    ctx = prompts.task_context(task, tuple(libraries), split, prompt_config)
    return prompts.solve_prompt(ctx, cfg=prompt_config, chat_template=None,
                                count_tokens=count_tokens).text


def training_pairs(task, demos: Sequence[Demo], libraries: Sequence[str],
                   prompt_config, count_tokens, cfg: WarmStartConfig
                   ) -> list[tuple[str, str, str]]:
    """(prompt, response, kind) for one task: every valid demo after the solve prompt of both
    splits; improve prompts (an earlier demo and its outcome -> a better valid demo; and each
    edited demo's weaker -> stronger of it and its original, `edit_pairs`); and
    instrumentation pairs (LM instrumenter prompt -> the program with milestone prints).
    Edited demos (`params["edit_of"]`) appear only in their edit pairs."""
    edits = [d for d in demos if "edit_of" in d.params]
    demos = [d for d in demos if "edit_of" not in d.params]  # the originals come first
    valid = sorted((d for d in demos if d.valid), key=lambda d: -d.reward)
    pairs = []
    for split in ("reward", "test"):
        text = plain_solve_prompt(task, libraries, prompt_config, count_tokens, split)
        pairs += [(text, d.response(), "solve") for d in valid]
    ctx = prompts.task_context(task, tuple(libraries), "reward", prompt_config)
    rng = np.random.default_rng(cfg.seed)
    improve = []
    for _ in range(cfg.improve_pairs_per_task if valid else 0):
        before = demos[int(rng.integers(len(demos)))]
        better = [d for d in valid if not before.valid or d.reward > before.reward]
        improve.append((before, better[int(rng.integers(len(better)))] if better else valid[0]))
    for before, after in improve + edit_pairs(demos, edits):
        text = prompts.improve_prompt(ctx, before.code, before.outcome, cfg=prompt_config,
                                      chat_template=None, count_tokens=count_tokens).text
        pairs.append((text, after.response(), "improve"))
    codes = [d.code for d in valid[: cfg.instrument_pairs_per_task]]
    pairs += [(p, r, "instrument") for p, r in instrumentation_pairs(codes)]
    return pairs


def edit_pairs(originals: Sequence[Demo], edits: Sequence[Demo]) -> list[tuple[Demo, Demo]]:
    """(weaker, stronger) of each edited demonstration and its original
    (`params["edit_of"]`) where both are valid and their rewards differ: an improve pair in
    which the better program is the earlier one with one setting changed."""
    out = []
    for edit in edits:
        original = originals[edit.params["edit_of"]]
        if original.valid and edit.valid and original.reward != edit.reward:
            out.append(tuple(sorted((original, edit), key=lambda d: d.reward)))
    return out


def lm_instrumented(code: str) -> str | None:
    """`code` with `print("@@MILESTONE <step>")` lines where the static instrumenter puts each
    step's first marker: the answer the LM instrumenter should give. None if a step has no
    line-level spot (the frozen copy is only taught answers the verifier accepts)."""
    tree = ast.parse(code)
    first: dict[str, ast.AST] = {}
    for pl in sorted(static_placements(tree), key=lambda p: (p.node.lineno, p.node.col_offset)):
        for m in pl.milestones:
            if m not in first:
                if pl.kind != "after":
                    return None
                first[m] = pl.node
    lines = code.rstrip("\n").split("\n")
    inserts: dict[int, list[str]] = {}
    for m in MILESTONES:
        if m in first:
            node = first[m]
            indent = lines[node.lineno - 1][: node.col_offset]
            inserts.setdefault(node.end_lineno, []).append(f'{indent}print("{LM_MARKER} {m}")')
    out = []
    for i, line in enumerate(lines, start=1):
        out.append(line)
        out.extend(inserts.get(i, []))
    return "\n".join(out) + "\n"


def instrumentation_pairs(codes: Sequence[str]) -> list[tuple[str, str]]:
    """(LM instrumenter prompt, accepted answer) pairs for the frozen copy's fine-tuning.

    The prompt is `lm_instrument_prompt` (the text the instrumenter sends, before any chat
    template); each answer passes `verify_lm_instrumentation`.
    """
    pairs = []
    for code in codes:
        answer_code = lm_instrumented(code)
        if answer_code is None:
            continue
        answer = f"```python\n{answer_code}```"
        prog, rec = verify_lm_instrumentation(code, answer)
        if prog is None:
            raise RuntimeError(f"instrumentation demo rejected by the verifier: {rec}")
        pairs.append((lm_instrument_prompt(code), answer))
    return pairs
