"""Solve and improve prompts, within a token budget, rendered by a chat template or as plain text.

A prompt is built from a `TaskContext` (description, the data layout the program sees, the
libraries the sandbox's Python can import, the time limit). The improve prompt adds an earlier
solution's code (the agent's own, never the instrumented version) and a one-line outcome in the
paper's phrasing. The description and the earlier code are cut to fit `max_prompt_tokens`
(measured on the rendered prompt with the caller's `count_tokens`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from rl4mle_jax.env.instrument import strip_markers
from rl4mle_jax.env.trim import TRIM_FIRST, approx_token_count, lines_omitted, trim_code

QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# import name -> distribution name (shown to the model)
LIBRARY_CANDIDATES: dict[str, str] = {
    "numpy": "numpy", "pandas": "pandas", "sklearn": "scikit-learn", "scipy": "scipy",
    "lightgbm": "lightgbm", "xgboost": "xgboost", "catboost": "catboost", "torch": "torch",
    "tensorflow": "tensorflow", "statsmodels": "statsmodels", "nltk": "nltk", "PIL": "Pillow",
    "cv2": "opencv-python", "joblib": "joblib", "polars": "polars", "transformers": "transformers",
}
ANSWER_FORM = (
    "Answer with a short plan (a few sentences), then the complete program in one fenced "
    "```python block. The program reads its data from ./input/ and must write its predictions "
    "to ./submission/submission.csv in the format of sample_submission.csv."
)


@dataclass(frozen=True)
class PromptConfig:
    """Prompt limits; the paper uses 1024 prompt tokens and 1024 response tokens."""

    max_prompt_tokens: int = 1024
    max_response_tokens: int = 1024
    system_prompt: str | None = QWEN_DEFAULT_SYSTEM
    max_files: int = 12
    max_columns: int = 25
    max_cell_chars: int = 24
    wide_columns: int = 8  # a CSV with more columns is described compactly
    layout_share: float = 0.3  # the data layout's most of max_prompt_tokens (fewer columns shown)
    min_description_tokens: int = 48
    code_share: float = 0.65  # of the trimmable room, the earlier code's share (improve prompt)
    # What a cut earlier program keeps first (`env.trim.trim_code`'s `first`): "imports" (its
    # top-level imports, then its end) or "choices" (the statements that construct a model or
    # vectorizer or bind numeric settings, then its end). "choices" let titanic-survival's
    # children build on their parent, but its warm starts were less often valid on
    # diamonds-cut (14 of 40 samples over three builds against 26 of 40), and the learning
    # checks' gains were smaller (docs/learning_check/results_trim.md).
    trim_first: str = "imports"

    def __post_init__(self):
        if self.trim_first not in TRIM_FIRST:
            raise ValueError(f"prompt.trim_first must be one of {TRIM_FIRST}, got "
                             f"{self.trim_first!r}")


@dataclass(frozen=True)
class TaskContext:
    """What a prompt says about the task."""

    description: str
    data_layout: str
    libraries: tuple[str, ...]
    timeout_s: float
    metric: str = ""
    direction: str = "higher"


@dataclass
class Prompt:
    text: str  # rendered prompt
    messages: list[dict]
    n_tokens: int
    # Which parts were cut, and to how many tokens; an improve prompt's also says how many of
    # the earlier program's lines it leaves out ("code_lines_omitted"; 0: shown whole).
    trimmed: dict = field(default_factory=dict)


# ---------------------------------------------------------------- probes
_PROBE = """
import importlib.util, importlib.metadata as md, json
out = {}
for mod, dist in json.loads(%r).items():
    if importlib.util.find_spec(mod) is None:
        continue
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = ""
print("@@LIBS " + json.dumps(out))
"""


def probe_libraries(sandbox: Any = None, python: str | None = None,
                    candidates: dict[str, str] | None = None, input_dir: Path | None = None
                    ) -> dict[str, str]:
    """{display name: version} of the candidates importable by the sandbox's Python.

    With `sandbox` (anything with `.run(code, input_dir)`), the probe runs inside it, which is
    the truth the agent's program will meet; otherwise `python` (default: this interpreter).
    """
    cands = json.dumps(candidates or LIBRARY_CANDIDATES)
    src = _PROBE % cands
    if sandbox is not None:
        if input_dir is None:
            raise ValueError("probe_libraries with a sandbox needs an input_dir to mount")
        res = sandbox.run(src, input_dir, timeout_s=60)
        out = res.stdout
        if hasattr(res, "cleanup"):
            res.cleanup()
    else:
        out = subprocess.run([python or sys.executable, "-c", src], capture_output=True,
                             text=True, timeout=120, check=False).stdout
    for line in out.splitlines():
        if line.startswith("@@LIBS "):
            return json.loads(line[len("@@LIBS "):])
    raise RuntimeError(f"library probe printed no result; output: {out[-500:]!r}")


def _human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _read_csv_head(path: Path) -> tuple[list[str], list[str], int | None]:
    """(header, first row, number of data rows or None for very large files)."""
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        header, row = next(reader, []), next(reader, [])
    n_rows = None
    if path.stat().st_size < 200 * 2**20:
        with path.open("rb") as f:
            n_rows = max(sum(buf.count(b"\n") for buf in iter(lambda: f.read(2**20), b"")) - 1, 0)
    return header, row, n_rows


def _compact_cell(v: str, cfg: PromptConfig) -> str:
    """A cell of a wide table's first row: numbers bare (6 significant digits), text quoted."""
    try:
        x = float(v)
    except ValueError:
        x = None
    if x is not None and v.strip() and v.strip().lower() not in ("nan", "inf", "-inf"):
        return v if len(v) <= 8 else f"{x:.6g}"
    return repr(v if len(v) <= cfg.max_cell_chars else v[: cfg.max_cell_chars - 3] + "...")


