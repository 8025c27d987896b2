"""Extraction of the plan and the code from a model response.

Rule for several fenced blocks: blocks tagged python/py/python3 are preferred over untagged ones;
among the candidates the longest wins (ties: the last), since answers that show a snippet before
the full program are common and the full program is the longest. A block whose closing fence
is missing (the response hit the token limit) runs to the end of the response.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

_FENCE_RE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+.-]*)[^\n]*$", re.M)
_PY_TAGS = {"python", "py", "python3", "py3"}


@dataclass(frozen=True)
class CodeBlock:
    tag: str
    code: str
    start: int  # character offset of the opening fence in the response
    closed: bool
    body_start: int = 0  # character offset of `code` in the response


def find_code_blocks(text: str) -> list[CodeBlock]:
    """All fenced blocks, in order; a closing fence must match the opening one's character."""
    blocks, pos = [], 0
    while True:
        m = _FENCE_RE.search(text, pos)
        if m is None:
            return blocks
        fence, tag = m.group(1), m.group(2).lower()
        body_start = m.end() + 1
        close_re = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
        c = close_re.search(text, body_start)
        if c is None:
            blocks.append(CodeBlock(tag, text[body_start:], m.start(), False, body_start))
            return blocks
        blocks.append(CodeBlock(tag, text[body_start:c.start()], m.start(), True, body_start))
        pos = c.end()


def _choose(blocks: list[CodeBlock]) -> CodeBlock | None:
    tagged = [b for b in blocks if b.tag in _PY_TAGS]
    cands = tagged or [b for b in blocks if b.tag == ""]
    if not cands:
        return None
    best = max(len(b.code.strip()) for b in cands)
    return [b for b in cands if len(b.code.strip()) == best][-1]


def extract_code_block(text: str) -> str | None:
    """The chosen block's code; when the text has no fence at all but parses as Python, the
    whole text (instrumenter answers are sometimes bare code)."""
    block = _choose(find_code_blocks(text))
    if block is not None:
        return block.code
    if "```" not in text and text.strip():
        try:
            compile(text, "<answer>", "exec", dont_inherit=True)
            return text
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
    return None


@dataclass(frozen=True)
class Action:
    """A parsed response. `failure` is None when `code` is runnable Python."""

    plan: str
    code: str | None
    failure: str | None  # "no_code_block" | "empty_code" | "syntax_error"
    message: str | None
    n_blocks: int
    truncated: bool  # the chosen block was not closed
    code_offset: int | None = None  # character offset of `code` in the response
    # Syntax errors: the lines of `code` (1-based, first and last) where the parser located
    # the error — the line it names and, for a bracket closed by a mismatched one, the line of
    # the opening bracket it names. None for every other outcome.
    error_lines: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict:
        return asdict(self)


_ON_LINE_RE = re.compile(r"on line (\d{1,9})")


def syntax_error_lines(e: SyntaxError, n_lines: int) -> tuple[int, int] | None:
    """(first, last) line of the code a SyntaxError points at, within [1, n_lines]; None when it
    names no line. CPython names the line where parsing failed (for an unclosed bracket, the
    bracket's own line) and, for a closing bracket that does not match, also the opening one's
    ("... does not match opening parenthesis '[' on line N")."""
    if not isinstance(e.lineno, int) or not 1 <= e.lineno <= n_lines:
        return None
    first = last = e.lineno
    end = getattr(e, "end_lineno", None)
    if isinstance(end, int) and first <= end <= n_lines:
        last = end
    m = _ON_LINE_RE.search(str(e.msg or ""))
    if m is not None and 1 <= int(m.group(1)) < first:
        first = int(m.group(1))
    return first, last


def extract_action(response: str, max_plan_chars: int = 2000) -> Action:
    """Plan (text before the chosen block) and code; failures carry their own reason."""
    blocks = find_code_blocks(response)
    block = _choose(blocks)
    if block is None:
        return Action(response.strip()[:max_plan_chars], None, "no_code_block",
                      "the response has no fenced ```python code block", len(blocks), False)
    plan = response[: block.start].strip()[:max_plan_chars]
    code = block.code
    where = dict(code_offset=block.body_start)
    if not code.strip():
        return Action(plan, code, "empty_code", "the code block is empty", len(blocks),
                      not block.closed, **where)
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as e:
        msg = f"SyntaxError at line {e.lineno}: {e.msg}"
        return Action(plan, code, "syntax_error", msg, len(blocks), not block.closed, **where,
                      error_lines=syntax_error_lines(e, code.count("\n") + 1))
    except ValueError as e:  # e.g. null bytes in the source
        return Action(plan, code, "syntax_error", f"ValueError: {e}", len(blocks),
                      not block.closed, **where)
    except (RecursionError, MemoryError) as e:  # nesting beyond what CPython compiles
        return Action(plan, code, "syntax_error", f"{type(e).__name__}: the code is nested too "
                      "deeply to compile", len(blocks), not block.closed, **where)
    return Action(plan, code, None, None, len(blocks), not block.closed, **where)
