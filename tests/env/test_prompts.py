"""Prompts (solve/improve, budgets, templates), outcome phrasings, trimming, action extraction."""

import ast
import json
import textwrap

import pytest

from rl4mle_jax.env.actions import extract_action, extract_code_block, find_code_blocks
from rl4mle_jax.env.prompts import (
    QWEN_DEFAULT_SYSTEM,
    PromptConfig,
    TaskContext,
    build_prompt,
    describe_input_dir,
    format_outcome,
    plain_template,
    probe_libraries,
)
from rl4mle_jax.env.reward import RewardRecord
from rl4mle_jax.env.trim import approx_token_count, lines_omitted, trim_code

# Qwen2.5-Instruct's ChatML template (tools branch left out): default system prompt when the
# messages carry none, `<|im_start|>role\ncontent<|im_end|>\n` turns, assistant generation prompt.
CHATML = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + QWEN_DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LONG_CODE = "import numpy as np\nimport pandas as pd\n\n" + "".join(
    f"feature_{i} = np.log1p(np.arange({i} + 10)) * {i}  # feature {i}\n" for i in range(120)
) + textwrap.dedent("""\
    def main():
        train = pd.read_csv("input/train.csv")
    """) + "".join(f"    train['f{i}'] = train['a'] * {i}\n" for i in range(60)) + \
    "    train.to_csv('submission/submission.csv')\n\n\nmain()\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny byte-level BPE with ChatML specials and the template above, built locally."""
    from rl4mle_jax.models.tokenizer import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("tok")
    return train_bpe_tokenizer([LONG_CODE, CHATML, QWEN_DEFAULT_SYSTEM] * 3, 400, out,
                               chat_template=CHATML)


def _ctx(desc="Predict y from a.\n" * 3):
    return TaskContext(desc, "- train.csv (1.0 KB, 10 rows, columns: id, a, y)",
                       ("numpy", "pandas", "scikit-learn"), 300.0, "auc", "higher")


def test_solve_prompt_plain_has_every_part():
    p = build_prompt(_ctx())
    for part in ("Predict y from a.", "./input/", "train.csv (1.0 KB", "scikit-learn",
                 "300 seconds", "auc (higher is better)", "```python",
                 "./submission/submission.csv", QWEN_DEFAULT_SYSTEM):
        assert part in p.text, part
    assert p.text == plain_template(p.messages) and p.text.endswith("Answer:\n")
    assert p.n_tokens == approx_token_count(p.text)
    assert [m["role"] for m in p.messages] == ["system", "user"]
    assert build_prompt(_ctx(), cfg=PromptConfig(system_prompt=None)).messages[0]["role"] == \
        "user"


def test_chatml_rendering_with_a_local_tokenizer(tokenizer):
    count = lambda s: len(tokenizer.encode(s))
    p = build_prompt(_ctx(), chat_template=tokenizer.apply_chat_template, count_tokens=count)
    assert p.text.startswith(f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n"
                             "<|im_start|>user\nYou are solving")
    assert p.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert p.n_tokens == count(p.text) and p.n_tokens <= 1024
    assert tokenizer.encode("<|im_start|>") == [tokenizer.token_to_id("<|im_start|>")]


@pytest.mark.parametrize("budget", [800, 1024, 1500])
def test_improve_prompt_is_trimmed_within_budget_keeping_valid_python(tokenizer, budget):
    count = lambda s: len(tokenizer.encode(s))
    cfg = PromptConfig(max_prompt_tokens=budget)
    ctx = _ctx("A long description. " * 300)
    p = build_prompt(ctx, earlier_code=LONG_CODE, outcome="No error detected, you achieved a "
                     "score of 0.5.", cfg=cfg, chat_template=tokenizer.apply_chat_template,
                     count_tokens=count)
    assert p.n_tokens <= budget and p.n_tokens == count(p.text)
    assert p.trimmed["code_tokens"] is not None and "description cut" in p.text
    code = p.text.split("```python\n")[-1].split("\n```")[0]
    ast.parse(code)  # still valid Python
    assert code.startswith("import numpy as np\nimport pandas as pd\n")  # imports kept
    assert "main()" in code and "lines omitted]" in code  # the end kept, the middle marked
    assert "Outcome: No error detected, you achieved a score of 0.5." in p.text


