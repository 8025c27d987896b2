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
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

MILESTONES: tuple[str, ...] = (
    "libraries_imported",
    "data_loaded",
    "model_defined",
    "model_trained",
    "predictions_made",
    "submission_written",
)

# ---------------------------------------------------------------- what counts as an event
_READ_FUNCS = {
    "read_csv", "read_table", "read_parquet", "read_json", "read_excel", "read_feather",
    "read_pickle", "read_fwf", "read_hdf", "read_text", "read_bytes", "load", "loadtxt",
    "genfromtxt", "fromfile", "imread", "load_dataset", "load_img", "scan_csv",
}
_MODEL_NAME_RE = re.compile(
    r"(Classifier|Regressor|Regression|Model|Estimator|Pipeline|SVC|SVR|NB|Forest|Booster"
    r"|Ridge|RidgeCV|Lasso|LassoCV|ElasticNet|ElasticNetCV|Perceptron|Neighbors|GBM|Net"
    r"|Network|SearchCV|LogisticRegressionCV|KMeans|Sequential|Boost)$"
)
_MODEL_FUNCS = {"make_pipeline", "Pipeline", "Sequential", "LGBMClassifier", "XGBClassifier"}
# fit on these learns preprocessing, not a model: it does not count as training.
_TRANSFORMER_RE = re.compile(
    r"(Scaler|Vectorizer|Encoder|Imputer|Transformer|PCA|SVD|Binarizer|Normalizer|Tokenizer"
    r"|Selector|SelectKBest|Discretizer|PolynomialFeatures|Split|Fold|Hasher|Embedding)$"
)
_FIT_METHODS = {"fit", "fit_transform", "fit_predict", "partial_fit", "fit_generator",
                "train_on_batch", "train"}
_TRAIN_FUNCS = {"lstsq", "polyfit", "curve_fit", "minimize", "cross_val_predict", "train"}
_TORCH_STEP = {("backward", 0), ("step", 0)}
_PREDICT_METHODS = {"predict", "predict_proba", "predict_log_proba", "decision_function",
                    "inplace_predict"}
_WRITE_METHODS = {"to_csv", "savetxt", "write_csv", "to_parquet"}


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


def _mentions_submission(call: ast.Call) -> bool:
    parts = [call.func.value] if isinstance(call.func, ast.Attribute) else []
    parts += list(call.args) + [kw.value for kw in call.keywords]
    return any("submission" in ast.unparse(p).lower() for p in parts)


class _Analysis:
    """Names bound to constructor calls, user-defined model classes, and whether writers name
    the submission (used to decide which writes count)."""

    def __init__(self, tree: ast.Module):
        self.ctor_of: dict[str, str] = {}
        self.model_classes: set[str] = set()
        self.any_write_names_submission = False
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = " ".join(ast.unparse(b) for b in node.bases)
                if re.search(r"Module|Estimator|Model|Classifier|Regressor", bases):
                    self.model_classes.add(node.name)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.ctor_of[t.id] = call_name(node.value)
            elif isinstance(node, ast.Call) and call_name(node) in _WRITE_METHODS:
                self.any_write_names_submission |= _mentions_submission(node)

    def is_model_ctor(self, name: str) -> bool:
        return bool(_MODEL_NAME_RE.search(name)) or name in _MODEL_FUNCS or (
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
            if recv is None or not _TRANSFORMER_RE.search(recv):
                if name == "train" and "model_defined" not in out:
                    out.append("model_defined")  # lgb.train / xgb.train build the model
                out.append("model_trained")
        if _is_method(call) and name in _PREDICT_METHODS:
            out.append("predictions_made")
        if name in _WRITE_METHODS and (
                _mentions_submission(call) or not self.any_write_names_submission):
            out.append("submission_written")
        return out


def has_training_call(tree: ast.Module) -> bool:
    """Whether any call in the program trains a model (the static half of the no-training test)."""
    an = _Analysis(tree)
    return any("model_trained" in an.events(n) for n in ast.walk(tree) if isinstance(n, ast.Call))


# ---------------------------------------------------------------- placements
@dataclass(frozen=True)
class Placement:
    """Where a marker goes. kind: "after" (append to a simple statement), "wrap" (a call),
    "line_after" (new line after a compound statement), "before" (prefix of a statement)."""

    kind: str
    node: ast.AST
    milestones: tuple[str, ...]


_SIMPLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom,
           ast.Delete, ast.Assert, ast.Pass, ast.Global, ast.Nonlocal)
_LAZY = (ast.Lambda, ast.GeneratorExp)


def _calls_in(node: ast.AST, lazy: bool):
    """Calls in `node` not nested in another statement; `lazy` marks those under a lambda or
    generator expression (not run when the statement runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt) or isinstance(child, ast.JoinedStr):
            continue  # nested statements are visited on their own; f-string offsets are unsafe
        child_lazy = lazy or isinstance(child, _LAZY)
        if isinstance(child, ast.Call):
            yield child, child_lazy
        yield from _calls_in(child, child_lazy)


def _header_calls(stmt: ast.stmt):
    """Calls in a compound statement's header (test, iterator, context managers, decorators)."""
    for field, value in ast.iter_fields(stmt):
        if field in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, ast.AST):
                if isinstance(v, ast.Call):
                    yield v, False
                yield from _calls_in(v, isinstance(v, _LAZY))


def static_placements(tree: ast.Module) -> list[Placement]:
    """Marker placements for every milestone event found in the program."""
    an = _Analysis(tree)
    out: list[Placement] = []
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    if not imports:
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)][:1]
    if imports:
        out.append(Placement("after", imports[-1], ("libraries_imported",)))
    for stmt in ast.walk(tree):
        if not isinstance(stmt, ast.stmt):
            continue
        simple = isinstance(stmt, _SIMPLE)
        calls = _calls_in(stmt, False) if simple or not hasattr(stmt, "body") else (
            _header_calls(stmt))
        after: list[str] = []
        for call, lazy in calls:
            ev = tuple(e for e in an.events(call) if e not in after)
            if not ev:
                continue
            if simple and not lazy:
                after.extend(ev)
            else:
                out.append(Placement("wrap", call, ev))
        if after:
            out.append(Placement("after", stmt, tuple(after)))
    return out
