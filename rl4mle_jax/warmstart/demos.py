"""Demonstration programs for the warm start: varied, real solutions for any local task.

A demo is what an agent would write: read `./input/{train,test,sample_submission}.csv`, build
features, fit a scikit-learn model, write `./submission/submission.csv`. The generator reads the
task's metric and the public files (columns, dtypes, labels) and composes programs from a
family (linear, forests, boosting, kNN, naive Bayes, ...), a feature treatment and
hyper-parameters. Running them (`warmstart.demo_runs`) gives each its real outcome. No jax here.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

DEMO_SET_VERSION = "4"  # bump when the generator changes (part of the warm-start cache key)
REGRESSION_METRICS = ("rmse", "rmsle", "mean_column_rmsle", "mae", "pearson")
LOG_TARGET_METRICS = ("rmsle", "mean_column_rmsle")


@dataclasses.dataclass(frozen=True)
class DataProfile:
    """What the generated code needs to know about a task's public files.

    kind: "binary_proba" (P(positive) per target column), "class_proba" (one probability column
      per class, from one label column), "labels" (predicted labels), "regression".
    """

    id_column: str
    label_columns: tuple[str, ...]  # columns of train.csv absent from test.csv
    submission_columns: tuple[str, ...]  # sample_submission.csv columns without the id
    text_column: str | None  # a free-text feature (the longest string column), if any
    numeric_columns: tuple[str, ...]
    categorical_columns: tuple[str, ...]
    kind: str
    metric: str
    class_column_prefix: str = ""  # submission column = prefix + str(class)
    pixel_max: float = 0.0  # > 0: the features are pixels (many numeric columns, 0..max)


@dataclasses.dataclass(frozen=True)
class DemoProgram:
    """A generated program before it has been run."""

    plan: str
    code: str
    family: str
    params: dict


# ----------------------------------------------------------------------------- profiling


def _is_text(s: pd.Series) -> bool:
    values = s.dropna().astype(str)
    if values.empty:
        return False
    return values.str.len().mean() > 25 and values.str.contains(" ").mean() > 0.5


def profile_task(task, split: str = "reward", nrows: int = 2000) -> DataProfile:
    """Reads the public files of `task.input_dir(split)` and decides how demos treat them."""
    root = Path(task.input_dir(split))
    train = pd.read_csv(root / "train.csv", nrows=nrows)
    test = pd.read_csv(root / "test.csv", nrows=5)
    sample = pd.read_csv(root / "sample_submission.csv", nrows=5)
    idc = task.id_column
    for name, frame in (("test.csv", test), ("sample_submission.csv", sample)):
        if idc not in frame.columns:
            raise ValueError(f"{root / name}: id column {idc!r} missing "
                             f"(columns: {list(frame.columns)})")
    labels = tuple(c for c in train.columns if c not in test.columns and c != idc)
    if not labels:
        raise ValueError(f"{root / 'train.csv'}: no label column "
                         "(every column is also in test.csv)")
    sub_cols = tuple(c for c in sample.columns if c != idc)
    features = [c for c in test.columns if c != idc]
    text_cols = [c for c in features
                 if not pd.api.types.is_numeric_dtype(train[c]) and _is_text(train[c])]
    text = (max(text_cols, key=lambda c: train[c].astype(str).str.len().mean())
            if text_cols else None)
    numeric = tuple(c for c in features if pd.api.types.is_numeric_dtype(train[c]))
    categorical = tuple(c for c in features if c not in numeric and c not in text_cols)
    pixel_max = 0.0
    if len(numeric) >= 50 and not categorical and text is None:
        values = train[list(numeric)].to_numpy(dtype=float)
        top = float(np.nanmax(values))
        if np.nanmin(values) >= 0 and np.all(np.mod(values[~np.isnan(values)], 1) == 0):
            pixel_max = 255.0 if top > 16 else (16.0 if top > 1.5 else 0.0)

    metric = task.metric
    prefix = ""
    if metric in REGRESSION_METRICS:
        kind = "regression"
    elif metric in ("accuracy", "qwk"):
        kind = "labels"
    elif metric in ("auc", "mean_column_auc", "log_loss"):
        if set(sub_cols) == set(labels):
            kind = "binary_proba"
        elif len(labels) == 1:
            kind = "class_proba"
            prefix = _class_prefix(train[labels[0]], sub_cols)
        else:
            raise ValueError(f"task {task.id}: cannot map label columns {labels} to submission "
                             f"columns {sub_cols}")
    else:
        raise ValueError(f"task {task.id}: no demonstration programs for metric {metric!r}")
    if kind in ("regression", "labels") and set(sub_cols) != set(labels):
        raise ValueError(f"task {task.id}: submission columns {sub_cols} are not the label "
                         f"columns {labels} of train.csv")
    return DataProfile(idc, labels, sub_cols, text, numeric, categorical, kind, metric, prefix,
                       pixel_max)


def _class_prefix(label: pd.Series, sub_cols: Sequence[str]) -> str:
    """The prefix p with submission columns == p + str(class) for the label's classes."""
    classes = sorted({str(v) for v in label.dropna().unique()})
    for col in sub_cols:
        for cls in classes:
            if col.endswith(cls):
                prefix = col[: len(col) - len(cls)]
                if all(prefix + c in sub_cols for c in classes):
                    return prefix
    raise ValueError(f"submission columns {list(sub_cols)} are not prefix+class for the "
                     f"classes {classes[:10]} of {label.name!r}")


