"""Host steps on untrusted program text and output: total (a result with a named reason, never an
exception) and linear in the size of their input (issue 9, classes 3 and 4)."""

import ast
import re
import subprocess
import sys
import time

import pytest

from rl4mle_jax.env.instrument import (
    InstrumentedProgram,
    instrument_static,
    new_nonce,
    scan_markers,
    strip_markers,
)
from rl4mle_jax.env.instrument_lm import Instrumenter, verify_lm_instrumentation
from rl4mle_jax.env.instrument_static import MAX_PROGRAM_CHARS
from rl4mle_jax.env.tracebacks import parse_error

NONE_REASONS = {"too_large", "syntax_error", "encoding_error", "too_deep", "compile_error"}
STATIC_REASONS = {None, "placements_dropped", "placement_failed"}
TB = "Traceback (most recent call last):\n"


def _seconds(step, arg, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        step(arg)
        best = min(best, time.perf_counter() - t)
    return best


def _assert_linear(step, make, n: int = 64_000, limit_s: float = 2.0) -> None:
    """Time at n and 4n chars (min over repeats): a 4x input may cost < 8x (not 16x), and the
    larger one stays under `limit_s`."""
    small, large = make(n), make(4 * n)
    assert len(large) <= MAX_PROGRAM_CHARS  # measured on what is really processed
    t_small, t_large = _seconds(step, small, 5), _seconds(step, large, 3)
    assert t_large < limit_s, f"{t_large:.2f} s at {len(large)} chars"
    # The floor keeps a few ms of scheduler noise on a loaded machine from reading as growth
    # (CI once saw 3.0 ms -> 25 ms); a quadratic step at 4n would cost 16x, far above it.
    assert t_large < 8 * max(t_small, 5e-3), f"{t_small:.4f} s -> {t_large:.4f} s"


def _lines(line: str, n: int) -> str:
    return line * (n // len(line))


def _check_program(prog: InstrumentedProgram, code: str) -> None:
    """A result any caller can use: it renders, and it runs the agent's code or compiles."""
    assert isinstance(prog, InstrumentedProgram) and prog.original == code
    src = prog.render(new_nonce())
    if prog.method == "none":
        assert src == code and prog.verification["reason"] in NONE_REASONS
    else:
        assert prog.verification.get("reason") in STATIC_REASONS
        if src != code:
            compile(src, "main.py", "exec", dont_inherit=True)


# ---------------------------------------------------------------- totality: named reasons
@pytest.mark.parametrize("code, reason", [
    ("(" * 10**5, "syntax_error"),
    ("1+" * 10**5 + "1", "too_deep"),
    ("-" * 10**5 + "1", "too_deep"),
    ("x = a" + ".b" * 10**5 + "\n", "too_deep"),
    ("f" + "()" * 10**5 + "\n", "too_deep"),
    ("x = 1\0\n", "syntax_error"),
    ("x = '\ud800'\n", "encoding_error"),
    ("\udcff", "encoding_error"),
    ("def f(:\n", "syntax_error"),
    ("return 1\n", "compile_error"),  # ast.parse accepts it, compile() does not
    ("from __future__ import braces\n", "compile_error"),
    ("x = 1\n" + "#" * MAX_PROGRAM_CHARS, "too_large"),
])
def test_unanalysable_programs_run_unmarked_with_a_reason(code, reason):
    for prog in (instrument_static(code), Instrumenter("static")(code)):
        _check_program(prog, code)
        assert prog.method == "none" and prog.verification["reason"] == reason
    none = Instrumenter("none")(code)
    assert none.render(new_nonce()) == code and not none.static_training


@pytest.mark.parametrize("code", [
    "", "\n\n", "\r\n\r", "\t\x0c\n", "\ufeffimport os\n", "x = 1;" * 20000,
    "m.fit(x)\n" * 20000, "m.fit(x); " * 20000, "if x: m.fit(x)\n" * 10000,
    "\t" + "m.fit(x)\n",  # an indented first line
    "with open(f'{x}') as f: m.fit(f)\n", "x = pd.read_csv(p), lambda: m.fit()\n",
    "class A(" + "-" * 1000 + "x): pass\n", "df.to_csv(" + "-" * 1000 + "'submission.csv')\n",
    "for _ in " + "(" * 199 + "read_csv(0)" + ")" * 199 + ": m.fit(x)\n",  # wrap: 200 parens
])
def test_odd_programs_are_instrumented_or_left_alone(code):
    _check_program(instrument_static(code), code)


def test_a_program_at_the_parsers_depth_limit():
    """Deep enough that adding a marker (or parsing one frame deeper) crosses a recursion
    limit: some programs near the limit lose their markers, none raises."""
    def parses(c):
        try:
            ast.parse(c)
            return True
        except (RecursionError, MemoryError, SyntaxError):
            return False

    make = lambda k: "import pandas as pd\nfor _ in pd.read_csv(0)" + "+1" * k + ": m.fit()\n"
    lo, hi = 1, 10_000
    while lo < hi:  # the deepest that parses here
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if parses(make(mid)) else (lo, mid - 1)
    reasons = set()
    for k in range(max(1, lo - 40), lo + 3, 3):
        prog = instrument_static(make(k))
        _check_program(prog, make(k))
        reasons.add(prog.verification.get("reason"))
    assert reasons & {"too_deep", "placement_failed"} and None in reasons


def test_markers_are_capped_and_reported():
    code = "import os\n" + "m.fit(x)\n" * 1000
    prog = instrument_static(code)
    assert prog.milestones == ("libraries_imported", "model_trained")
    assert prog.verification == {"reason": "placements_dropped", "n_dropped": 1000 - 32}
    assert len(prog.template) < len(code) + 40 * 250  # not ~200 bytes per call


# ---------------------------------------------------------------- LM instrumenter
CODE = "import os\n" + "".join(f"m{i} = Model()\nm{i}.fit(x)\n" for i in range(3))


def _lm(code: str, every: str = '    print("@@MILESTONE model_trained")') -> str:
    out = []
    for line in code.splitlines():
        out += [line, every.strip()]
    return "```python\n" + "\n".join(out) + "\n```\n"


@pytest.mark.parametrize("response, reason", [
    ("x" * (5 * MAX_PROGRAM_CHARS), "too_large"),
    ("1+" * 10**5 + "1", "no_code"),  # bare text is code only if it compiles
    ("-" * 10**5 + "1", "no_code"),
    ("```python\n" + "1+" * 10**5 + "1\n```", "too_deep"),
    ("```python\n" + "(" * 10**5 + "\n```", "syntax_error"),
    ("```python\nx = '\ud800'\n```", "encoding_error"),
    ("```python\nx = 1\0\n```", "syntax_error"),
    ("```python\n" + CODE + 'print("@@MILESTONE' + " " * 10**5 + 'model_trained!")\n```',
     "ast_mismatch"),
    ("```python\n" + CODE + "```", "no_markers"),
    ("no code at all", "no_code"),
    (None, "no_code"),
])
def test_hostile_lm_answers_fall_back_with_a_reason(response, reason):
    prog, rec = verify_lm_instrumentation(CODE, response)
    assert prog is None and rec["reason"] == reason
    inst = Instrumenter("lm", generate=lambda p: response)
    out = inst(CODE)
    assert out.method == "static_fallback" and out.verification["reason"] == reason
    assert inst.metrics()[f"instrument/lm_rejected_{reason}"] == 1
    _check_program(instrument_static(CODE), CODE)


def test_lm_answers_for_hostile_programs_never_raise():
    for code in ["(" * 10**5, "1+" * 10**5 + "1", "x = '\ud800'", "return 1\n"]:
        prog, rec = verify_lm_instrumentation(code, _lm(code))
        assert prog is None and rec["reason"] in NONE_REASONS | {"placement_failed"}
        out = Instrumenter("lm", generate=lambda p, c=code: _lm(c))(code)
        assert out.method == "static_fallback" and out.render(new_nonce()) == code
        assert out.verification["fallback_reason"] in NONE_REASONS


def test_markers_in_an_empty_program_place_nothing():
    for code in ["", "# only a comment\n"]:
        answer = '```python\nprint("@@MILESTONE data_loaded")\n```'
        prog, rec = verify_lm_instrumentation(code, answer)
        assert prog is None and rec["reason"] == "placement_failed"


def test_generate_failure_is_a_rejection():
    def boom(prompt):
        raise TimeoutError("frozen copy timed out")

    out = Instrumenter("lm", generate=boom)(CODE)
    assert out.method == "static_fallback" and out.verification["reason"] == "generate_error"


def test_lm_markers_before_a_future_import_are_dropped():
    code = "from __future__ import annotations\nfrom __future__ import division\nimport os\n"
    answer = "```python\n" + code.replace(
        "annotations\n", 'annotations\nprint("@@MILESTONE libraries_imported")\n') + \
        'print("@@MILESTONE model_trained")\n```'
    prog, rec = verify_lm_instrumentation(code, answer)
    assert rec["accepted"] and prog.milestones == ("model_trained",)
    compile(prog.render(new_nonce()), "main.py", "exec", dont_inherit=True)


# ---------------------------------------------------------------- linear time
HOSTILE_PROGRAMS = {
    "statements": lambda n: _lines("m.fit(x)\n", n),
    "one_line": lambda n: _lines("m.fit(x); ", n) + "\n",
    "deep_headers": lambda n: _lines("for _ in f" + "()" * 900 + ": pass\nx = a" + ".b" * 900
                                     + "\n", n),
    "nested_writes": lambda n: _lines("df.to_csv(" + "-" * 900 + "'s.csv')\n", n),
    "placement_fails": lambda n: "for _ in " + "(" * 199 + "read_csv(0)" + ")" * 199 + ": pass\n"
    + _lines("m.fit(x)\n", n - 500),  # old: one compile per marker
    "compile_error": lambda n: _lines("m.fit(x)\n", n - 10) + "return 1\n",
    "ordinary": lambda n: _lines(CODE, n),
}


@pytest.mark.parametrize("name", HOSTILE_PROGRAMS)
def test_instrument_static_is_linear(name):
    _assert_linear(instrument_static, HOSTILE_PROGRAMS[name])


@pytest.mark.parametrize("every", [
    '    print("@@MILESTONE model_trained")',  # a marker after every line: all accepted
    '    print("@@MILESTONE' + " " * 200 + 'data loaded")',  # spaces the old regex backtracked on
])
def test_lm_verification_is_linear(every):
    make = lambda n: _lines(CODE, n)
    inst = Instrumenter("lm", generate=lambda p: _lm(p.split("```python\n")[1], every))
    assert inst(make(16_000)).method == "lm"
    # 4 s: the heaviest host step (it parses the program and the model's answer, and checks
    # every marker); a slower machine read 2.09 s at 192k chars against the 2 s of the others,
    # while the growth check below is what tells linear from quadratic
    _assert_linear(lambda c: inst.from_lm_response(c, _lm(c, every)), make, n=48_000,
                   limit_s=4.0)


HOSTILE_OUTPUTS = {
    "tag_then_word": lambda n: "@@MS " + "a" * n,
    "tags": lambda n: "@@MS" * (n // 4),
    "tag_space_runs": lambda n: "@@MS " * (n // 5),
    "forged_lines": lambda n: _lines(f"@@MS {new_nonce()} model_trained\n", n),
    "long_line": lambda n: "x" * n + "@@MS\n",
}


@pytest.mark.parametrize("name", HOSTILE_OUTPUTS)
def test_marker_scanning_is_linear(name):
    nonce = new_nonce()
    for step in (strip_markers, lambda out: scan_markers(out, nonce)):
        _assert_linear(step, HOSTILE_OUTPUTS[name], limit_s=0.5)
    assert "@@MS" not in strip_markers(HOSTILE_OUTPUTS[name](1000))


HOSTILE_STDERR = {
    "frames_without_quotes": lambda n: TB + _lines('  File "x\n', n),  # old: [^"]+ to the end
    "stop_run": lambda n: TB + "Stop" * (n // 4) + "!\n",  # old: Stop\w* at every Stop
    "word_run": lambda n: TB + "a" * n + "!\n",
    "huge_line_number": lambda n: TB + '  File "main.py", line ' + "9" * n + "\nE: x\n",
    "many_tracebacks": lambda n: _lines(TB + '  File "main.py", line 1\nValueError: x\n', n),
    "blank_lines": lambda n: TB + "\n" * n + "ValueError: x\n",
    "long_message": lambda n: TB + '  File "main.py", line 1\nValueError: ' + "x" * n + "\n",
    "markers": lambda n: TB + "@@MS" * (n // 4) + "\nValueError: x\n",
}


@pytest.mark.parametrize("name", HOSTILE_STDERR)
def test_parse_error_is_linear_and_total(name):
    prog = instrument_static(CODE)
    _assert_linear(lambda s: parse_error(s, prog), HOSTILE_STDERR[name], limit_s=0.5)
    err = parse_error(HOSTILE_STDERR[name](10_000), prog)
    assert err is None or set(err) == {"type", "message", "line", "source"}
    assert err is None or len(err["message"]) <= 300


# ---------------------------------------------------------------- parse_error: same answers
_OLD_FRAME_RE = re.compile(r'^  File "([^"]+)", line (\d+)', re.M)
_OLD_EXC_RE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Stop\w*)"
                         r"|[A-Za-z_][\w.]*)(?::\s?(.*))?$")


def _old_parse_error(stderr, program, max_chars=300):
    """The regex implementation this replaces (reward.py before issue 9), as the reference."""
    text = strip_markers(stderr)
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    tb = text[start:]
    frames = _OLD_FRAME_RE.findall(tb)
    lines = tb.splitlines()
    exc_line = next((ln for ln in lines[1:] if ln and not ln.startswith((" ", "\t"))
                     and _OLD_EXC_RE.match(ln)), None)
    if exc_line is None:
        return None
    m = _OLD_EXC_RE.match(exc_line)
    msg_lines = [m.group(2) or ""] + [ln for ln in lines[lines.index(exc_line) + 1:] if ln]
    out = {"type": m.group(1).split(".")[-1], "message": "\n".join(msg_lines).strip()[:max_chars],
           "line": None, "source": None}
    if frames:
        main_file = frames[0][0]
        own = [int(n) for f, n in frames if f == main_file]
        line = own[-1]
        if program is not None:
            line = program.original_line(line)
            src = program.original.splitlines()
            out["source"] = src[line - 1].strip()[:200] if 0 < line <= len(src) else None
        out["line"] = line
    return out


def test_parse_error_agrees_with_the_regex_version():
    """Random tracebacks whose outermost frame is the program (where the old rule applies)."""
    import random

    rnd = random.Random(0)
    atoms = ['  File "/w/lib.py", line 9, in f', '  File "<x>", line 2', "    raise", "\n",
             "ValueError", "pandas.errors.ParserError", ":", ": bad", "StopIteration", "x.",
             "Error", " ", "\t", '"', ", line ", "12", "\u0663", "\r\n", "\x0c", "é", "KeyboardI",
             "@@MS abc model_trained", 'File "', "Traceback (most recent call last):"]
    prog = instrument_static(CODE)
    for _ in range(3000):
        body = "".join(rnd.choice(atoms) for _ in range(rnd.randint(0, 14)))
        stderr = rnd.choice(["", "noise\n"]) + TB + '  File "/w/main.py", line 3, in f\n' + body
        for p in (None, prog):
            assert parse_error(stderr, p) == _old_parse_error(stderr, p), repr(stderr)


def test_parse_error_finds_the_program_behind_a_bootstrap(tmp_path):
    (tmp_path / "main.py").write_text("import os\n\ndef f():\n    return 1 / 0\n\nf()\n")
    boot = "import runpy; runpy.run_path('main.py', run_name='__main__')"
    res = subprocess.run([sys.executable, "-c", boot], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert '"<string>"' in res.stderr  # the outermost frame is the bootstrap's
    err = parse_error(res.stderr, None)
    assert err == {"type": "ZeroDivisionError", "message": "division by zero", "line": 4,
                   "source": None}
    lib_only = TB + '  File "<string>", line 1\n  File "/usr/lib/x.py", line 7\nOSError: no\n'
    assert parse_error(lib_only, None)["line"] == 1  # no main.py: the outermost frame's file
    assert parse_error(TB + '  File "main.py", line ' + "9" * 50 + "\nE: x\n", None) == {
        "type": "E", "message": "x", "line": None, "source": None}
    assert parse_error(b"Traceback", None) is None and parse_error("", None) is None


LM_RESPONSES = {
    "blank_line": lambda n: " \t" * (n // 2) + "x",
    "open_fences": lambda n: _lines("```python\n", n),
    "unclosed_longer_fence": lambda n: "````python\n" + _lines("```\n", n),
    "fence_then_spaces": lambda n: "```python\n" + " " * n + "\n```",
}


@pytest.mark.parametrize("name", LM_RESPONSES)
def test_hostile_lm_answer_text_is_linear(name):
    _assert_linear(lambda r: verify_lm_instrumentation(CODE, r), LM_RESPONSES[name], limit_s=1.0)
    assert verify_lm_instrumentation(CODE, LM_RESPONSES[name](1000))[1]["reason"]


def test_introspection_check_is_linear():
    from rl4mle_jax.env.instrument import suspects_introspection

    for make in (lambda n: "_" * n, lambda n: _lines("f_bac", n), lambda n: _lines("sys.arg", n)):
        _assert_linear(suspects_introspection, make, limit_s=0.5)
