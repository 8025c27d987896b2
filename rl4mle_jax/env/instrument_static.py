"""Static instrumenter: finds milestone events in a program's syntax tree and places markers.

A marker is placed without moving any original line where possible, so that tracebacks of the
instrumented program point at the same line numbers as the agent's own code:
  * after a simple statement: `stmt; MARKER` appended at the statement's end on its last line;
  * inside a `return`/`raise`, a compound statement's header, a lambda or a generator
    expression: the call itself is wrapped, `(call, MARKER)[0]`, which evaluates to the call's
    value and runs the marker right after it;
  * after a compound statement or before a compound first statement (only needed for LM
    placements): a new line at the statement's indentation; such lines are recorded so line
    numbers can be mapped back.
Edits are applied on UTF-8 bytes because `ast` column offsets count bytes.

Program text is untrusted, so every step here is total and linear in its size: `parse_program`
turns every parser failure into a named reason, and the analysis walks the tree iteratively
(`ast.walk`, explicit stacks; never `ast.unparse` or recursion on the tree, whose depth the
program chooses) and matches names with suffix tests instead of regexes.
"""

from __future__ import annotations

import ast
import contextlib
import gc
from dataclasses import dataclass

MILESTONES: tuple[str, ...] = (
    "libraries_imported",
    "data_loaded",
    "model_defined",
    "model_trained",
    "predictions_made",
    "submission_written",
)
# Larger programs are not instrumented (reason "too_large"): the output cap is 256 KiB per
# stream, and no program the policy writes comes near it.
MAX_PROGRAM_CHARS = 256 * 1024

# ---------------------------------------------------------------- what counts as an event
_READ_FUNCS = {
    "read_csv", "read_table", "read_parquet", "read_json", "read_excel", "read_feather",
    "read_pickle", "read_fwf", "read_hdf", "read_text", "read_bytes", "load", "loadtxt",
    "genfromtxt", "fromfile", "imread", "load_dataset", "load_img", "scan_csv",
}
_MODEL_SUFFIXES = (
    "Classifier", "Regressor", "Regression", "Model", "Estimator", "Pipeline", "SVC", "SVR", "NB",
    "Forest", "Booster", "Ridge", "RidgeCV", "Lasso", "LassoCV", "ElasticNet", "ElasticNetCV",
    "Perceptron", "Neighbors", "GBM", "Net", "Network", "SearchCV", "LogisticRegressionCV",
    "KMeans", "Sequential", "Boost",
)
_MODEL_FUNCS = {"make_pipeline", "Pipeline", "Sequential", "LGBMClassifier", "XGBClassifier"}
# A class deriving from a base whose text contains one of these defines a model.
_MODEL_BASE_WORDS = ("Module", "Estimator", "Model", "Classifier", "Regressor")
# fit on these learns preprocessing, not a model: it does not count as training.
_TRANSFORMER_SUFFIXES = (
    "Scaler", "Vectorizer", "Encoder", "Imputer", "Transformer", "PCA", "SVD", "Binarizer",
    "Normalizer", "Tokenizer", "Selector", "SelectKBest", "Discretizer", "PolynomialFeatures",
    "Split", "Fold", "Hasher", "Embedding",
)
_FIT_METHODS = {"fit", "fit_transform", "fit_predict", "partial_fit", "fit_generator",
                "train_on_batch", "train"}
_TRAIN_FUNCS = {"lstsq", "polyfit", "curve_fit", "minimize", "cross_val_predict", "train"}
_TORCH_STEP = {("backward", 0), ("step", 0)}
_PREDICT_METHODS = {"predict", "predict_proba", "predict_log_proba", "decision_function",
                    "inplace_predict"}
_WRITE_METHODS = {"to_csv", "savetxt", "write_csv", "to_parquet"}


@contextlib.contextmanager
def gc_paused():
    """Pauses the cyclic garbage collector: a syntax tree has no cycles, and the collections that
    its own allocations trigger traverse every live object (at 256 KB they made parsing ~2x
    slower and super-linear). Re-enabled by whichever caller had it enabled."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_program(code: str, max_chars: int = MAX_PROGRAM_CHARS
                  ) -> tuple[ast.Module | None, str | None]:
    """The syntax tree, or None and why: too_large | syntax_error | encoding_error | too_deep."""
    if not isinstance(code, str):
        return None, "not_text"
    if len(code) > max_chars:
        return None, "too_large"
    try:
        return ast.parse(code), None
    except UnicodeError:  # lone surrogates: not encodable as UTF-8 (a ValueError subclass)
        return None, "encoding_error"
    except (SyntaxError, ValueError):  # ValueError: NUL bytes on older Pythons
        return None, "syntax_error"
    except (RecursionError, MemoryError):  # nesting past the parser's own stack
        return None, "too_deep"


def call_name(call: ast.Call) -> str:
    """The called name: `pd.read_csv(...)` -> "read_csv", `open(...)` -> "open"."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return ""


