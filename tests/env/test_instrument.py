"""Static and LM instrumentation, markers with nonces, and the verifier."""

import ast
import re
import subprocess
import sys
import textwrap

import pytest

from rl4mle_jax.env.instrument import (
    InstrumentedProgram,
    instrument_static,
    new_nonce,
    scan_markers,
    strip_markers,
    suspects_introspection,
)
from rl4mle_jax.env.instrument_lm import (
    Instrumenter,
    NoGenerateError,
    lm_instrument_prompt,
    verify_lm_instrumentation,
)
from rl4mle_jax.env.instrument_static import MILESTONES, has_training_call

# A stdlib-only "ML" program (fast to run) whose names follow the sklearn conventions that
# the static analysis recognises.
PROGRAM = textwrap.dedent('''\
    """Mean regressor."""
    import csv
    import os


    class MeanRegressor:
        def fit(self, ys):
            self.mean = sum(ys) / len(ys)
            return self

        def predict(self, rows):
            return [self.mean for _ in rows]


    def load(path):
        with open(path) as f:  # read the data
            return list(csv.DictReader(f))


    train = load("input/train.csv")
    test = load("input/test.csv")
    model = MeanRegressor()
    for _ in range(3):
        model.fit([float(r["y"]) for r in train])
    preds = model.predict(test)
    os.makedirs("submission", exist_ok=True)
    with open("submission/submission.csv", "w") as f:
        w = csv.writer(f)
        w.writerow(["id", "y"])
        w.writerows([r["id"], f"{p:.6f}"] for r, p in zip(test, preds))
    ''')


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    (tmp_path / "input").mkdir(exist_ok=True)
    (tmp_path / "input" / "train.csv").write_text("id,y\n1,1.0\n2,3.0\n")
    (tmp_path / "input" / "test.csv").write_text("id\n7\n8\n")
    (tmp_path / "main.py").write_text(code)
    return subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def _lm_answer(code: str, after: dict[str, str]) -> str:
    """A faithful LM answer: a marker print after the (unique) line containing each key."""
    out = []
    for line in code.splitlines():
        out.append(line)
        for key, ms in after.items():
            if key in line:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f'{indent}print("@@MILESTONE {ms}")')
    return "Here is the program:\n```python\n" + "\n".join(out) + "\n```\n"


def test_static_finds_every_milestone_and_keeps_line_numbers(tmp_path):
    prog = instrument_static(PROGRAM)
    assert prog.method == "static"
    assert prog.milestones == ("libraries_imported", "data_loaded", "model_defined",
                               "model_trained", "predictions_made")  # csv.writer: not a to_csv
    assert prog.inserted_lines == ()
    src = prog.render(new_nonce())
    assert len(src.splitlines()) == len(PROGRAM.splitlines())
    # every original statement sits at the same line in the instrumented program
    where = lambda code: {(type(n).__name__, n.lineno) for n in ast.walk(ast.parse(code))
                          if isinstance(n, ast.stmt)}
    assert where(PROGRAM) <= where(src)
    assert prog.static_training


def test_instrumented_program_runs_markers_once_and_same_output(tmp_path):
    nonce = new_nonce()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _run(PROGRAM, tmp_path / "a")
    b = _run(instrument_static(PROGRAM).render(nonce), tmp_path / "b")
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    same = (tmp_path / "a" / "submission" / "submission.csv").read_bytes()
    assert same == (tmp_path / "b" / "submission" / "submission.csv").read_bytes()
    scan = scan_markers(b.stdout, nonce)
    assert scan.milestones == ("libraries_imported", "data_loaded", "model_defined",
                               "model_trained", "predictions_made")
    assert scan.n_valid_lines == 5  # the fit inside the loop printed once (once-guard)
    assert scan_markers(b.stdout, new_nonce()).milestones == ()


def test_static_placement_inside_blocks_and_return(tmp_path):
    code = textwrap.dedent("""\
        import pandas as pd
        def predict(m, x):
            return m.predict(x)
        class Net:
            def predict(self, x):
                return x
        f = lambda m, x: m.predict_proba(x)
        if True: model = Net()
        try:
            data = pd.read_csv("input/train.csv")
        except Exception:
            data = None
        out = [predict(model, i) for i in range(2)]
        data.to_csv("submission/submission.csv")
        """)
    prog = instrument_static(code)
    src = prog.render(new_nonce())
    ast.parse(src)
    tree = ast.parse(src)
    at = {n.lineno: n for n in tree.body}  # first statement of each line
    ret = at[2].body[0]
    assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.Subscript)  # wrapped
    assert isinstance(at[7].value.body, ast.Subscript)  # lambda body wrapped
    assert len(at[8].body) == 2  # `if True: model = Net(); MARKER`
    assert len(at[9].body) == 2  # marker after the read inside `try:`
    assert "model_defined" in prog.milestones and "submission_written" in prog.milestones
    assert "data_loaded" in prog.milestones and not prog.static_training


