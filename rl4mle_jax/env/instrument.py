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
"""

from __future__ import annotations

import ast
import re
import secrets
from dataclasses import dataclass, field

from rl4mle_jax.env.instrument_static import MILESTONES, Placement, static_placements

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


def _line_indent(lines: list[bytes], node: ast.AST) -> bytes | None:
    prefix = lines[node.lineno - 1][: node.col_offset]
    return prefix if prefix.strip() == b"" else None


def apply_placements(source: str, placements: list[Placement], placeholder: str
                     ) -> tuple[str, tuple[int, ...]]:
    """Inserts the markers of `placements` into `source`; returns (text, inserted line numbers).

    Raises ValueError when a placement cannot be expressed (e.g. a new line where the statement
    does not start its own line).
    """
    lines = source.encode().splitlines(keepends=True)
    if lines and not lines[-1].endswith((b"\n", b"\r")):
        lines[-1] += b"\n"
    col_edits: dict[int, list[tuple[int, bytes]]] = {}
    new_lines: dict[int, list[bytes]] = {}  # after original line k (0 = before the first)

    def marks(ms):
        return "; ".join(marker_expr(placeholder, m) for m in ms).encode()

    for p in placements:
        n = p.node
        if p.kind == "after":
            col_edits.setdefault(n.end_lineno, []).append((n.end_col_offset, b"; " + marks(
                p.milestones)))
        elif p.kind == "wrap":
            col_edits.setdefault(n.lineno, []).append((n.col_offset, b"("))
            col_edits.setdefault(n.end_lineno, []).append(
                (n.end_col_offset, b", " + marks(p.milestones).replace(b"; ", b", ") + b")[0]"))
        elif p.kind in ("line_after", "before"):
            indent = _line_indent(lines, n)
            if indent is None:
                raise ValueError(f"statement at line {n.lineno} does not start its line")
            if p.kind == "before" and isinstance(n, ast.stmt) and not hasattr(n, "body"):
                col_edits.setdefault(n.lineno, []).append((n.col_offset, marks(p.milestones)
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
        for col, text in sorted(col_edits.get(i, []), key=lambda e: -e[0]):
            line = line[:col] + text + line[col:]
        out.append(line)
        emit_new(i)
    return b"".join(out).decode(), tuple(inserted)


def _compiles(text: str) -> bool:
    try:
        compile(text, "<instrumented>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


def place_markers(code: str, placements: list[Placement], placeholder: str
                  ) -> tuple[str, tuple[int, ...], list[Placement]]:
    """Applies placements, dropping any that would not compile; returns the kept ones too."""
    def attempt(ps):
        try:
            text, ins = apply_placements(code, ps, placeholder)
        except ValueError:
            return None
        return (text, ins) if _compiles(text) else None

    res = attempt(placements)
    kept = list(placements)
    if res is None:  # rare (odd layouts): keep the placements that work one by one
        kept = [p for p in placements if attempt([p]) is not None]
        res = attempt(kept)
        if res is None:
            kept, res = [], (code, ())
    return res[0], res[1], kept


def new_placeholder(code: str) -> str:
    while True:
        ph = "NONCE" + secrets.token_hex(14)[:27]
        if ph not in code:
            return ph


def instrument_static(code: str) -> InstrumentedProgram:
    """Markers inserted by syntax-tree analysis; the program is returned unchanged (method
    "none") when it does not parse."""
    from rl4mle_jax.env.instrument_static import has_training_call

    placeholder = new_placeholder(code)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return InstrumentedProgram(code, code, placeholder, (), "none")
    text, inserted, kept = place_markers(code, static_placements(tree), placeholder)
    ms = tuple(m for m in MILESTONES if any(m in p.milestones for p in kept))
    return InstrumentedProgram(code, text, placeholder, ms, "static", inserted,
                               has_training_call(tree))