# ----------------------------------------------------------------------------- code pieces

# Every program of a task imports the same modules (the union over its families), so programs
# differ only in a few lines: a sampled mixture of two demonstrations is still a valid program.
_HEADER = """import numpy as np
import pandas as pd
{imports}

train = pd.read_csv("./input/train.csv")
test = pd.read_csv("./input/test.csv")
sample = pd.read_csv("./input/sample_submission.csv")
"""

# family -> (module, class names, constructor template, needs standardised inputs)
_CLASSIFIERS = {
    "logistic": ("sklearn.linear_model", ("LogisticRegression",),
                 "LogisticRegression(C={C}, max_iter=1000)", True),
    "logistic_grid": ("sklearn.model_selection", ("GridSearchCV", "LogisticRegression"),
                      'GridSearchCV(LogisticRegression(max_iter=1000), {{"C": {grid}}}, cv=3)',
                      True),
    "random_forest": ("sklearn.ensemble", ("RandomForestClassifier",),
                      "RandomForestClassifier(n_estimators={n}, min_samples_leaf={leaf}, "
                      "random_state=0)", False),
    "extra_trees": ("sklearn.ensemble", ("ExtraTreesClassifier",),
                    "ExtraTreesClassifier(n_estimators={n}, min_samples_leaf={leaf}, "
                    "random_state=0)", False),
    "gradient_boosting": ("sklearn.ensemble", ("GradientBoostingClassifier",),
                          "GradientBoostingClassifier(n_estimators={nb}, learning_rate={lr}, "
                          "max_depth=3, random_state=0)", False),
    "long_boosting": ("sklearn.ensemble", ("GradientBoostingClassifier",),
                      "GradientBoostingClassifier(n_estimators=300, learning_rate={lr}, "
                      "max_depth=4, subsample=0.8, random_state=0)", False),
    "hist_gradient_boosting": ("sklearn.ensemble", ("HistGradientBoostingClassifier",),
                               "HistGradientBoostingClassifier(max_iter={nb}, learning_rate={lr}, "
                               "max_leaf_nodes={leaves}, random_state=0)", False),
    "knn": ("sklearn.neighbors", ("KNeighborsClassifier",),
            'KNeighborsClassifier(n_neighbors={k}, weights="{w}")', True),
    "gaussian_nb": ("sklearn.naive_bayes", ("GaussianNB",), "GaussianNB()", False),
    "multinomial_nb": ("sklearn.naive_bayes", ("MultinomialNB",), "MultinomialNB(alpha={alpha})",
                       False),
    "sgd": ("sklearn.linear_model", ("SGDClassifier",),
            'SGDClassifier(loss="modified_huber", alpha={sgd_alpha}, random_state=0)', False),
}
_REGRESSORS = {
    "ridge": ("sklearn.linear_model", ("Ridge",), "Ridge(alpha={alpha})", True),
    "random_forest": ("sklearn.ensemble", ("RandomForestRegressor",),
                      "RandomForestRegressor(n_estimators={n}, min_samples_leaf={leaf}, "
                      "random_state=0)", False),
    "extra_trees": ("sklearn.ensemble", ("ExtraTreesRegressor",),
                    "ExtraTreesRegressor(n_estimators={n}, min_samples_leaf={leaf}, "
                    "random_state=0)", False),
    "gradient_boosting": ("sklearn.ensemble", ("GradientBoostingRegressor",),
                          "GradientBoostingRegressor(n_estimators={nb}, learning_rate={lr}, "
                          "max_depth=3, random_state=0)", False),
    "hist_gradient_boosting": ("sklearn.ensemble", ("HistGradientBoostingRegressor",),
                               "HistGradientBoostingRegressor(max_iter={nb}, learning_rate={lr}, "
                               "max_leaf_nodes={leaves}, random_state=0)", False),
    "knn": ("sklearn.neighbors", ("KNeighborsRegressor",),
            'KNeighborsRegressor(n_neighbors={k}, weights="{w}")', True),
}
# Few, short values: digits are single tokens, and the tiny model must copy them exactly.
_PARAM_GRID = {
    "C": [0.5, 1.0, 2.0, 5.0], "grid": ["[0.5, 2.0, 8.0]"], "n": [100, 200], "nb": [50, 100],
    "leaf": [1, 3],
    "lr": [0.05, 0.1], "leaves": [15, 31], "k": [5, 15], "w": ["uniform", "distance"],
    "alpha": [0.1, 0.5, 1.0], "sgd_alpha": ["1e-4", "1e-5"],
}
_PLAN_MODEL = {
    "logistic": "a logistic regression (C={C})",
    "logistic_grid": "a logistic regression with C chosen by 3-fold grid search over {grid}",
    "random_forest": "a random forest ({n} trees, min_samples_leaf={leaf})",
    "extra_trees": "extra trees ({n} trees, min_samples_leaf={leaf})",
    "gradient_boosting": "gradient boosting ({nb} stages of depth 3, learning rate {lr})",
    "long_boosting": "gradient boosting (300 stages of depth 4 on 80% subsamples, learning "
                     "rate {lr})",
    "hist_gradient_boosting": "histogram gradient boosting ({nb} iterations, learning rate {lr}, "
                              "{leaves} leaves)",
    "knn": "k-nearest neighbours (k={k}, {w} weights)",
    "gaussian_nb": "Gaussian naive Bayes",
    "multinomial_nb": "multinomial naive Bayes (alpha={alpha})",
    "sgd": "a linear model trained by SGD (modified Huber loss, alpha={sgd_alpha})",
    "ridge": "ridge regression (alpha={alpha})",
}