def _is_method(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute)


def _open_mode(call: ast.Call) -> str:
    mode = call.args[1] if len(call.args) > 1 else None
    for kw in call.keywords:
        if kw.arg == "mode":
            mode = kw.value
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return mode.value
    return "r" if mode is None else "?"


def _own_texts(node: ast.AST):
    """The identifiers and string constants of `node` itself (not of its children): the words
    that `ast.unparse` would print for it."""
    for name in node._fields:
        v = getattr(node, name, None)
        if isinstance(v, str):
            yield v
        elif isinstance(v, bytes):
            yield v.decode("latin-1")
        elif isinstance(v, list):
            yield from (x for x in v if isinstance(x, str))  # Global/Nonlocal names


_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_SIMPLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom,
           ast.Delete, ast.Assert, ast.Pass, ast.Global, ast.Nonlocal)
_LAZY = (ast.Lambda, ast.GeneratorExp)
# Field-less leaves (Load, Add, ...): shared objects that carry nothing the analysis needs.
_LEAVES = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)


def _names_submission(node: ast.AST) -> bool:
    """Whether an expression node's own text (a name, attribute, keyword or string) contains
    "submission" in any case, as `ast.unparse` would print it."""
    if isinstance(node, ast.Constant):
        v = node.value
        return isinstance(v, str | bytes) and (b"submission" if isinstance(v, bytes) else
                                               "submission") in v.lower()
    t = node.id if isinstance(node, ast.Name) else node.attr if isinstance(
        node, ast.Attribute) else node.arg if isinstance(node, ast.keyword | ast.arg) else None
    return t is not None and "submission" in t.lower()


