"""Trimming a program to a token budget while keeping it valid Python.

What is kept first (`first`): "imports", the top-level imports; or "choices", the statements
that state the program's modelling choices (`_is_choice`: a class is constructed, e.g.
`clf = LogisticRegression(C=5.0)` or `vec = TfidfVectorizer(...)`, or a name is bound to a
literal holding a number, e.g. `params = {"max_depth": 6}`), last ones first and inside an
expanded body too. Then statements from the end of the program backwards (where the submission
is written), then statements from the start forwards. Whole statements are dropped; a run of
dropped statements becomes one `...  # [N lines omitted]` line at the right indentation (an
Ellipsis statement, so an emptied block still parses). A single statement larger than the
budget (typically `def main():` holding everything) is trimmed inside its body the same way.
Code that does not parse is trimmed by lines (head and tail).

Why "choices" exists: an improve prompt is where the policy sees its parent, and the parent's
value is which model, which features and which settings it used. Under "imports" (the default)
a 512-token improve prompt hid exactly those lines (tweet-source seed 4: the vectorizer and `C`
of the best program were cut from all 40 improve prompts that showed it). What "choices" did to
the tiny default is in docs/learning_check/results_trim.md.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

# The line a run of dropped lines becomes (`...  # [N lines omitted]`, or `# [N lines omitted]`
# when the code does not parse).
_OMITTED = re.compile(r"^[ \t]*(?:\.\.\.  )?# \[(\d+) lines omitted\]$", re.M)
_BODY_LAST = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With, ast.AsyncWith)
TRIM_FIRST = ("imports", "choices")
# Classes whose construction is data handling, not a modelling choice.
_NOT_CHOICES = frozenset({"DataFrame", "Series", "Path", "Index", "Categorical", "Timestamp",
                          "Timedelta", "StringIO", "BytesIO", "Counter", "OrderedDict"})


def approx_token_count(text: str) -> int:
    """Rough token count (≈ 3.5 characters per token for code) when no tokenizer is given."""
    return (len(text) * 2 + 6) // 7


@dataclass
class _Unit:
    text: str
    n_lines: int
    is_import: bool
    node: ast.stmt | None
    first_line: int  # 1-based, includes leading comments/blank lines


def _class_name(func: ast.expr) -> str | None:
    name = func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else None
    if name and name[0].isupper() and not name.isupper() and name not in _NOT_CHOICES:
        return name
    return None


def _has_number(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, int | float | complex)
               and not isinstance(n.value, bool) for n in ast.walk(node))


def _is_choice(node: ast.stmt) -> bool:
    """Whether a simple statement states a modelling choice: it constructs a class (CamelCase
    callee, not a data container) or binds a literal holding a number. Compound statements
    (def, for, with, ...) are not choices themselves; their bodies are ranked when expanded."""
    if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.Expr | ast.Return):
        return False
    value = node.value
    if value is None:
        return False
    if any(isinstance(n, ast.Call) and _class_name(n.func) for n in ast.walk(value)):
        return True
    if isinstance(node, ast.Expr):
        return False
    try:
        ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return _has_number(value)


def _expandable(node: ast.stmt) -> bool:
    if isinstance(node, _BODY_LAST):
        return node.body[0].lineno > node.lineno
    if isinstance(node, ast.For | ast.AsyncFor | ast.While | ast.If):
        return not node.orelse and node.body[0].lineno > node.lineno
    return False


def _units(stmts: list[ast.stmt], lines: list[str], start: int, stop: int) -> list[_Unit]:
    """Units covering lines [start, stop] (1-based, inclusive), one per statement."""
    out = []
    for i, s in enumerate(stmts):
        first = start if i == 0 else stmts[i - 1].end_lineno + 1
        last = stop if i == len(stmts) - 1 else s.end_lineno
        text = "".join(lines[first - 1:last])
        out.append(_Unit(text, last - first + 1, isinstance(s, ast.Import | ast.ImportFrom), s,
                         first))
    return out


def _indent_of(node: ast.stmt, lines: list[str]) -> str:
    return lines[node.lineno - 1][: len(lines[node.lineno - 1]) - len(
        lines[node.lineno - 1].lstrip())]


def _select(units: list[_Unit], budget: int, lines: list[str], indent: str,
            count: Callable[[str], int], first: str, top: bool) -> str:
    costs = [count(u.text) for u in units]
    if sum(costs) <= budget:
        return "".join(u.text for u in units)
    chosen: dict[int, str] = {}
    left = budget - count(f"{indent}...  # [000 lines omitted]\n")
    if first == "imports" and top:  # the top-level imports, in order
        for i, u in enumerate(units):
            if u.is_import and costs[i] <= left:
                chosen[i], left = u.text, left - costs[i]
    elif first == "choices":  # the modelling choices, last first, at every level
        for i in range(len(units) - 1, -1, -1):
            if costs[i] <= left and _is_choice(units[i].node):
                chosen[i], left = units[i].text, left - costs[i]
    for i in range(len(units) - 1, -1, -1):  # tail first
        if i in chosen:
            continue
        if costs[i] <= left:
            chosen[i], left = units[i].text, left - costs[i]
            continue
        node = units[i].node
        if node is not None and _expandable(node):
            header = "".join(lines[units[i].first_line - 1: node.body[0].lineno - 1])
            inner_budget = left - count(header)
            if inner_budget > 0:
                sub = _units(node.body, lines, node.body[0].lineno,
                             units[i].first_line + units[i].n_lines - 1)
                body = _select(sub, inner_budget, lines, _indent_of(node.body[0], lines), count,
                               first, False)
                chosen[i] = header + body
                left -= count(chosen[i])
        break
    for i in range(len(units)):  # then the head
        if i in chosen:
            continue
        if costs[i] > left:
            break
        chosen[i], left = units[i].text, left - costs[i]
    out, run = [], 0
    for i, u in enumerate(units):
        if i in chosen:
            if run:
                out.append(f"{indent}...  # [{run} lines omitted]\n")
                run = 0
            out.append(chosen[i])
        else:
            run += u.n_lines
    if run:
        out.append(f"{indent}...  # [{run} lines omitted]\n")
    return "".join(out)


def _trim_lines(code: str, budget: int, count: Callable[[str], int]) -> str:
    lines = code.splitlines(keepends=True)
    head, tail = [], []
    i, j, used = 0, len(lines) - 1, count("# [000 lines omitted]\n")
    while i <= j:  # alternate tail and head, tail first
        c = count(lines[j])
        if used + c > budget:
            break
        tail.insert(0, lines[j])
        used, j = used + c, j - 1
        if i > j:
            break
        c = count(lines[i])
        if used + c > budget:
            break
        head.append(lines[i])
        used, i = used + c, i + 1
    n = len(lines) - len(head) - len(tail)
    return "".join(head) + (f"# [{n} lines omitted]\n" if n else "") + "".join(tail)


def trim_code(code: str, max_tokens: int, count_tokens: Callable[[str], int] = approx_token_count,
              first: str = "imports") -> str:
    """`code` cut to at most `max_tokens` (as counted by `count_tokens`), valid Python if it was;
    `first`: what is kept first, "imports" or "choices" (the module's docstring)."""
    if first not in TRIM_FIRST:
        raise ValueError(f"first must be one of {TRIM_FIRST}, got {first!r}")
    if count_tokens(code) <= max_tokens:
        return code
    if not code.endswith("\n"):
        code += "\n"
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = None
    if tree is None or not tree.body:
        return _trim_lines(code, max_tokens, count_tokens)
    lines = code.splitlines(keepends=True)
    budget = max_tokens
    for _ in range(8):  # token counts are not exactly additive: shrink until it fits
        text = _select(_units(tree.body, lines, 1, len(lines)), budget, lines, "", count_tokens,
                       first, True)
        over = count_tokens(text) - max_tokens
        if over <= 0:
            return text
        budget -= max(over, 1)
    return _trim_lines(code, max_tokens, count_tokens)


def lines_omitted(original: str, trimmed: str) -> int:
    """How many of `original`'s lines `trim_code` left out of `trimmed` (0: shown whole): the
    counts of the omission markers it added (a marker the program itself holds cancels out)."""
    return (sum(int(n) for n in _OMITTED.findall(trimmed))
            - sum(int(n) for n in _OMITTED.findall(original)))