def test_static_on_unparsable_code_returns_it_unchanged():
    prog = instrument_static("def f(:\n")
    assert prog.method == "none" and prog.milestones == () and prog.render(new_nonce()) == \
        "def f(:\n"


def test_training_detection_ignores_preprocessing_fits():
    assert not has_training_call(ast.parse("from x import StandardScaler as S\n"
                                           "s = StandardScaler(); s.fit(X)\n"
                                           "TfidfVectorizer().fit_transform(t)\n"))
    assert has_training_call(ast.parse("m = make_pipeline(a, b)\nm.fit(X, y)\n"))
    assert has_training_call(ast.parse("booster = lgb.train(params, dtrain)\n"))
    assert has_training_call(ast.parse("w = np.linalg.lstsq(A, b)\n"))


def test_scan_markers_counts_only_this_nonce():
    nonce, other = new_nonce(), new_nonce()
    out = (f"x@@MS {nonce} data_loaded\n@@MS {other} model_trained\n"
           "@@MS data_loaded\nmodel trained\n"
           f"@@MS {nonce} not_a_milestone\n@@MS {nonce} data_loaded\n")
    scan = scan_markers(out, nonce)
    assert scan.milestones == ("data_loaded",)
    assert scan.n_valid_lines == 2 and scan.n_forged_lines == 2
    with pytest.raises(ValueError, match="32 lowercase hex"):
        scan_markers(out, "abc")
    assert "@@MS" not in strip_markers(out)


def test_render_rejects_bad_nonce_and_placeholder_not_in_original():
    prog = instrument_static(PROGRAM)
    assert prog.placeholder not in PROGRAM and prog.placeholder in prog.template
    with pytest.raises(ValueError, match="nonce"):
        prog.render("NOT-A-NONCE")


def test_introspection_is_suspected():
    assert suspects_introspection("print(open(__file__).read())")
    assert suspects_introspection("import sys\nsrc = open(sys.argv[0]).read()")
    assert suspects_introspection("import inspect\ninspect.currentframe().f_code.co_consts")
    assert suspects_introspection("open('main.py').read()")
    assert not suspects_introspection(PROGRAM)


# ------------------------------------------------------------------ LM instrumenter + verifier
FAITHFUL = {"import os": "libraries_imported", 'test = load("input/test.csv")': "data_loaded",
            "model = MeanRegressor()": "model_defined",
            "    model.fit(": "model_trained", "preds = model.predict": "predictions_made"}


def test_faithful_lm_answer_is_accepted_and_runs(tmp_path):
    prog, rec = verify_lm_instrumentation(PROGRAM, _lm_answer(PROGRAM, FAITHFUL))
    assert rec["accepted"] and rec["reason"] is None and rec["n_markers"] == 5
    assert prog.method == "lm" and set(prog.milestones) == set(FAITHFUL.values())
    nonce = new_nonce()
    res = _run(prog.render(nonce), tmp_path)
    assert res.returncode == 0, res.stderr
    assert set(scan_markers(res.stdout, nonce).milestones) == set(FAITHFUL.values())
    assert "@@MILESTONE" not in prog.render(nonce)  # the model's prints are replaced by ours


@pytest.mark.parametrize("mutate, detail", [
    (lambda c: c.replace("range(3)", "range(4)"), "differs"),  # changed constant
    (lambda c: c.replace('os.makedirs("submission", exist_ok=True)\n', ""), "differs"),
    (lambda c: "import json\n" + c, "differs"),  # added import
])
def test_changed_logic_is_rejected_and_static_is_used(mutate, detail):
    answer = _lm_answer(mutate(PROGRAM), FAITHFUL)
    prog, rec = verify_lm_instrumentation(PROGRAM, answer)
    assert prog is None and rec["reason"] == "ast_mismatch" and detail in rec["detail"]
    inst = Instrumenter("lm", generate=lambda prompt: answer)
    out = inst(PROGRAM)
    assert out.method == "static_fallback" and out.verification["reason"] == "ast_mismatch"
    nonce = new_nonce()
    assert out.render(nonce) == instrument_static(PROGRAM).render(nonce)
    m = inst.metrics()
    assert m["instrument/lm_rejected"] == 1 and m["instrument/lm_accept_rate"] == 0.0