def _describe_csv(name: str, head: tuple, ref: tuple | None, cfg: PromptConfig) -> str:
    """Rows and columns; the first row only for the widest CSV (the others reuse its columns)
    and for narrow files such as the sample submission. A wide table (more than
    `wide_columns`) names each column once, with its first-row value, to fit the budget."""
    header, row, n_rows = head
    rows = f"{n_rows} rows, " if n_rows is not None else ""
    if ref is not None and ref[0] != name and set(header) < set(ref[1]) and \
            len(ref[1]) - len(header) <= 5:
        missing = [c for c in ref[1] if c not in header]
        return f"{rows}columns: those of {ref[0]} without {', '.join(missing)}"
    cols = header[: cfg.max_columns]
    show_row = ref is None or ref[0] == name or len(header) <= 5
    if len(header) > cfg.wide_columns:
        more = f", ... {len(header) - len(cols)} more" if len(header) > len(cols) else ""
        if show_row:
            cells = ", ".join(f"{c}={_compact_cell(v, cfg)}" for c, v in zip(cols, row))
            return f"{rows}{len(header)} columns; column=first-row value: {cells}{more}"
        return f"{rows}{len(header)} columns: {', '.join(cols)}{more}"
    text = f"{rows}columns: {', '.join(cols)}"
    if show_row:
        cut = lambda v: v if len(v) <= cfg.max_cell_chars else v[: cfg.max_cell_chars - 3] + "..."
        text += "\n    first row: " + ", ".join(f"{c}={cut(v)!r}" for c, v in zip(cols, row))
    return text