class _Analysis:
    """One pass over the tree: names bound to constructor calls, user-defined model classes,
    whether writers name the submission (to decide which writes count), and, for each
    statement, the calls it runs itself.

    The pass is depth first in source order with an explicit stack (the depth is the
    program's). A statement's own calls are those in its expressions (for a compound
    statement: in its header, i.e. test, iterator, context managers, decorators), not in a
    nested statement or an f-string (whose offsets are unsafe to edit); `lazy` marks calls under
    a lambda or a generator expression, which do not run when the statement runs. Statements
    are listed breadth first (the order `ast.walk` gives), which decides which assignment of a
    name counts (the last) and the order of placements.
    """

    def __init__(self, tree: ast.Module):
        self.ctor_of: dict[str, str] = {}
        self.model_classes: set[str] = set()
        self.calls: list[ast.Call] = []  # every call, including those no statement runs itself
        self.own_calls: dict[int, list[tuple[ast.Call, bool]]] = {}  # id(stmt) -> (call, lazy)
        by_depth: list[list[ast.stmt]] = []
        writes: list[ast.Call] = []
        order: list[ast.AST] = []  # pre-order: every node after its parent
        parent: list[int] = []  # index in `order` of each node's parent
        named: list[int] = []  # nodes whose own text contains "submission"
        # (node, parent index, statement whose own calls it belongs to or None, lazy, depth)
        stack: list[tuple] = [(tree, -1, None, False, 0)]
        while stack:
            node, par, owner, lazy, depth = stack.pop()
            i = len(order)
            order.append(node)
            parent.append(par)
            is_stmt = isinstance(node, ast.stmt)
            if is_stmt:
                while len(by_depth) <= depth:
                    by_depth.append([])
                by_depth[depth].append(node)
                owner, lazy = node, False
                self.own_calls[id(node)] = []
                whole = isinstance(node, _SIMPLE) or not hasattr(node, "body")
                if isinstance(node, ast.ClassDef) and self._derives_from_model(node):
                    self.model_classes.add(node.name)
            elif isinstance(node, ast.Call):
                self.calls.append(node)
                if owner is not None:
                    self.own_calls[id(owner)].append((node, lazy))
                if call_name(node) in _WRITE_METHODS:
                    writes.append(node)
            elif isinstance(node, ast.JoinedStr):
                owner = None
            elif _names_submission(node):
                named.append(i)
            for f in reversed(node._fields):
                v = getattr(node, f, None)
                c_owner = owner if not is_stmt or whole or f not in _BODY_FIELDS else None
                for c in reversed(v) if isinstance(v, list) else (v,):
                    if isinstance(c, ast.AST) and not isinstance(c, _LEAVES):
                        stack.append((c, i, c_owner, lazy or isinstance(c, _LAZY), depth + 1))
        self.statements = [s for level in by_depth for s in level]  # breadth first
        for s in self.statements:
            if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call):
                for t in s.targets:
                    if isinstance(t, ast.Name):
                        self.ctor_of[t.id] = call_name(s.value)
        # a subtree names the submission when one of its nodes does: mark the ancestors
        mentions = [False] * len(order)
        for i in named:
            while i >= 0 and not mentions[i]:
                mentions[i] = True
                i = parent[i]
        self._mentions = {id(order[i]) for i, m in enumerate(mentions) if m}
        self.any_write_names_submission = any(self.mentions_submission(c) for c in writes)

    @staticmethod
    def _derives_from_model(node: ast.ClassDef) -> bool:
        return any(w in t for b in node.bases for n in ast.walk(b) for t in _own_texts(n)
                   for w in _MODEL_BASE_WORDS)

    def mentions_submission(self, call: ast.Call) -> bool:
        """Whether the receiver or an argument of `call` names the submission."""
        parts = [call.func.value] if isinstance(call.func, ast.Attribute) else []
        parts += list(call.args) + [kw.value for kw in call.keywords]
        return any(id(p) in self._mentions for p in parts)

    def is_model_ctor(self, name: str) -> bool:
        return name.endswith(_MODEL_SUFFIXES) or name in _MODEL_FUNCS or (
            name in self.model_classes)

    def receiver_ctor(self, call: ast.Call) -> str | None:
        recv = call.func.value if isinstance(call.func, ast.Attribute) else None
        if isinstance(recv, ast.Call):
            return call_name(recv)
        if isinstance(recv, ast.Name):
            return self.ctor_of.get(recv.id)
        return None

    def events(self, call: ast.Call) -> list[str]:
        """Milestones that this call achieves once it has run."""
        name, out = call_name(call), []
        if name in _READ_FUNCS or (name == "open" and _open_mode(call).startswith("r")):
            out.append("data_loaded")
        if self.is_model_ctor(name):
            out.append("model_defined")
        trains = (_is_method(call) and name in _FIT_METHODS) or name in _TRAIN_FUNCS or (
            _is_method(call) and (name, len(call.args)) in _TORCH_STEP)
        if trains:
            recv = self.receiver_ctor(call)
            if recv is None or not recv.endswith(_TRANSFORMER_SUFFIXES):
                if name == "train" and "model_defined" not in out:
                    out.append("model_defined")  # lgb.train / xgb.train build the model
                out.append("model_trained")
        if _is_method(call) and name in _PREDICT_METHODS:
            out.append("predictions_made")
        if name in _WRITE_METHODS and (
                self.mentions_submission(call) or not self.any_write_names_submission):
            out.append("submission_written")
        return out


def has_training_call(tree: ast.Module, analysis: _Analysis | None = None) -> bool:
    """Whether any call in the program trains a model (the static half of the no-training test)."""
    an = analysis or _Analysis(tree)
    return any("model_trained" in an.events(n) for n in an.calls)


# ---------------------------------------------------------------- placements
@dataclass(frozen=True)
class Placement:
    """Where a marker goes. kind: "after" (append to a simple statement), "wrap" (a call),
    "line_after" (new line after a compound statement), "before" (prefix of a statement)."""

    kind: str
    node: ast.AST
    milestones: tuple[str, ...]


def static_placements(tree: ast.Module, analysis: _Analysis | None = None) -> list[Placement]:
    """Marker placements for every milestone event found in the program."""
    an = analysis or _Analysis(tree)
    out: list[Placement] = []
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    if not imports:  # the first one, breadth first
        imports = [s for s in an.statements if isinstance(s, ast.Import | ast.ImportFrom)][:1]
    if imports:
        out.append(Placement("after", imports[-1], ("libraries_imported",)))
    for stmt in an.statements:
        simple = isinstance(stmt, _SIMPLE)
        after: list[str] = []
        for call, lazy in an.own_calls[id(stmt)]:
            ev = tuple(e for e in an.events(call) if e not in after)
            if not ev:
                continue
            if simple and not lazy:
                after.extend(ev)
            else:
                out.append(Placement("wrap", call, ev))
        if after:
            # Calls come outermost first (`Ridge().fit(X, y)`: fit before Ridge), but all the
            # markers run at the statement's end, so emit them in milestone order.
            out.append(Placement("after", stmt, tuple(sorted(after, key=MILESTONES.index))))
    return out
