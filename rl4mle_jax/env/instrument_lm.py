"""LM instrumenter (the paper's method) with verification, and the `Instrumenter` facade.

The frozen model is asked to return the program with `print("@@MILESTONE <name>")` lines
inserted and nothing else changed. Its answer is accepted only if the syntax tree, with those
prints removed, equals the original's (`ast.dump` without positions). The model never sees a
nonce: from an accepted answer we keep only *where* each print went and place our own nonce
markers into the original text at those spots, so the executed program is the agent's code
byte for byte plus markers. Rejected answers fall back to the static instrumenter.

Realigned answers (`realign=True`): a small frozen copy often copies the program with one or two
statements rewritten (its favourite model or imputer in place of the agent's) and every marker
where it belongs. Such an answer's statements are aligned to the original's (difflib over each
statement's own tree, nested bodies left out: equal runs, and replaced runs of equal length and
statement types, pair up); each marker goes where its anchor statement's partner is in the
original, markers whose anchor has no partner are dropped, and an answer pairing fewer than
`MIN_ALIGNED_SHARE` of the original's statements is rejected as before. What runs is still the
agent's code plus our markers; only where the model put them is taken from its answer.

Both texts are untrusted (the program is the policy's, the answer a model's), so verification is
total and linear: parser failures are named reasons, trees are compared and paired with explicit
stacks (never `ast.dump` or recursion, whose depth the text chooses), and a marker's text is
matched with string methods.
"""

from __future__ import annotations

import ast
import difflib
import threading
from collections import Counter
from collections.abc import Callable

from rl4mle_jax.env.actions import extract_code_block
from rl4mle_jax.env.instrument import (
    InstrumentedProgram,
    instrument_static,
    new_placeholder,
    place_markers_checked,
)
from rl4mle_jax.env.instrument_static import (
    MAX_PROGRAM_CHARS,
    MILESTONES,
    Placement,
    gc_paused,
    has_training_call,
    parse_program,
)

LM_MARKER = "@@MILESTONE"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_ ")
# An answer is the program plus print lines (~40 bytes each); anything much longer is not one.
MAX_RESPONSE_CHARS = 4 * MAX_PROGRAM_CHARS
_MILESTONE_HELP = {
    "libraries_imported": "after the imports",
    "data_loaded": "after the input data is read",
    "model_defined": "after the model is created",
    "model_trained": "after the model is trained (fit)",
    "predictions_made": "after the predictions are computed",
    "submission_written": "after ./submission/submission.csv is written",
}
# Realignment: an answer pairing fewer of the original's statements than this share is another
# program; alignment is skipped (the answer rejected) past this many statements on either side
# (difflib's matching is quadratic in the worst case, and the program is untrusted).
MIN_ALIGNED_SHARE = 0.5
MAX_ALIGNED_STATEMENTS = 1000
_BODIES = (ast.stmt, ast.excepthandler, ast.match_case)  # list items that hold statements
_SIMPLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom,
           ast.Delete, ast.Assert, ast.Pass, ast.Global, ast.Nonlocal, ast.Return, ast.Raise,
           ast.Break, ast.Continue)


def lm_instrument_prompt(code: str) -> str:
    """The instruction given to the frozen model."""
    steps = "\n".join(f'- {m}: {h}' for m, h in _MILESTONE_HELP.items())
    return (
        "Insert progress prints into the Python program below without changing anything else.\n"
        f'Right after the statement where each step first happens, add a line\n'
        f'print("{LM_MARKER} <step>") with the step name, for these steps:\n{steps}\n'
        "Do not change, remove, reorder or add any other code. Reply with the complete program "
        "in one ```python block.\n\n```python\n" + code.rstrip("\n") + "\n```\n"
    )