def test_improve_prompt_counts_the_parent_lines_it_leaves_out(tokenizer):
    """trimmed["code_lines_omitted"]: how many of the parent's lines the policy cannot see."""
    count = lambda s: len(tokenizer.encode(s))
    kw = dict(outcome="No error detected.", chat_template=tokenizer.apply_chat_template,
              count_tokens=count)
    whole = build_prompt(_ctx(), earlier_code="import numpy as np\nx = 1\n", **kw)
    assert whole.trimmed == {}  # fits: nothing cut
    cut = build_prompt(_ctx(), earlier_code=LONG_CODE, cfg=PromptConfig(max_prompt_tokens=800),
                       **kw)
    code = cut.text.split("```python\n")[-1].split("\n```")[0] + "\n"
    shown = [line for line in code.splitlines() if "lines omitted]" not in line]
    n = cut.trimmed["code_lines_omitted"]
    assert n > 0 and n == len(LONG_CODE.splitlines()) - len(shown)
    # only the description cut: the parent is whole
    long_desc = build_prompt(_ctx("A long description. " * 300), earlier_code="x = 1\n",
                             cfg=PromptConfig(max_prompt_tokens=800), **kw)
    assert "description cut" in long_desc.text
    assert long_desc.trimmed["code_lines_omitted"] == 0


def test_lines_omitted_counts_the_markers_trim_code_adds():
    for budget in (30, 80, 200, 400):
        out = trim_code(LONG_CODE, budget)
        shown = [line for line in out.splitlines() if "lines omitted]" not in line]
        assert lines_omitted(LONG_CODE, out) == len(LONG_CODE.splitlines()) - len(shown)
    assert lines_omitted(LONG_CODE, LONG_CODE) == 0
    # a marker the program itself holds is not counted; unparsable code has its own marker
    own = "x = 1\n# [3 lines omitted]\n" + LONG_CODE
    out = trim_code(own, 200)
    markers = [line for line in out.splitlines() if "lines omitted]" in line]
    assert "# [3 lines omitted]" in markers and len(markers) == 3  # its own + two runs
    assert lines_omitted(own, out) == len(own.splitlines()) - (len(out.splitlines()) - 2)
    broken = "".join(f"line {i} (\n" for i in range(100))
    cut = trim_code(broken, 60)
    assert lines_omitted(broken, cut) == 100 - (len(cut.splitlines()) - 1)


def test_budget_errors_name_the_setting():
    with pytest.raises(ValueError, match="max_prompt_tokens=50"):
        build_prompt(_ctx(), cfg=PromptConfig(max_prompt_tokens=50))
    with pytest.raises(ValueError, match="outcome"):
        build_prompt(_ctx(), earlier_code="x = 1\n")


@pytest.mark.parametrize("budget", [30, 80, 200, 400])
def test_trim_code_fits_and_parses(budget):
    out = trim_code(LONG_CODE, budget)
    assert approx_token_count(out) <= budget
    ast.parse(out)
    assert trim_code("x = 1\n", 100) == "x = 1\n"
    broken = "".join(f"line {i} (\n" for i in range(100))
    cut = trim_code(broken, 60)
    assert approx_token_count(cut) <= 60 and "lines omitted" in cut and "line 99" in cut


def test_trim_code_inside_a_big_function():
    out = trim_code(LONG_CODE.split("def main")[0][:40] + "\ndef main" +
                    LONG_CODE.split("def main")[1], 150)
    ast.parse(out)
    assert "def main():" in out and "    ...  # [" in out and out.rstrip().endswith("main()")


TEXT_PROGRAM = textwrap.dedent("""\
    import numpy as np
    import pandas as pd
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    train = pd.read_csv("./input/train.csv")
    test = pd.read_csv("./input/test.csv")
    sample = pd.read_csv("./input/sample_submission.csv")
    X = train["text"].fillna("").astype(str)
    X_test = test["text"].fillna("").astype(str)
    SEED = 0
    params = {"C": 5.0, "max_iter": 1000}
    vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), min_df=1)
    classifier = LogisticRegression(random_state=SEED, **params)
    model = make_pipeline(vectorizer, classifier)
    model.fit(X, train["source"])
    proba = pd.DataFrame(model.predict_proba(X_test), columns=list(model.classes_))
    sub = proba.reindex(columns=sample.columns.drop("id"), fill_value=0.0)
    sub.insert(0, "id", test["id"].to_numpy())
    sub.to_csv("./submission/submission.csv", index=False)
""")