def test_realign_places_markers_of_an_answer_that_rewrote_a_statement(tmp_path):
    """The frozen copy's typical answer: every marker where it belongs, one statement rewritten
    (here the model); with realign the markers go to the partners of their anchors in the
    program, which runs as the agent wrote it."""
    rewritten = PROGRAM.replace("model = MeanRegressor()", "model = OtherRegressor(k=3)")
    answer = _lm_answer(rewritten, {**FAITHFUL, "model = OtherRegressor(k=3)": "model_defined"})
    assert verify_lm_instrumentation(PROGRAM, answer)[1]["reason"] == "ast_mismatch"  # default
    prog, rec = verify_lm_instrumentation(PROGRAM, answer, realign=True)
    assert rec["accepted"] and rec["realigned"] and rec["reason"] is None
    assert "differs" in rec["mismatch"] and rec["n_unaligned"] == 0 and rec["n_markers"] == 5
    # The replaced statement pairs with the program's own (same place, same statement type).
    assert set(prog.milestones) == set(FAITHFUL.values())
    nonce = new_nonce()
    text = prog.render(nonce)
    assert "OtherRegressor" not in text and prog.original == PROGRAM
    res = _run(text, tmp_path)
    assert res.returncode == 0, res.stderr
    assert set(scan_markers(res.stdout, nonce).milestones) == set(FAITHFUL.values())
    # The same spots as a faithful answer's.
    faithful, _ = verify_lm_instrumentation(PROGRAM, _lm_answer(PROGRAM, FAITHFUL))
    assert text == faithful.render(nonce)
    inst = Instrumenter("lm", generate=lambda prompt: answer, realign=True)
    assert inst(PROGRAM).method == "lm"
    m = inst.metrics()
    assert m["instrument/lm_accepted"] == m["instrument/lm_realigned"] == 1


def test_realign_drops_markers_whose_anchor_has_no_partner():
    # A statement added after the data loading, with a marker after it: nothing in the program
    # corresponds, so that marker is dropped and the others are kept.
    added = PROGRAM.replace('test = load("input/test.csv")\n',
                            'test = load("input/test.csv")\nextra = sorted(test)\n')
    answer = _lm_answer(added, {**{k: v for k, v in FAITHFUL.items()
                                   if v != "data_loaded"}, "extra = sorted": "data_loaded"})
    prog, rec = verify_lm_instrumentation(PROGRAM, answer, realign=True)
    assert rec["realigned"] and rec["n_unaligned"] == 1 and rec["n_markers"] == 5
    assert "data_loaded" not in prog.milestones and len(prog.milestones) == 4
    text = prog.render(new_nonce())
    assert prog.original == PROGRAM and "extra" not in text and "MeanRegressor()" in text


def test_realign_rejects_another_program_and_answers_without_markers():
    other = "import json\nx = json.loads('[1]')\nprint(x)\n"
    answer = _lm_answer(other, {"import json": "libraries_imported"})
    prog, rec = verify_lm_instrumentation(PROGRAM, answer, realign=True)
    assert prog is None and rec["reason"] == "ast_mismatch" and "realigned" not in rec
    rewritten = PROGRAM.replace("range(3)", "range(4)")
    prog, rec = verify_lm_instrumentation(PROGRAM, f"```python\n{rewritten}```", realign=True)
    assert prog is None and rec["reason"] == "ast_mismatch"


def test_realign_is_bounded_on_hostile_answers():
    # Thousands of identical statements (difflib's worst case): past MAX_ALIGNED_STATEMENTS the
    # alignment is not tried.
    from rl4mle_jax.env.instrument_lm import MAX_ALIGNED_STATEMENTS

    many = "x = 1\n" * (MAX_ALIGNED_STATEMENTS + 1)
    answer = "```python\nprint('@@MILESTONE data_loaded')\n" + many.replace("1", "2", 1) + "```"
    prog, rec = verify_lm_instrumentation(many, answer, realign=True)
    assert prog is None and rec["reason"] == "ast_mismatch"
    # A deep statement (as deep as parses anywhere) pairs as a whole.
    deep = "y = " + "-" * 900 + "1\nz = 2\n"
    answer = ("```python\n" + deep.replace("z = 2", "z = 3")
              + "print('@@MILESTONE data_loaded')\n```")
    prog, rec = verify_lm_instrumentation(deep, answer, realign=True)
    assert rec["realigned"] and prog.milestones == ("data_loaded",)