def _marker_milestone(stmt: ast.stmt) -> str | None:
    """The milestone of an inserted `print("@@MILESTONE name")` statement, else None."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    if not (isinstance(call.func, ast.Name) and call.func.id == "print" and len(call.args) == 1
            and all(kw.arg == "flush" for kw in call.keywords)):
        return None
    arg = call.args[0]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    return _lm_marker_name(arg.value)


def _lm_marker_name(text: str) -> str | None:
    """`"@@MILESTONE[:] <name>"` (whitespace around allowed) -> the milestone, else None."""
    text = text.strip()
    if not text.startswith(LM_MARKER):
        return None
    rest = text[len(LM_MARKER):].removeprefix(":")
    body = rest.lstrip()
    if not rest[:1].isspace() or not body or not set(body) <= _NAME_CHARS:
        return None
    name = body.lower().replace(" ", "_")
    return name if name in MILESTONES else None


def _strip_markers(tree: ast.AST) -> list[tuple[ast.AST, str, int, str]]:
    """Removes marker prints in place; returns (parent, field, index after removal, milestone)."""
    removed = []
    for node in list(ast.walk(tree)):
        for fname, value in ast.iter_fields(node):
            if not (isinstance(value, list) and value and isinstance(value[0], ast.stmt)):
                continue
            kept = []
            for stmt in value:
                ms = _marker_milestone(stmt)
                if ms is None:
                    kept.append(stmt)
                else:
                    removed.append((node, fname, len(kept), ms))
            setattr(node, fname, kept)
    return removed


def _same_tree(a: object, b: object) -> bool:
    """Whether two trees are equal without positions (what `ast.dump` compares), iteratively."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):  # also tells 1 from 1.0 and True
            return False
        if isinstance(x, ast.AST):
            stack.extend((getattr(x, f, None), getattr(y, f, None)) for f in x._fields)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif x != y:
            return False
    return True


def _pair(a: ast.AST, b: ast.AST) -> dict[int, ast.AST]:
    """id of each node of `a` -> the node at the same place in the equal tree `b`."""
    out, stack = {}, [(a, b)]
    while stack:
        x, y = stack.pop()
        out[id(x)] = y
        for (_, vx), (_, vy) in zip(ast.iter_fields(x), ast.iter_fields(y)):
            if isinstance(vx, ast.AST):
                stack.append((vx, vy))
            elif isinstance(vx, list):
                stack.extend((p, q) for p, q in zip(vx, vy) if isinstance(p, ast.AST))
    return out