@pytest.mark.parametrize("wrap", [False, True])
def test_trim_code_keeps_the_modelling_choices_first(wrap):
    """first="choices": what a cut parent shows first are the lines that construct the model
    and its features and bind numeric settings (here 4 lines in the middle), then the end;
    imports, reading the data and the DataFrame bookkeeping go first. The same inside a
    `def main():` body."""
    code = TEXT_PROGRAM
    if wrap:
        head, body = code.split("\ntrain = ", 1)
        code = head + "\n\ndef main():\n" + textwrap.indent("train = " + body, "    ") + \
            "\n\nmain()\n"
    choices = ["SEED = 0", 'params = {"C": 5.0, "max_iter": 1000}',
               'vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), min_df=1)',
               "classifier = LogisticRegression(random_state=SEED, **params)"]
    need = sum(approx_token_count(c + "\n") for c in choices) + 2 * approx_token_count(
        "    ...  # [000 lines omitted]\n")
    if wrap:
        need += approx_token_count("def main():\n") + approx_token_count("main()\n") + 20
    out = trim_code(code, need, first="choices")
    ast.parse(out)
    shown = [line.strip() for line in out.splitlines()]
    assert all(c in shown for c in choices), out
    for data_line in ("import numpy as np", 'train = pd.read_csv("./input/train.csv")',
                      "proba = pd.DataFrame(model.predict_proba(X_test), "
                      "columns=list(model.classes_))"):
        assert data_line not in shown, out
    assert lines_omitted(code, out) == len(code.splitlines()) - len(
        [line for line in out.splitlines() if "lines omitted]" not in line])
    # a little short of room: the end fills backwards, so the imports at the head are what go
    roomy = trim_code(code, approx_token_count(code) - 40, first="choices")
    assert roomy.index("vectorizer = ") < roomy.index("sub.to_csv(") and "model.fit(X, " in roomy
    assert wrap or "import numpy as np" not in roomy
    # the default keeps the imports first instead: at the same budget the choices are cut
    default = trim_code(code, need)
    assert "import numpy as np" in default and choices[3] not in default


def test_prompt_config_trim_first_reaches_the_improve_prompt(tokenizer):
    count = lambda s: len(tokenizer.encode(s))  # noqa: E731
    kw = dict(outcome="No error detected.", chat_template=tokenizer.apply_chat_template,
              count_tokens=count)
    line = "\nmodel = Ridge(alpha=0.3)\n"
    code = LONG_CODE.replace("feature_60 = ", line.strip() + "\nfeature_60 = ")
    texts = {first: build_prompt(_ctx(), earlier_code=code, cfg=PromptConfig(
        max_prompt_tokens=800, trim_first=first), **kw).text for first in ("imports", "choices")}
    assert line in texts["choices"] and line not in texts["imports"]
    assert "import numpy as np\nimport pandas as pd\n" in texts["imports"]
    with pytest.raises(ValueError, match="prompt.trim_first"):
        PromptConfig(trim_first="models")
    with pytest.raises(ValueError, match="first must be one of"):
        trim_code(code, 50, first="models")


def test_describe_input_dir_lists_files_columns_and_first_row(tmp_path):
    (tmp_path / "train.csv").write_text("id,text,label\n1,\"" + "x" * 100 + "\",0\n2,b,1\n")
    (tmp_path / "test.csv").write_text("id,text\n3,c\n")
    (tmp_path / "images").mkdir()
    for i in range(4):
        (tmp_path / "images" / f"{i}.png").write_bytes(b"\x89PNG")
    (tmp_path / "description.md").write_text("# Task\n")
    text = describe_input_dir(tmp_path)
    assert "train.csv (" in text and "2 rows, columns: id, text, label" in text
    assert "first row: id='1', text='xxxxxxxxxxxxxxxxxxxxx...'" in text
    assert "test.csv (12 B, 1 rows, columns: those of train.csv without label)" in text
    assert "images/ (4 files, e.g. 0.png, 1.png, 2.png)" in text
    assert "description.md (7 B)" in text
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        describe_input_dir(tmp_path / "does-not-exist")