def test_unparsable_or_markerless_answers_are_rejected():
    assert verify_lm_instrumentation(PROGRAM, "```python\ndef (\n```")[1]["reason"] == \
        "syntax_error"
    assert verify_lm_instrumentation(PROGRAM, "sorry, I cannot")[1]["reason"] == "no_code"
    assert verify_lm_instrumentation(PROGRAM, f"```python\n{PROGRAM}```")[1]["reason"] == \
        "no_markers"
    # a print of another text is a change of the program, not a marker
    other = PROGRAM.replace("import os\n", 'import os\nprint("data loaded")\n')
    assert verify_lm_instrumentation(PROGRAM, f"```python\n{other}```")[1]["reason"] == \
        "ast_mismatch"


def test_instrumenter_counts_and_prompt():
    answer = _lm_answer(PROGRAM, FAITHFUL)
    seen = []
    inst = Instrumenter("lm", generate=lambda p: seen.append(p) or answer,
                        chat_template=lambda msgs: "<chat>" + msgs[0]["content"])
    assert inst(PROGRAM).method == "lm"
    assert seen[0].startswith("<chat>") and PROGRAM.strip() in seen[0]
    assert "@@MS" not in lm_instrument_prompt(PROGRAM)  # the model never sees a nonce
    assert inst.metrics()["instrument/lm_accept_rate"] == 1.0
    none = Instrumenter("none")(PROGRAM)
    assert none.render(new_nonce()) == PROGRAM and none.milestones == ()
    assert none.static_training  # the no-training check works without markers too
    with pytest.raises(ValueError, match="frozen model"):
        Instrumenter("lm")(PROGRAM)
    with pytest.raises(ValueError, match="static\\|lm\\|none"):
        Instrumenter("llm")


def test_lm_without_generate_is_a_set_up_error_the_run_step_does_not_swallow():
    """The loop builds Instrumenter("lm") without generate (it samples answers itself); calling
    it synchronously then stops loudly, also inside run-and-grade's otherwise total step."""
    from rl4mle_jax.env import execute

    inst = Instrumenter("lm")
    assert inst.from_lm_response(PROGRAM, _lm_answer(PROGRAM, FAITHFUL)).method == "lm"
    with pytest.raises(NoGenerateError, match="from_lm_response"):
        execute.instrument(PROGRAM, inst)

def test_lm_marker_after_compound_statement_maps_lines_back(tmp_path):
    code = "import os\nfor i in range(2):\n    x = i\nraise ValueError('boom')\n"
    answer = "```python\nimport os\nfor i in range(2):\n    x = i\n" \
             "print('@@MILESTONE model_trained')\nraise ValueError('boom')\n```"
    prog, rec = verify_lm_instrumentation(code, answer)
    assert rec["accepted"] and prog.inserted_lines == (4,)
    res = _run(prog.render(new_nonce()), tmp_path)
    assert 'line 5' in res.stderr  # executed program: line 5 ...
    assert prog.original_line(5) == 4 and prog.original_line(4) == 3  # ... is the agent's 4
    assert isinstance(prog, InstrumentedProgram) and MILESTONES[3] in prog.milestones


class _Unmark(ast.NodeTransformer):
    """Undoes the static instrumenter: drops marker statements, unwraps `(call, M...)[0]`."""

    @staticmethod
    def is_marker(node):
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Lambda) and \
            "_rl4mle_ms" in ast.unparse(node)

    def visit_Subscript(self, node):
        self.generic_visit(node)
        v = node.value
        if isinstance(v, ast.Tuple) and len(v.elts) > 1 and all(
                self.is_marker(e) for e in v.elts[1:]):
            return v.elts[0]
        return node

    def generic_visit(self, node):
        super().generic_visit(node)
        for name, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, [s for s in value if not (
                    isinstance(s, ast.Expr) and self.is_marker(s.value))])
        return node


def _corpus():
    import json as json_mod
    from pathlib import Path

    import rl4mle_jax.env.baselines as baselines

    files = sorted(Path(baselines.__file__).parent.glob("*.py"))
    files += [Path(json_mod.__file__).parent / "decoder.py", Path(ast.__file__),
              Path(textwrap.__file__), Path(subprocess.__file__)]
    return files


def test_static_instrumentation_only_adds_markers_on_real_code():
    """On real programs (the task baselines, stdlib modules): compiles, same line count, and the
    syntax tree with the markers undone equals the original's."""
    n_marked = 0
    for path in _corpus():
        code = path.read_text()
        prog = instrument_static(code)
        src = prog.render(new_nonce())
        compile(src, str(path), "exec", dont_inherit=True)
        assert len(src.splitlines()) == len(code.splitlines()), path
        assert ast.dump(_Unmark().visit(ast.parse(src))) == ast.dump(ast.parse(code)), path
        n_marked += bool(prog.milestones)
        if path.parent.name == "baselines" and path.name != "__init__.py":
            # every reference solution trains, and every milestone is found in it
            assert prog.static_training and prog.milestones == MILESTONES, path
    assert n_marked >= 10