def _statements(tree: ast.AST) -> list[ast.stmt]:
    """Every statement of the tree in source order (pre-order), iteratively."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.stmt):
            out.append(node)
        children = [v for _, value in ast.iter_fields(node) if isinstance(value, list)
                    for v in value if isinstance(v, _BODIES)]
        stack.extend(reversed(children))
    return out


def _signature(stmt: ast.stmt) -> tuple:
    """The statement's own tree (its nested bodies left out) as a flat tuple, without
    positions; iterative (the text chooses the depth)."""
    tokens, stack = [], [stmt]
    while stack:
        x = stack.pop()
        if isinstance(x, ast.AST):
            tokens.append(type(x).__name__)
            for f in reversed(x._fields):
                v = getattr(x, f, None)
                if not (isinstance(v, list) and v and isinstance(v[0], _BODIES)):
                    stack.append(v)
        elif isinstance(x, list):
            tokens.append(("list", len(x)))
            stack.extend(reversed(x))
        else:
            tokens.append((type(x).__name__, x))
    return tuple(tokens)


def _realigned_placements(lm_tree: ast.Module, orig_tree: ast.Module,
                          removed: list[tuple[ast.AST, str, int, str]]
                          ) -> tuple[list[Placement], dict] | None:
    """The markers of an answer that differs from the original, placed by aligning statements
    (module docstring), and {n_unaligned, aligned_share}; None when it is another program."""
    lm_st, orig_st = _statements(lm_tree), _statements(orig_tree)
    if not orig_st or max(len(lm_st), len(orig_st)) > MAX_ALIGNED_STATEMENTS:
        return None
    matcher = difflib.SequenceMatcher(None, [_signature(x) for x in lm_st],
                                      [_signature(x) for x in orig_st], autojunk=False)
    partner, aligned = {}, 0
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            aligned += i2 - i1
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for a, b in zip(lm_st[i1:i2], orig_st[j1:j2]):
                if type(a) is type(b):
                    partner[id(a)] = b
    share = aligned / len(orig_st)
    if share < MIN_ALIGNED_SHARE:
        return None
    placements, unaligned = _placements(removed, partner)
    return placements, {"n_unaligned": unaligned, "aligned_share": round(share, 4)}


def _placements(removed: list[tuple[ast.AST, str, int, str]], partner: dict[int, ast.AST]
                ) -> tuple[list[Placement], int]:
    """Each removed marker's placement in the original: after its anchor's partner (the
    statement before it in the answer's body), or before the partner of the body's first
    statement; and how many had no anchor or no partner (dropped)."""
    placements, unaligned = [], 0
    for parent, fname, idx, ms in removed:
        body = getattr(parent, fname)  # the answer's body, markers removed
        anchor = body[idx - 1] if idx > 0 else body[0] if body else None
        target = partner.get(id(anchor))
        if target is None:  # (an empty program has no statement to put a marker next to)
            unaligned += 1
        elif idx == 0:
            placements.append(Placement("before", target, (ms,)))
        else:
            kind = "after" if isinstance(target, _SIMPLE) else "line_after"
            placements.append(Placement(kind, target, (ms,)))
    return placements, unaligned


def _first_difference(a: ast.Module, b: ast.Module) -> str:
    for i, (x, y) in enumerate(zip(a.body, b.body)):
        if not _same_tree(x, y):
            return f"top-level statement {i + 1} differs (original line {y.lineno})"
    return f"{len(a.body)} top-level statements vs {len(b.body)} in the original"


def verify_lm_instrumentation(code: str, response: str, realign: bool = False
                              ) -> tuple[InstrumentedProgram | None, dict]:
    """Accepts the model's answer only if it is the original plus marker prints, or with
    `realign`, if its statements align with the original's (module docstring).

    Returns (program with our nonce markers at the model's spots, or None; a record with
    accepted, reason, detail, n_markers; a realigned answer also realigned=True, mismatch (the
    first difference), n_unaligned, aligned_share). Total: reasons are no_code, too_large,
    syntax_error, encoding_error, too_deep (of either text: `detail` says which), ast_mismatch,
    no_markers, placement_failed.
    """
    with gc_paused():
        return _verify(code, response, realign)


def _verify(code: str, response: str, realign: bool = False
            ) -> tuple[InstrumentedProgram | None, dict]:
    rec = {"method": "lm", "accepted": False, "reason": None, "detail": "", "n_markers": 0}
    if not isinstance(response, str) or len(response) > MAX_RESPONSE_CHARS:
        rec.update(reason="too_large" if isinstance(response, str) else "no_code",
                   detail="the instrumenter's answer is not a program-sized text")
        return None, rec
    try:
        lm_code = extract_code_block(response)
    except (RecursionError, MemoryError):  # a bare answer too deep to compile
        rec.update(reason="too_deep", detail="the instrumenter's answer nests too deeply")
        return None, rec
    if lm_code is None:
        rec.update(reason="no_code", detail="no code in the instrumenter's answer")
        return None, rec
    orig_tree, why = parse_program(code)
    if orig_tree is None:
        rec.update(reason=why, detail=f"the original program: {why}")
        return None, rec
    lm_tree, why = parse_program(lm_code, MAX_RESPONSE_CHARS)  # the program plus prints
    if lm_tree is None:
        detail = f"the instrumenter's answer: {why}"
        if why == "syntax_error":
            try:
                ast.parse(lm_code)
            except SyntaxError as e:  # shallow: the parse just failed on it the same way
                detail = f"line {e.lineno}: {e.msg}"
            except Exception:  # noqa: BLE001 - only the detail text is at stake
                pass
        rec.update(reason=why, detail=detail)
        return None, rec
    removed = _strip_markers(lm_tree)
    rec["n_markers"] = len(removed)
    if not _same_tree(lm_tree, orig_tree):
        mismatch = _first_difference(lm_tree, orig_tree)
        realigned = (_realigned_placements(lm_tree, orig_tree, removed)
                     if realign and removed else None)
        if not realigned or not realigned[0]:
            rec.update(reason="ast_mismatch", detail=mismatch)
            return None, rec
        placements = realigned[0]
        rec.update(realigned=True, mismatch=mismatch, **realigned[1])
    elif not removed:
        rec.update(reason="no_markers", detail="no milestone print was inserted")
        return None, rec
    else:  # equal trees: every statement of the answer pairs with its twin in the original
        placements, _ = _placements(removed, _pair(lm_tree, orig_tree))
    placeholder = new_placeholder(code)
    text, inserted, kept, placed = place_markers_checked(code, placements, placeholder,
                                                         orig_tree)
    if not kept:
        rec.update(reason="placement_failed",
                   detail=f"no marker could be placed ({placed.get('reason')})")
        return None, rec
    rec.update(accepted=True, n_placed=len(kept))
    if placed.get("reason"):
        rec["placement"] = placed
    milestones = tuple(m for m in MILESTONES if any(m in p.milestones for p in kept))
    return InstrumentedProgram(code, text, placeholder, milestones, "lm", inserted,
                               has_training_call(orig_tree), rec), rec

# "lm": the frozen copy inserts the prints (verified, static fallback); "static": AST analysis;
# "none": no markers.
INSTRUMENT_MODES = ("static", "lm", "none")


class NoGenerateError(ValueError):
    """A synchronous "lm" instrumentation without a `generate` callable: a set-up error."""


class Instrumenter:
    """Chooses the instrumentation method and counts LM acceptances/rejections (thread-safe).

    mode: "static" (AST analysis), "lm" (frozen model, verified, static fallback) or "none" (no
    markers). In "lm" mode the answer comes either from `generate` (used by `__call__`) or from
    a caller that samples it elsewhere and passes it to `from_lm_response` (the RL loop batches
    it through the frozen copy's generation service, so needs no `generate`). `generate` must
    be bound to the frozen model, never the policy. `chat_template` renders
    [{"role", "content"}] messages into the model's prompt string.
    """

    def __init__(self, mode: str = "static", generate: Callable[[str], str] | None = None,
                 chat_template: Callable[[list[dict]], str] | None = None,
                 realign: bool = False):
        if mode not in INSTRUMENT_MODES:
            raise ValueError(f"instrumentation mode must be {'|'.join(INSTRUMENT_MODES)}, got "
                             f"{mode!r}")
        self.mode, self.generate, self.chat_template = mode, generate, chat_template
        self.realign = realign  # verify_lm_instrumentation's
        self.stats: Counter = Counter()
        self._lock = threading.Lock()

    def prompt(self, code: str) -> str:
        text = lm_instrument_prompt(code)
        if self.chat_template is None:
            return text
        return self.chat_template([{"role": "user", "content": text}])

    def __call__(self, code: str) -> InstrumentedProgram:
        """The instrumented program; never raises for any program (failures are
        `verification["reason"]`), only NoGenerateError for "lm" without `generate`."""
        if self.mode == "none":  # no markers; the static training check still applies
            with gc_paused():
                tree, why = parse_program(code)
                trains = tree is not None and has_training_call(tree)
            return InstrumentedProgram(code, code, new_placeholder(code), (), "none",
                                       static_training=trains,
                                       verification={"reason": why} if why else {})
        if self.mode == "static":
            self._count("static")
            return instrument_static(code)
        if self.generate is None:
            raise NoGenerateError(
                "Instrumenter('lm') was built without generate: pass generate=(prompt -> text "
                "of the frozen model), or sample the answer elsewhere and call "
                "from_lm_response(code, answer)")
        try:
            response = self.generate(self.prompt(code))
        except Exception as e:  # noqa: BLE001 - the frozen model failing must not end the episode
            return self.reject(code, "generate_error", type(e).__name__)
        return self.from_lm_response(code, response)

    def from_lm_response(self, code: str, response: str) -> InstrumentedProgram:
        """Verifies an LM answer (e.g. sampled in a batch elsewhere); falls back to static."""
        prog, rec = verify_lm_instrumentation(code, response, self.realign)
        if prog is not None:
            self._count("lm_accepted")
            if rec.get("realigned"):
                self._count("lm_realigned")
            return prog
        return self._fallback(code, rec)

    def reject(self, code: str, reason: str, detail: str = "") -> InstrumentedProgram:
        """No usable LM answer (e.g. the frozen copy timed out): count it, fall back to static."""
        return self._fallback(code, {"method": "lm", "accepted": False, "reason": reason,
                                     "detail": detail, "n_markers": 0})

    def _fallback(self, code: str, rec: dict) -> InstrumentedProgram:
        self._count("lm_rejected")
        self._count(f"lm_rejected_{rec['reason']}")
        fallback = instrument_static(code)
        rec["fallback"] = "static"
        if fallback.verification.get("reason"):
            rec["fallback_reason"] = fallback.verification["reason"]
        return InstrumentedProgram(fallback.original, fallback.template, fallback.placeholder,
                                   fallback.milestones, "static_fallback",
                                   fallback.inserted_lines, fallback.static_training, rec)

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def metrics(self) -> dict[str, float]:
        """Counters plus the LM acceptance rate."""
        with self._lock:
            out = {f"instrument/{k}": float(v) for k, v in self.stats.items()}
            n = self.stats["lm_accepted"] + self.stats["lm_rejected"]
            if n:
                out["instrument/lm_accept_rate"] = self.stats["lm_accepted"] / n
        return out