@lru_cache(maxsize=64)
def _describe_dir_cached(path: str, mtime: float, cfg: PromptConfig) -> str:
    root = Path(path)
    entries = sorted(root.iterdir(), key=lambda p: (p.is_dir(), p.name))[: cfg.max_files]
    heads = {p.name: _read_csv_head(p) for p in entries
             if p.is_file() and p.suffix.lower() in (".csv", ".tsv")}
    widest = max(heads.items(), key=lambda kv: len(kv[1][0]), default=None)
    ref = (widest[0], widest[1][0]) if widest else None
    lines = []
    for p in entries:
        if p.is_dir():
            files = sorted(q.name for q in p.iterdir())
            lines.append(f"- {p.name}/ ({len(files)} files, e.g. {', '.join(files[:3])})")
        elif p.name in heads:
            lines.append(f"- {p.name} ({_human_size(p.stat().st_size)}, "
                         f"{_describe_csv(p.name, heads[p.name], ref, cfg)})")
        else:
            lines.append(f"- {p.name} ({_human_size(p.stat().st_size)})")
    n_all = sum(1 for _ in root.iterdir())
    if n_all > len(entries):
        lines.append(f"- ... {n_all - len(entries)} more entries")
    return "\n".join(lines)


def describe_input_dir(input_dir: Path, cfg: PromptConfig = PromptConfig()) -> str:
    """The files the program will see under ./input/, with sizes and CSV columns/first rows."""
    p = Path(input_dir)
    if not p.is_dir():
        raise FileNotFoundError(f"input dir {p} does not exist")
    room = int(cfg.layout_share * cfg.max_prompt_tokens)
    for k in (cfg.max_columns, 16, 10, 6, 3):  # wide tables: fewer columns until it fits
        text = _describe_dir_cached(str(p.resolve()), p.stat().st_mtime,
                                    dataclasses.replace(cfg, max_columns=min(k, cfg.max_columns)))
        if approx_token_count(text) <= room:
            break
    return text


def task_context(task: Any, libraries: Sequence[str], split: str = "reward",
                 cfg: PromptConfig = PromptConfig()) -> TaskContext:
    """Context of a `rl4mle_jax.env.tasks.Task` for `split` (both splits look alike)."""
    desc = task.description
    if not desc:
        f = task.input_dir(split) / "description.md"
        desc = f.read_text() if f.exists() else ""
    return TaskContext(desc, describe_input_dir(task.input_dir(split), cfg), tuple(libraries),
                       float(task.timeout_s), task.metric, task.direction)


# ---------------------------------------------------------------- outcomes
def format_outcome(record: Any) -> str:
    """The earlier run's outcome in one or two lines (the paper's phrasings)."""
    r = record if isinstance(record, dict) else record.to_dict()
    reason, err = r.get("failure_reason"), r.get("error") or {}
    if r.get("status") == "valid":
        d = r.get("direction")
        hint = f" ({'higher' if d == 'higher' else 'lower'} is better)" if d else ""
        text = f"No error detected, you achieved a score of {r['score']:.6g}{hint}."
    elif r.get("status") == "no_model_training":
        text = ("No model training detected: the submission was written without training a "
                "model on the data.")
    elif reason == "timeout":
        text = f"The script reached a timeout of {r.get('timeout_s') or 0:.0f} seconds."
    elif reason in ("no_code_block", "empty_code"):
        text = "The answer contained no ```python code block with a program."
    elif reason == "syntax_error":
        text = f"No submission.csv, the code does not parse: {err.get('message')}"
    elif reason == "oom":
        text = "No submission.csv, the script ran out of memory."
    elif err.get("type"):
        where = f" at line {err['line']}" if err.get("line") else ""
        src = f" ({err['source']})" if err.get("source") else ""
        text = f"No submission.csv, the error is {err['type']}{where}{src}: {err.get('message')}"
    elif reason and reason.startswith("invalid_submission"):
        g = r.get("grade") or {}
        text = (f"The submission is invalid, check {(g.get('message') or reason)[:300]}. "
                "Compare with sample_submission.csv: column names, ids and the number of rows.")
    elif reason == "no_submission":
        text = "No submission.csv was written, though the script ended without an error."
    else:
        text = f"The script failed ({reason})."
    return strip_markers(text)