def _families(profile: DataProfile) -> list[str]:
    if profile.kind == "regression":
        if profile.text_column:
            return ["ridge", "knn", "random_forest"]
        if profile.pixel_max:
            return ["ridge", "random_forest", "extra_trees", "knn"]
        return list(_REGRESSORS)
    if profile.text_column:
        return ["logistic", "multinomial_nb", "sgd", "logistic_grid", "random_forest"]
    if profile.pixel_max:  # boosting over 784 pixels x 10 classes is minutes per program
        return ["logistic", "random_forest", "extra_trees", "knn", "gaussian_nb",
                "hist_gradient_boosting"]
    fams = [f for f in _CLASSIFIERS if f not in ("multinomial_nb", "sgd", "long_boosting")]
    if profile.kind == "binary_proba" and len(profile.submission_columns) == 1:
        # The paper's slow, strong action (>= 10 s on one core for a few thousand rows, where a
        # logistic regression takes ~1 s): one tree per stage keeps it inside the demo timeout.
        fams.insert(fams.index("gradient_boosting") + 1, "long_boosting")
    return fams


def _imports(p: DataProfile) -> str:
    """The import block shared by all of a task's programs."""
    table = _REGRESSORS if p.kind == "regression" else _CLASSIFIERS
    names: dict[str, set[str]] = {"sklearn.pipeline": {"make_pipeline"}}
    for fam in _families(p):
        module, classes = table[fam][:2]
        for cls in classes:
            mod = "sklearn.linear_model" if cls == "LogisticRegression" else module
            names.setdefault(mod, set()).add(cls)
    if p.text_column:
        names["sklearn.feature_extraction.text"] = {"CountVectorizer", "TfidfVectorizer"}
    elif not p.pixel_max:
        names["sklearn.impute"] = {"SimpleImputer"}
        names["sklearn.preprocessing"] = {"StandardScaler"}
        if p.categorical_columns:
            names["sklearn.compose"] = {"ColumnTransformer"}
            names["sklearn.preprocessing"].add("OneHotEncoder")
    return "\n".join(f"from {m} import {', '.join(sorted(c))}" for m, c in sorted(names.items()))


