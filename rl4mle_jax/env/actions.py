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
            blocks.append(CodeBlock(tag, text[body_start:], m.start(), False))
            return blocks
        blocks.append(CodeBlock(tag, text[body_start:c.start()], m.start(), True))
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

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict:
        return asdict(self)


def extract_action(response: str, max_plan_chars: int = 2000) -> Action:
    """Plan (text before the chosen block) and code; failures carry their own reason."""
    blocks = find_code_blocks(response)
    block = _choose(blocks)
    if block is None:
        return Action(response.strip()[:max_plan_chars], None, "no_code_block",
                      "the response has no fenced ```python code block", len(blocks), False)
    plan = response[: block.start].strip()[:max_plan_chars]
    code = block.code
    if not code.strip():
        return Action(plan, code, "empty_code", "the code block is empty", len(blocks),
                      not block.closed)
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as e:
        msg = f"SyntaxError at line {e.lineno}: {e.msg}"
        return Action(plan, code, "syntax_error", msg, len(blocks), not block.closed)
    except ValueError as e:  # e.g. null bytes in the source
        return Action(plan, code, "syntax_error", f"ValueError: {e}", len(blocks),
                      not block.closed)
    except (RecursionError, MemoryError) as e:  # nesting beyond what CPython compiles
        return Action(plan, code, "syntax_error", f"{type(e).__name__}: the code is nested too "
                      "deeply to compile", len(blocks), not block.closed)
    return Action(plan, code, None, None, len(blocks), not block.closed)
