"""Environment instrumentation: milestone markers that carry a per-execution nonce.

Flow: `instrument_static(code)` (or the verified LM instrumenter in `instrument_lm`) gives an
`InstrumentedProgram` whose source contains a random placeholder where the nonce goes;
`program.render(nonce)` with `nonce = new_nonce()` gives the source to execute; afterwards
`scan_markers(stdout, nonce)` returns the milestones reached.

Threat model (what the nonce does and does not stop):
  * The policy writes its code before the nonce exists and never sees it: prompts show the
    un-instrumented code and outcomes with marker text removed (`strip_markers`). So printing
    milestone text, or any nonce the policy could have learned or guessed (128 random bits), earns
    nothing: only lines with this execution's nonce count.
  * A running program *can* read its own instrumented source (`__file__`, `sys.argv[0]`,
    `/proc/self`, frame and code objects) and copy a marker. Nothing in-process can be hidden
    from the process itself, so we bound and detect instead: `suspects_introspection` flags code
    that touches those handles (`__file__`, `sys.argv`, `main.py`, frames, code objects,
    `/proc/self`, `ctypes`, the marker tag itself); a correct nonce on a milestone that has no
    marker in the program proves a copy. Either way the program gets no milestone credit and the
    dynamic no-training check falls back to the static one. A copier that evades both can at
    most claim the milestones whose markers its own code contains; and the gain is bounded by
    design: markers only add ≤ 0.1 × 6 to a failure's −10, a valid submission's reward comes
    from the grader, and the no-training verdict also requires a static fit-like call, which no
    printing can fake. (Stronger isolation would need the sandbox to hide the program file,
    e.g. run it from a pipe; see the report.)

Host work on untrusted text is total and linear in its size: `instrument_static` never raises
(a program it cannot analyse runs unmarked, method "none", with `verification["reason"]`),
marker placement compiles the result once (and a bounded number of times more only on a rare
failure), and the patterns that read program output below cannot backtrack.
"""

from __future__ import annotations

import ast
import bisect
import re
import secrets
from dataclasses import dataclass, field

from rl4mle_jax.env.instrument_static import (
    MILESTONES,
    Placement,
    _Analysis,
    gc_paused,
    has_training_call,
    parse_program,
    static_placements,
)

MARKER_TAG = "@@MS"
_NONCE_RE = r"[0-9a-f]{32}"
_MARKER_LINE_RE = re.compile(rf"{MARKER_TAG} (\S+) ([A-Za-z_]+)")
# Once-guard keyed by milestone in sys.__dict__, so a marker in a loop prints once; written with
# os.write on fd 1 so that a shadowed `print` or a redirected sys.stdout cannot swallow it.
_MARKER_EXPR = (
    '(lambda s, m: m in s or s.add(m) or __import__("os").write(1, b"' + MARKER_TAG
    + ' {nonce} " + m.encode() + b"\\n"))'
    '(__import__("sys").__dict__.setdefault("_rl4mle_ms", set()), "{milestone}")'
)
_INTROSPECTION_RE = re.compile(
    r"__file__|_getframe|currentframe|\bf_code\b|co_consts|__code__|gi_code|cr_code|tb_frame"
    r"|f_back|f_globals|getsource|linecache|get_referrers|get_objects|/proc/self|sys\.argv"
    r"|__loader__|__spec__|__cached__|\bctypes\b|_rl4mle|main\.py|\.py[\"']|" + MARKER_TAG
)


def new_nonce() -> str:
    """A fresh 128-bit nonce for one execution."""
    return secrets.token_hex(16)


def suspects_introspection(code: str) -> bool:
    """Whether the program touches handles through which it could read its own markers."""
    return bool(_INTROSPECTION_RE.search(code))


def strip_markers(text: str) -> str:
    """Removes marker text (with any nonce) so that no nonce reaches a prompt."""
    # Linear: after the literal tag the rest always matches, consuming up to the newline, so no
    # attempt is retried and no character is read twice.
    return re.sub(rf"{MARKER_TAG}[^\n]*\n?", "", text)