def _feature_block(p: DataProfile, rnd: random.Random, family: str, scale: bool
                   ) -> tuple[str, str, str, dict]:
    """(code defining X / X_test, what goes before the estimator in make_pipeline, plan
    sentence, params)."""
    idc = p.id_column
    if p.text_column:
        vec = rnd.choice(["tfidf", "count", "char"]) if family != "random_forest" else "tfidf"
        ng, min_df = rnd.choice([1, 2]), rnd.choice([1, 2])
        max_features = 5000 if family == "random_forest" else rnd.choice([20000, 50000])
        params = {"vectorizer": vec, "ngram_max": ng, "min_df": min_df,
                  "max_features": max_features}
        if vec == "char":
            params["ngram_max"] = 4
            ctor = (f'TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), min_df={min_df}, '
                    f'max_features={max_features})')
            what = f"TF-IDF character 2-4 grams (min_df={min_df})"
        elif vec == "tfidf":
            ctor = (f"TfidfVectorizer(ngram_range=(1, {ng}), min_df={min_df}, sublinear_tf=True, "
                    f"max_features={max_features})")
            what = f"TF-IDF word 1-{ng} grams (min_df={min_df}, sublinear tf)"
        else:
            ctor = (f"CountVectorizer(ngram_range=(1, {ng}), min_df={min_df}, "
                    f"max_features={max_features})")
            what = f"word 1-{ng} gram counts (min_df={min_df})"
        code = (f'text = "{p.text_column}"\nX = train[text].fillna("").astype(str)\n'
                f'X_test = test[text].fillna("").astype(str)\nvectorizer = {ctor}\n')
        return code, "vectorizer", f"Represent the {p.text_column} column with {what}.", params

    feats = f'features = [c for c in test.columns if c != "{idc}"]\n'
    if p.pixel_max:
        div = f" / {p.pixel_max}" if scale else ""
        code = (feats + f"X = train[features].to_numpy(dtype=float){div}\n"
                f"X_test = test[features].to_numpy(dtype=float){div}\n")
        what = "pixel values scaled to [0, 1]" if scale else "raw pixel values"
        return code, "", f"Use the {len(p.numeric_columns)} {what} as features.", {
            "scale": scale}
    impute = rnd.choice(["median", "mean"])
    steps = f'SimpleImputer(strategy="{impute}")' + (", StandardScaler()" if scale else "")
    code = feats + "X, X_test = train[features], test[features]\n"
    what = f"{impute}-imputed numeric columns" + (" (standardised)" if scale else "")
    params = {"impute": impute, "scale": scale}
    if not p.categorical_columns:
        return code, steps, f"Use {what} as features.", params
    code += ('num_cols = X.select_dtypes("number").columns.tolist()\n'
             "cat_cols = [c for c in features if c not in num_cols]\n"
             f"numeric = make_pipeline({steps})\n"
             'categorical = make_pipeline(SimpleImputer(strategy="most_frequent"), '
             'OneHotEncoder(handle_unknown="ignore", sparse_output=False))\n'
             'pre = ColumnTransformer([("num", numeric, num_cols), ("cat", categorical, '
             "cat_cols)])\n")
    return code, "pre", f"Use {what} and one-hot encoded categorical columns as features.", \
        params


def _output_block(p: DataProfile) -> tuple[str, str]:
    """(code that fits `model`, predicts and builds `sub`, plan sentence)."""
    idc = p.id_column
    if p.kind == "class_proba":
        label = p.label_columns[0]
        cols = f'[f"{p.class_column_prefix}{{c}}" for c in model.classes_]'
        code = (f'model.fit(X, train["{label}"])\n'
                f"proba = pd.DataFrame(model.predict_proba(X_test), columns={cols})\n"
                f'sub = proba.reindex(columns=sample.columns.drop("{idc}"), fill_value=0.0)\n'
                f'sub.insert(0, "{idc}", test["{idc}"].to_numpy())\n')
        return code, ("Predict the probability of every class and write them in the sample "
                      "submission's column order.")
    fit, pred = "model.fit(X, train[target])", "model.predict(X_test)"
    if p.kind == "binary_proba":
        pred, what = "model.predict_proba(X_test)[:, 1]", "the positive-class probability"
    elif p.kind == "labels":
        what = "the predicted label"
    elif p.metric in LOG_TARGET_METRICS:
        fit = "model.fit(X, np.log1p(train[target]))"
        pred = "np.expm1(model.predict(X_test)).clip(0)"
        what = "the prediction (fitted on log1p of the target, for RMSLE)"
    else:
        what = "the prediction"
    targets = list(p.submission_columns)
    if len(targets) == 1:
        code = (f'target = "{targets[0]}"\n{fit}\n'
                f'sub = pd.DataFrame({{"{idc}": test["{idc}"], target: {pred}}})\n')
        return code, f"Write {what} for each test {idc}."
    code = (f'sub = pd.DataFrame({{"{idc}": test["{idc}"]}})\nfor target in {targets!r}:\n'
            f"    {fit}\n    sub[target] = {pred}\n")
    return code, f"Refit the model for each target column and write {what}."


