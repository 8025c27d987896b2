"""The error a run ended with, read from its stderr: type, message, and the agent's own line.

stderr is written by the program, so this is linear in its size, whatever it holds: lines are
examined with string methods and with patterns of one greedy character class that have nothing
after them (such a match cannot backtrack); no pattern spans lines.

The program's own frames are those whose file is `main.py` (or ends in `/main.py`), so that a
bootstrap around it (`<string>`, `<frozen runpy>`) is skipped; when no frame has that name, the
outermost frame's file is taken to be the program's.
"""

from __future__ import annotations

import re

from rl4mle_jax.env.instrument import InstrumentedProgram, strip_markers

_TB_HEAD = "Traceback (most recent call last):"
_FRAME_HEAD = '  File "'
_FRAME_LINE = '", line '
_MAX_LINENO_DIGITS = 9  # a longer number is not a line of any program (and int() would refuse)
_DIGITS_RE = re.compile(r"\d+")
# A dotted name at the start of a line; the exception line is this name alone or followed by ":".
_EXC_NAME_RE = re.compile(r"[A-Za-z_][\w.]*")


def _frames(tb: str) -> list[tuple[str, int]]:
    """(file, line) of each `  File "...", line N` line, outermost first."""
    out = []
    for ln in tb.split("\n"):
        if not ln.startswith(_FRAME_HEAD):
            continue
        end = ln.find('"', len(_FRAME_HEAD))
        if end <= len(_FRAME_HEAD) or not ln.startswith(_FRAME_LINE, end):
            continue
        digits = _DIGITS_RE.match(ln, end + len(_FRAME_LINE))
        if digits is not None and len(digits.group()) <= _MAX_LINENO_DIGITS:
            out.append((ln[len(_FRAME_HEAD):end], int(digits.group())))
    return out


def _exception_line(lines: list[str]) -> tuple[int, str, str] | None:
    """(index, dotted type, first message line) of the first line that names an exception."""
    for i, ln in enumerate(lines[1:], start=1):
        if not ln or ln.startswith((" ", "\t")):
            continue
        m = _EXC_NAME_RE.match(ln)
        if m is None:
            continue
        rest = ln[m.end():]
        if not rest:
            return i, m.group(), ""
        if rest[0] == ":":
            rest = rest[1:]
            return i, m.group(), rest[1:] if rest[:1].isspace() else rest
    return None


def _is_main(path: str) -> bool:
    return path == "main.py" or path.endswith("/main.py")


def parse_error(stderr: str, program: InstrumentedProgram | None, max_chars: int = 300
                ) -> dict | None:
    """Exception type, line (of the agent's original code), its source and the message of the
    last traceback in `stderr`; None when there is none."""
    if not isinstance(stderr, str):
        return None
    text = strip_markers(stderr)
    start = text.rfind(_TB_HEAD)
    if start < 0:
        return None
    tb = text[start:]
    lines = tb.splitlines()
    exc = _exception_line(lines)
    if exc is None:
        return None
    i, name, first = exc
    msg_lines = [first] + [ln for ln in lines[i + 1:] if ln]
    out = {"type": name.split(".")[-1], "message": "\n".join(msg_lines).strip()[:max_chars],
           "line": None, "source": None}
    frames = _frames(tb)
    if frames:
        own = [n for f, n in frames if _is_main(f)] or [
            n for f, n in frames if f == frames[0][0]]  # else the outermost frame's file
        line = own[-1]
        if program is not None:
            line = program.original_line(line)
            src = program.original.splitlines()
            out["source"] = src[line - 1].strip()[:200] if 0 < line <= len(src) else None
        out["line"] = line
    return out