@dataclass(frozen=True)
class MarkerScan:
    """Milestones found in one execution's output."""

    milestones: tuple[str, ...]  # valid markers, in order of first appearance, each once
    n_valid_lines: int
    n_forged_lines: int  # marker-like lines with a wrong nonce or unknown milestone


def scan_markers(output: str, nonce: str) -> MarkerScan:
    """Milestones whose marker carries exactly `nonce`; everything else is counted as forged."""
    if not re.fullmatch(_NONCE_RE, nonce):
        raise ValueError(f"nonce must be 32 lowercase hex characters, got {nonce!r}")
    found: list[str] = []
    valid = forged = 0
    # Linear: an attempt starts only at "@@MS " and reads the run of non-spaces after it (and
    # backs off within that run); the next attempt's run begins after a later space, so no run
    # is read by more than two attempts.
    for m in _MARKER_LINE_RE.finditer(output):
        if m.group(1) == nonce and m.group(2) in MILESTONES:
            valid += 1
            if m.group(2) not in found:
                found.append(m.group(2))
        else:
            forged += 1
    return MarkerScan(tuple(found), valid, forged)


# ---------------------------------------------------------------- programs
@dataclass(frozen=True)
class InstrumentedProgram:
    """A program with markers; `template` holds `placeholder` where the nonce goes."""

    original: str
    template: str
    placeholder: str
    milestones: tuple[str, ...]  # milestones with at least one marker
    method: str  # "static" | "lm" | "none"
    inserted_lines: tuple[int, ...] = ()  # line numbers (in the template) of whole new lines
    static_training: bool = False  # a fit-like call exists in the original
    verification: dict = field(default_factory=dict)

    def render(self, nonce: str) -> str:
        """Executable source for one run."""
        if not re.fullmatch(_NONCE_RE, nonce):
            raise ValueError(f"nonce must be 32 lowercase hex characters, got {nonce!r}")
        return self.template.replace(self.placeholder, nonce)

    def original_line(self, lineno: int) -> int:
        """Maps a line number of the executed program to the agent's original code."""
        before = sum(1 for ln in self.inserted_lines if ln < lineno)
        if lineno in self.inserted_lines:
            return max(1, lineno - before - 1)
        return lineno - before


def marker_expr(placeholder: str, milestone: str) -> str:
    if milestone not in MILESTONES:
        raise ValueError(f"unknown milestone {milestone!r}; known: {MILESTONES}")
    return _MARKER_EXPR.replace("{nonce}", placeholder).replace("{milestone}", milestone)


def _source_lines(source: str) -> list[bytes]:
    lines = source.encode().splitlines(keepends=True)
    if lines and not lines[-1].endswith((b"\n", b"\r")):
        lines[-1] += b"\n"
    return lines


def _line_indent(lines: list[bytes], node: ast.AST) -> bytes | None:
    if not 0 < node.lineno <= len(lines):
        return None
    prefix = lines[node.lineno - 1][: node.col_offset]
    return prefix if prefix.strip() == b"" else None


def _expressible(lines: list[bytes], p: Placement) -> bool:
    """Whether `apply_placements` can write `p` (new lines need a statement that starts its
    line)."""
    return p.kind in ("after", "wrap") or (
        p.kind in ("line_after", "before") and _line_indent(lines, p.node) is not None)


def apply_placements(source: str, placements: list[Placement], placeholder: str
                     ) -> tuple[str, tuple[int, ...]]:
    """Inserts the markers of `placements` into `source`; returns (text, inserted line numbers).

    Raises ValueError when a placement cannot be expressed (e.g. a new line where the statement
    does not start its own line).
    """
    return _apply(_source_lines(source), placements, placeholder)