def _program(task, profile: DataProfile, family: str, rnd: random.Random,
             change: dict | None = None) -> DemoProgram:
    """One program of `family` for the task (hyper-parameters and features drawn from `rnd`);
    `change` overrides hyper-parameters after the draws, so the features drawn are the same."""
    table = _REGRESSORS if profile.kind == "regression" else _CLASSIFIERS
    est = "regressor" if profile.kind == "regression" else "classifier"
    header = _HEADER.format(imports=_imports(profile))
    out_code, out_plan = _output_block(profile)
    ctor_t, needs_scale = table[family][2:]
    if family == "logistic" and profile.pixel_max:  # hundreds of features: keep lbfgs quick
        ctor_t = ctor_t.replace("max_iter=1000", "max_iter=200")
    hp = {k: rnd.choice(v) for k, v in _PARAM_GRID.items() if "{" + k + "}" in ctor_t}
    if profile.text_column and family == "random_forest":
        hp["n"] = 100
    hp.update(change or {})
    scale = needs_scale or rnd.random() < 0.3
    f_code, pipe, f_plan, f_params = _feature_block(profile, rnd, family, scale)
    model = f"make_pipeline({pipe}, {est})" if pipe else est
    code = (f"{header}\n{f_code}{est} = {ctor_t.format(**hp)}\nmodel = {model}\n"
            f'{out_code}sub.to_csv("./submission/submission.csv", index=False)\n')
    plan = f"{f_plan} Fit {_PLAN_MODEL[family].format(**hp)}. {out_plan}"
    return DemoProgram(plan, code, family, {**hp, **f_params})


def generate_programs(task, profile: DataProfile | None = None, n: int = 16, seed: int = 0,
                      edits: int = 0) -> list[DemoProgram]:
    """`n` distinct programs for `task`, cycling over the model families that suit its data.

    edits: after them, up to `edits` edited copies: the first programs that have a tunable
    hyper-parameter again, with the same features and one hyper-parameter set to another value
    of its grid (`params["edit_of"]`: the index of the original, `params["edited"]`: which).
    """
    profile = profile or profile_task(task)
    rnd = random.Random(f"{task.id}:{seed}")
    fams = _families(profile)
    programs: list[DemoProgram] = []
    states: list[tuple] = []  # the generator's state before each program: its edit redraws it
    seen: set[str] = set()
    attempts = 0
    while len(programs) < n and attempts < 50 * n:
        family = fams[(len(programs) + attempts // 10) % len(fams)]
        attempts += 1
        state = rnd.getstate()
        prog = _program(task, profile, family, rnd)
        if prog.code in seen:
            continue
        seen.add(prog.code)
        programs.append(prog)
        states.append(state)
    pick, edited = random.Random(f"{task.id}:{seed}:edits"), 0
    for i, (prog, state) in enumerate(list(zip(programs, states))):
        if edited >= edits:
            break
        tunable = [k for k in _PARAM_GRID if k in prog.params and len(_PARAM_GRID[k]) > 1
                   and not (k == "n" and profile.text_column)]  # 100 trees on text: fixed
        if not tunable:
            continue
        key = pick.choice(tunable)
        value = pick.choice([v for v in _PARAM_GRID[key] if v != prog.params[key]])
        again = random.Random()
        again.setstate(state)
        edit = _program(task, profile, prog.family, again, change={key: value})
        if edit.code in seen:
            continue
        seen.add(edit.code)
        edited += 1
        programs.append(dataclasses.replace(edit, params={**edit.params, "edit_of": i,
                                                          "edited": key}))
    return programs


# Reference solutions of a task without hand-written baselines (`env calibrate DIR`): the
# simple family and the strong one, first in this order that suits the data.
REFERENCE_FAMILIES = {"baseline": ("logistic", "ridge"),
                      "strong": ("hist_gradient_boosting", "random_forest")}


def reference_program(task, kind: str, profile: DataProfile | None = None) -> DemoProgram:
    """The generated `kind` ("baseline" | "strong") solution of `task` (seeded by its id)."""
    profile = profile or profile_task(task)
    fams = _families(profile)
    family = next(f for f in REFERENCE_FAMILIES[kind] + tuple(fams) if f in fams)
    return _program(task, profile, family, random.Random(f"{task.id}:reference:{kind}"))