# -------------------------------------------------------- iterative rewrites vs references
def test_a_lazy_call_ending_its_statement_keeps_both_markers(tmp_path):
    code = "import os\nx = open('input/train.csv'), lambda: m.fit()\n"
    prog = instrument_static(code)
    assert prog.method == "static" and prog.verification == {}
    assert prog.milestones == ("libraries_imported", "data_loaded", "model_trained")
    res = _run(prog.render(nonce := new_nonce()), tmp_path)
    assert res.returncode == 0, res.stderr
    assert scan_markers(res.stdout, nonce).milestones == ("libraries_imported", "data_loaded")


_CHAIN_STUBS = textwrap.dedent("""\
    import os
    class Ridge:
        def __init__(self, **kw): pass
        def fit(self, *a, **kw): return self
        def predict(self, x): return x
    LGBMClassifier = Ridge
    def make_pipeline(*steps): return steps[-1]
    X, y, T, p = [1], [1], [2], {}
    """)
_DT = ("model_defined", "model_trained")


@pytest.mark.parametrize("stmt, expected", [
    ("model = Ridge().fit(X, y)", _DT),
    ("clf = make_pipeline(Ridge()).fit(X, y)", _DT),
    ("m = LGBMClassifier(**p).fit(X, y, eval_set=[(X, y)])", _DT),
    ("preds = Ridge().fit(X, y).predict(T)", (*_DT, "predictions_made")),
    ("if True: preds = Ridge().fit(X, y).predict(T)", (*_DT, "predictions_made")),
    ("for q in Ridge().fit(X, y).predict(T): pass", (*_DT, "predictions_made")),  # wrapped
    ("def f():\n    return Ridge().fit(X, y).predict(T)\nf()", (*_DT, "predictions_made")),
])
def test_a_statement_with_several_milestones_emits_them_in_milestone_order(tmp_path, stmt,
                                                                           expected):
    prog = instrument_static(_CHAIN_STUBS + stmt + "\n")
    assert prog.milestones == ("libraries_imported", *expected)
    src = prog.render(nonce := new_nonce())
    last = src.splitlines()[len(_CHAIN_STUBS.splitlines()):]  # the statement's own lines
    named = [m for line in last for m in re.findall(r'"(\w+)"\)', line) if m in MILESTONES]
    assert tuple(named) == expected  # appended after the statement, or wrapped inner first
    res = _run(src, tmp_path)
    assert res.returncode == 0, res.stderr
    assert scan_markers(res.stdout, nonce).milestones == ("libraries_imported", *expected)


def test_tree_comparison_matches_ast_dump():
    from rl4mle_jax.env.instrument_lm import _same_tree

    codes = [p.read_text() for p in _corpus()]
    codes += ["x = 1", "x = 1.0", "x = True", "x = 'a'", "x = b'a'", "x = u'a'", "x = (1,)",
              "f(a, *b, k=1)", "f(a, k=1, *b)", "def f(x=1): pass", "def f(x=2): pass"]
    trees = [ast.parse(c) for c in codes]
    for a in trees:
        for b in trees[-11:]:
            assert _same_tree(a, b) == (ast.dump(a) == ast.dump(b))
        assert _same_tree(a, ast.parse(ast.unparse(a))) == (
            ast.dump(a) == ast.dump(ast.parse(ast.unparse(a))))


def test_lm_marker_text_matches_the_regex_it_replaces():
    import random
    import re

    from rl4mle_jax.env.instrument_lm import _lm_marker_name

    old = re.compile(r"^\s*@@MILESTONE:?\s+([A-Za-z_ ]+?)\s*$")

    def reference(text):
        m = old.match(text)
        name = m.group(1).strip().lower().replace(" ", "_") if m else None
        return name if name in MILESTONES else None

    atoms = ["@@MILESTONE", ":", " ", "\t", "\n", "\u00a0", "data", "_", "loaded", "x", "!",
             "Data Loaded", "model_trained", " trained"]
    rnd = random.Random(0)
    for _ in range(20000):
        text = rnd.choice(["", " ", "@@MILESTONE"]) + "".join(
            rnd.choice(atoms) for _ in range(rnd.randint(0, 6)))
        assert _lm_marker_name(text) == reference(text), repr(text)