def _apply(lines: list[bytes], placements: list[Placement], placeholder: str
           ) -> tuple[str, tuple[int, ...]]:
    # line -> [(column, rank, text)]; rank 1: a statement's suffix, which at the same column
    # goes after the suffix of a wrapped call that ends the statement (`lambda: m.fit()`)
    col_edits: dict[int, list[tuple[int, int, bytes]]] = {}
    new_lines: dict[int, list[bytes]] = {}  # after original line k (0 = before the first)

    def marks(ms):
        return "; ".join(marker_expr(placeholder, m) for m in ms).encode()

    for p in placements:
        n = p.node
        if p.kind == "after":
            col_edits.setdefault(n.end_lineno, []).append((n.end_col_offset, 1, b"; " + marks(
                p.milestones)))
        elif p.kind == "wrap":
            col_edits.setdefault(n.lineno, []).append((n.col_offset, 0, b"("))
            col_edits.setdefault(n.end_lineno, []).append(
                (n.end_col_offset, 0, b", " + marks(p.milestones).replace(b"; ", b", ") + b")[0]"))
        elif p.kind in ("line_after", "before"):
            indent = _line_indent(lines, n)
            if indent is None:
                raise ValueError(f"statement at line {n.lineno} does not start its line")
            if p.kind == "before" and isinstance(n, ast.stmt) and not hasattr(n, "body"):
                col_edits.setdefault(n.lineno, []).append((n.col_offset, 0, marks(p.milestones)
                                                           + b"; "))
            else:
                at = n.end_lineno if p.kind == "line_after" else n.lineno - 1
                new_lines.setdefault(at, []).append(indent + marks(p.milestones) + b"\n")
        else:
            raise ValueError(f"unknown placement kind {p.kind!r}")
    out: list[bytes] = []
    inserted: list[int] = []

    def emit_new(k):
        for text in new_lines.get(k, []):
            out.append(text)
            inserted.append(len(out))

    emit_new(0)
    for i, line in enumerate(lines, start=1):
        edits = col_edits.get(i)
        if edits:
            # One pass over the line, however many edits it has; at the same column and rank
            # the edit given later goes first (as if each were inserted in turn at its column).
            order = sorted(range(len(edits)), key=lambda j: (edits[j][0], edits[j][1], -j))
            pieces, at = [], 0
            for j in order:
                col, _, text = edits[j]
                pieces += [line[at:col], text]
                at = col
            line = b"".join(pieces) + line[at:]
        out.append(line)
        emit_new(i)
    return b"".join(out).decode(), tuple(inserted)


def _compile_error(text: str) -> tuple[str, int | None] | None:
    """None if `text` compiles, else (reason, line of the error if known)."""
    try:
        compile(text, "<instrumented>", "exec", dont_inherit=True)
        return None
    except SyntaxError as e:  # also errors only the compiler sees (`return` at module level)
        return "compile_error", e.lineno
    except (RecursionError, MemoryError):  # nesting within the parser's limit, not the compiler's
        return "too_deep", None
    except (ValueError, OverflowError):
        return "compile_error", None


# Markers per milestone (the first in tree order are kept): each adds ~200 bytes, so a program of
# n calls to `fit` must not become 20n bytes to compile and run.
MAX_MARKERS_PER_MILESTONE = 32
# Recompilations allowed to find placements that break an otherwise compiling program (a rare
# layout, e.g. a call inside 199 parentheses that a wrap takes to the parser's limit of 200).
_MAX_RETRIES = 4


def _future_start(tree: ast.Module | None) -> tuple[int, int]:
    """(line, column) where the last `from __future__` import starts; (0, 0) if none."""
    last = (0, 0)
    for s in tree.body if tree is not None else []:
        if isinstance(s, ast.ImportFrom) and s.module == "__future__":
            last = (s.lineno, s.col_offset)
    return last


def _insertion_point(p: Placement) -> tuple[int, int]:
    n = p.node
    return (n.lineno, n.col_offset) if p.kind in ("before", "wrap") else (
        n.end_lineno, n.end_col_offset)