# ---------------------------------------------------------------- messages
def _user_text(ctx: TaskContext, description: str, code: str | None, outcome: str | None) -> str:
    libs = ", ".join(ctx.libraries) if ctx.libraries else "the Python standard library"
    metric = (f"Submissions are scored by {ctx.metric} ({ctx.direction} is better).\n"
              if ctx.metric else "")
    parts = [
        "You are solving a machine learning task.\n\n# Task\n" + description.strip(),
        "# Data\nThe program runs in a directory with ./input/ (read-only) holding:\n"
        + ctx.data_layout,
        f"# Rules\n{metric}Installed libraries: {libs}. No internet access. The program must "
        f"finish within {ctx.timeout_s:.0f} seconds on one CPU.",
    ]
    if code is not None:
        parts.append("# Earlier solution\n```python\n" + code.rstrip("\n") + "\n```\n"
                     f"Outcome: {outcome}\n\nImprove this solution to get a better score (or "
                     "fix its error).")
    parts.append(ANSWER_FORM)
    return "\n\n".join(parts)


def plain_template(messages: Sequence[dict]) -> str:
    """Plain-text rendering for models without a chat template (the tiny model)."""
    body = "\n\n".join(m["content"] for m in messages)
    return body + "\n\nAnswer:\n"


def _messages(cfg: PromptConfig, user: str) -> list[dict]:
    msgs = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return msgs + [{"role": "user", "content": user}]


_CUT_MARK = "\n[... description cut ...]"