def test_probe_libraries_reports_installed_packages_only():
    libs = probe_libraries(candidates={"numpy": "numpy", "pandas": "pandas",
                                       "surely_not_installed_pkg": "surely-not"})
    assert set(libs) == {"numpy", "pandas"} and libs["numpy"][0].isdigit()


def _rec(**kw):
    base = dict(reward=-10.0, status="failure")
    return RewardRecord(**{**base, **kw})


@pytest.mark.parametrize("rec, expected", [
    (_rec(status="valid", score=0.81234567, direction="higher", reward=0.81),
     "No error detected, you achieved a score of 0.812346 (higher is better)."),
    (_rec(failure_reason="timeout", timeout_s=300.0),
     "The script reached a timeout of 300 seconds."),
    (_rec(failure_reason="runtime_error", error={"type": "KeyError", "line": 12,
                                                 "source": "df['price']", "message": "'price'"}),
     "No submission.csv, the error is KeyError at line 12 (df['price']): 'price'"),
    (_rec(failure_reason="invalid_submission:wrong_row_count",
          grade={"message": "expected 1409 rows, got 10"}),
     "The submission is invalid, check expected 1409 rows, got 10. Compare with "
     "sample_submission.csv: column names, ids and the number of rows."),
    (_rec(status="no_model_training", failure_reason="no_model_training"),
     "No model training detected: the submission was written without training a model on "
     "the data."),
    (_rec(failure_reason="no_submission"),
     "No submission.csv was written, though the script ended without an error."),
    (_rec(failure_reason="no_code_block"),
     "The answer contained no ```python code block with a program."),
])
def test_outcome_phrasings(rec, expected):
    assert format_outcome(rec) == expected
    assert format_outcome(json.loads(rec.to_json())) == expected


def test_outcome_never_shows_a_marker():
    rec = _rec(failure_reason="runtime_error", error={
        "type": "ValueError", "line": 3, "source": "x",
        "message": "bad @@MS 0123456789abcdef0123456789abcdef data_loaded\n"})
    assert "@@MS" not in format_outcome(rec)


# ------------------------------------------------------------------ actions
def test_extract_plan_and_code():
    a = extract_action("Plan: fit a model.\n\n```python\nimport os\nprint(1)\n```\nDone.")
    assert a.ok and a.plan == "Plan: fit a model." and a.code == "import os\nprint(1)\n"
    assert a.n_blocks == 1 and not a.truncated


def test_several_blocks_choose_the_longest_python_block():
    r = ("```bash\npip install x y z w v u t s r q p o n m l k j i h g\n```\n"
         "```python\nx = 1\n```\nfull:\n```py\nimport os\nx = 1\nprint(x)\n```\n"
         "```python\ny = 2\n```")
    a = extract_action(r)
    assert a.code == "import os\nx = 1\nprint(x)\n" and a.n_blocks == 4
    assert extract_action("```\nprint(1)\n```").code == "print(1)\n"  # untagged fallback
    assert len(find_code_blocks("~~~python\na = 1\n~~~\n")) == 1


def test_failures_have_their_own_reason():
    a = extract_action("I would train a random forest.")
    assert a.failure == "no_code_block" and "no fenced" in a.message and a.code is None
    a = extract_action("```python\ndef f(:\n    pass\n```")
    assert a.failure == "syntax_error" and a.message.startswith("SyntaxError at line 1")
    assert extract_action("```python\n\n```").failure == "empty_code"
    a = extract_action("plan\n```python\nimport os\nfor i in range(3):\n    print(")
    assert a.truncated and a.failure == "syntax_error"  # cut by the token limit


def test_extract_code_block_accepts_bare_code():
    assert extract_code_block("import os\nprint(os.sep)\n") == "import os\nprint(os.sep)\n"
    assert extract_code_block("Sure! I can't do that.") is None