def place_markers(code: str, placements: list[Placement], placeholder: str,
                  tree: ast.Module | None = None
                  ) -> tuple[str, tuple[int, ...], list[Placement]]:
    """Applies placements, dropping any that would not compile; returns the kept ones too."""
    text, inserted, kept, _ = place_markers_checked(code, placements, placeholder, tree)
    return text, inserted, kept


def place_markers_checked(code: str, placements: list[Placement], placeholder: str,
                          tree: ast.Module | None = None
                          ) -> tuple[str, tuple[int, ...], list[Placement], dict]:
    """`place_markers` plus a record: {"reason", "n_dropped"} when placements were dropped.

    Linear in the size of the program: placements that cannot work are dropped by inspection
    (no own line, before a `__future__` import, past the per-milestone cap), the result is
    compiled once, and only when that fails is the program recompiled, at most
    2 + `_MAX_RETRIES` times in all, each time without the placements at the failing line.
    reason: placements_dropped (some kept) | placement_failed (none kept) | compile_error or
    too_deep (the original itself does not compile) | encoding_error.
    """
    try:
        lines = _source_lines(code)
    except UnicodeError:
        return code, (), [], {"reason": "encoding_error", "n_dropped": len(placements)}
    future = _future_start(tree)
    count: dict[str, int] = {}
    ok = []
    for p in placements:
        if not _expressible(lines, p) or _insertion_point(p) < future:
            continue
        if all(count.get(m, 0) >= MAX_MARKERS_PER_MILESTONE for m in p.milestones):
            continue
        for m in p.milestones:
            count[m] = count.get(m, 0) + 1
        ok.append(p)

    def record(kept, reason=None):
        n_dropped = len(placements) - len(kept)
        if reason is None and n_dropped:
            reason = "placements_dropped" if kept else "placement_failed"
        return {"reason": reason, "n_dropped": n_dropped} if reason else {}

    text, inserted = _apply(lines, ok, placeholder)
    err = _compile_error(text)
    if err is None:
        return text, inserted, ok, record(ok)
    orig_err = _compile_error(code)
    if orig_err is not None:
        return code, (), [], record([], orig_err[0])
    for _ in range(_MAX_RETRIES):
        lineno = err[1]
        if lineno is None:
            break
        # the failing line of the instrumented text as a line of the original (see original_line)
        before = bisect.bisect_left(inserted, lineno)
        orig = lineno - before - (before < len(inserted) and inserted[before] == lineno)
        still = [p for p in ok if not p.node.lineno - 1 <= orig <= p.node.end_lineno + 1]
        if len(still) == len(ok):
            break
        ok = still
        text, inserted = _apply(lines, ok, placeholder)
        err = _compile_error(text)
        if err is None:
            return text, inserted, ok, record(ok)
    return code, (), [], record([], "placement_failed")


def new_placeholder(code: str) -> str:
    while True:
        ph = "NONCE" + secrets.token_hex(14)[:27]
        if ph not in code:
            return ph


def instrument_static(code: str) -> InstrumentedProgram:
    """Markers inserted by syntax-tree analysis. Total: a program that cannot be analysed
    (see `parse_program`; or it does not compile) is returned unchanged with method "none" and
    `verification["reason"]`."""
    with gc_paused():
        return _instrument_static(code)


def _instrument_static(code: str) -> InstrumentedProgram:
    placeholder = new_placeholder(code)
    tree, reason = parse_program(code)
    if tree is None:
        return InstrumentedProgram(code, code, placeholder, (), "none",
                                   verification={"reason": reason})
    an = _Analysis(tree)
    trains = has_training_call(tree, an)
    text, inserted, kept, rec = place_markers_checked(code, static_placements(tree, an),
                                                      placeholder, tree)
    if rec.get("reason") in ("compile_error", "too_deep", "encoding_error"):
        return InstrumentedProgram(code, code, placeholder, (), "none", static_training=trains,
                                   verification=rec)
    ms = tuple(m for m in MILESTONES if any(m in p.milestones for p in kept))
    return InstrumentedProgram(code, text, placeholder, ms, "static", inserted, trains,
                               verification=rec)