def _cut_text(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """Head of `text` within `max_tokens`, cut at a line boundary when possible."""
    if count(text) <= max_tokens:
        return text
    lo, hi, mark = 0, len(text), _CUT_MARK
    while lo < hi:  # longest prefix that fits, by bisection on characters
        mid = (lo + hi + 1) // 2
        if count(text[:mid] + mark) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    head = text[:lo]
    if "\n" in head[len(head) // 2:]:
        head = head[: head.rindex("\n")]
    return head + mark if head else ""


def _submission_section(text: str) -> tuple[int, int] | None:
    """(start, end) of the description's markdown section on the submission format."""
    lines = text.splitlines(keepends=True)
    start = end = None
    pos = 0
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith("#"):
            if start is not None and end is None:
                end = pos
            if start is None and "submission" in stripped.lower():
                start = pos
        pos += len(line)
    if start is None:
        return None
    return start, end if end is not None else len(text)


def _cut_description(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """The description within `max_tokens`: its section on the submission format is kept
    whole where it takes at most half the room (a program in the wrong format scores
    nothing), the rest is cut from the end."""
    if count(text) <= max_tokens:
        return text
    sec = _submission_section(text)
    if sec is not None:
        section = text[sec[0]:sec[1]].rstrip("\n")
        need = count(section) + count(_CUT_MARK) + 1
        if need <= max_tokens // 2:
            rest = (text[:sec[0]] + text[sec[1]:]).rstrip("\n")
            head = _cut_text(rest, max_tokens - need, count)
            return (head + "\n\n" if head else "") + section
    return _cut_text(text, max_tokens, count)


def build_prompt(ctx: TaskContext, *, earlier_code: str | None = None,
                 outcome: str | None = None, cfg: PromptConfig = PromptConfig(),
                 chat_template: Callable[[list[dict]], str] | None = None,
                 count_tokens: Callable[[str], int] = approx_token_count) -> Prompt:
    """Solve prompt (no `earlier_code`) or improve prompt, rendered and within the budget.

    chat_template: renders messages to text (e.g. `tokenizer.apply_chat_template`); None uses
    `plain_template`. Raises ValueError when even the untrimmable parts exceed the budget.
    """
    render = chat_template or plain_template
    if earlier_code is not None and outcome is None:
        raise ValueError("an improve prompt needs the earlier solution's outcome")

    def make(desc: str, code: str | None) -> tuple[str, list[dict]]:
        msgs = _messages(cfg, _user_text(ctx, desc, code, outcome))
        return render(msgs), msgs

    budget = cfg.max_prompt_tokens
    text, msgs = make(ctx.description, earlier_code)
    n = count_tokens(text)
    if n <= budget:
        return Prompt(text, msgs, n)
    fixed = count_tokens(make("", "" if earlier_code is not None else None)[0])
    room = budget - fixed
    if room < cfg.min_description_tokens // 2:
        raise ValueError(f"prompt needs {fixed} tokens without description and code, over the "
                         f"budget max_prompt_tokens={budget}; raise it or shorten the data layout")
    desc_tokens = count_tokens(ctx.description)
    code_tokens = count_tokens(earlier_code) if earlier_code is not None else 0
    if earlier_code is None:
        desc_room, code_room = room, 0
    else:
        desc_min = min(desc_tokens, cfg.min_description_tokens)
        code_room = min(code_tokens, max(int(room * cfg.code_share), room - desc_tokens),
                        room - desc_min)
        desc_room = room - code_room
    for _ in range(8):
        desc = _cut_description(ctx.description, max(desc_room, 0), count_tokens)
        code = trim_code(earlier_code, max(code_room, 1), count_tokens, cfg.trim_first) \
            if earlier_code is not None else None
        text, msgs = make(desc, code)
        n = count_tokens(text)
        if n <= budget:
            trimmed = {"description_tokens": desc_room,
                       "code_tokens": code_room if code is not None else None}
            if code is not None:
                trimmed["code_lines_omitted"] = lines_omitted(earlier_code, code)
            return Prompt(text, msgs, n, trimmed)
        over = n - budget  # joins add a few tokens: take them from both parts
        desc_room -= over // 2 + 1
        code_room -= over - over // 2 + 1
    raise ValueError(f"could not fit the prompt into {budget} tokens (last try: {n})")


def description_cut(ctx: TaskContext, prompt: Prompt,
                    count_tokens: Callable[[str], int] = approx_token_count
                    ) -> tuple[int, int, str] | None:
    """What `build_prompt` cut from the description: (its tokens, the tokens kept, the lines
    dropped), or None when it fits whole."""
    room = prompt.trimmed.get("description_tokens")
    if room is None:
        return None
    kept = _cut_description(ctx.description, max(room, 0), count_tokens)
    left = set(kept.splitlines())
    dropped = [line for line in ctx.description.splitlines() if line not in left]
    return count_tokens(ctx.description), count_tokens(kept), "\n".join(dropped)


# ---------------------------------------------------------------- the two prompts
def solve_prompt(ctx: TaskContext, *, cfg: PromptConfig = PromptConfig(),
                 chat_template: Callable[[list[dict]], str] | None = None,
                 count_tokens: Callable[[str], int] = approx_token_count) -> Prompt:
    """The solve prompt (write a solution from scratch): the RL loop, the evaluation and the
    warm start all render it here."""
    return build_prompt(ctx, cfg=cfg, chat_template=chat_template, count_tokens=count_tokens)


def improve_prompt(ctx: TaskContext, earlier_code: str, outcome: Any, *,
                   cfg: PromptConfig = PromptConfig(),
                   chat_template: Callable[[list[dict]], str] | None = None,
                   count_tokens: Callable[[str], int] = approx_token_count) -> Prompt:
    """The improve prompt: an earlier solution's (un-instrumented) code and its outcome.

    outcome: the one-line text, or the earlier run's reward record (`format_outcome` of it).
    """
    if earlier_code is None:
        raise ValueError("an improve prompt needs the earlier solution's code")
    text = outcome if isinstance(outcome, str) or outcome is None else format_outcome(outcome)
    return build_prompt(ctx, earlier_code=earlier_code, outcome=text, cfg=cfg,
                        chat_template=chat_template, count_tokens=count_tokens)
