"""Failure credit: the parser's line of a syntax error → the response tokens that hold it."""

import textwrap

import pytest

from rl4mle_jax.env.actions import extract_action
from rl4mle_jax.rollout.credit import error_token_span

PROGRAM = textwrap.dedent("""\
    import pandas as pd
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    train = pd.read_csv("./input/train.csv")
    clf = GridSearchCV(LogisticRegression(max_iter=1000), {"C": [0.5, 2.0]}, cv=3)
    clf.fit(train[["a"]], train["y"])
    pd.DataFrame({"id": train["id"], "y": clf.predict(train[["a"]])}).to_csv("s.csv")
    """)
GARBLED = 'clf = GridSearchCV(LogisticRegression(max_iter=1000), {"C": [0.0)\n'


def _response(program: str, plan: str = "Plan: TF-IDF and a linear model, é ünïcode.") -> str:
    return f"{plan}\n\n```python\n{program}```"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from rl4mle_jax.models.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer([_response(PROGRAM)] * 5, 320,
                               tmp_path_factory.mktemp("tok"), chat_template=None)


def _span_text(tok, response):
    ids = tok.encode(response)
    decode = lambda x: tok.decode(x, skip_special_tokens=True)  # noqa: E731
    assert decode(ids) == response
    span = error_token_span(response, ids, decode, extract_action(response))
    return span, (decode(ids[span[0]:span[1]]) if span else None), len(ids)


def test_syntax_error_line_is_located_in_tokens(tokenizer):
    lines = PROGRAM.splitlines(keepends=True)
    for where in (1, 5, 7):  # an early, a middle and the last line garbled
        program = "".join(lines[:where] + [GARBLED] + lines[where + 1:])
        action = extract_action(_response(program))
        assert action.failure == "syntax_error" and action.error_lines == (where + 1, where + 1)
        span, text, n = _span_text(tokenizer, _response(program))
        # The span covers the whole garbled line and little else (tokens may straddle a
        # boundary: at most one token's worth on each side).
        assert GARBLED.rstrip("\n") in text
        assert len(text) <= len(GARBLED) + 2 * 12
        assert 0 <= span[0] < span[1] <= n


def test_bracket_closed_on_a_later_line_credits_both_lines(tokenizer):
    program = PROGRAM.replace('{"C": [0.5, 2.0]}, cv=3)', '{"C": [0.5,\n    2.0)}, cv=3)')
    action = extract_action(_response(program))
    assert action.error_lines == (6, 7)
    _, text, _ = _span_text(tokenizer, _response(program))
    assert "clf = GridSearchCV(" in text and "2.0)}" in text and "clf.fit" not in text


@pytest.mark.parametrize("response", [
    _response(PROGRAM),  # valid: the outcome is the whole response's
    "no code here",  # no code block
    "Plan.\n```python\n\n```",  # empty code
    "Plan.\n```python\n" + PROGRAM + "x = f(1,\n",  # truncated block: the length is the cause
])
def test_other_outcomes_keep_the_whole_response(tokenizer, response):
    span, _, _ = _span_text(tokenizer, response)
    assert span is None


def test_a_decode_that_is_not_the_response_gives_no_span(tokenizer):
    program = PROGRAM.replace(PROGRAM.splitlines()[5], GARBLED.rstrip("\n"))
    response = _response(program)
    ids = tokenizer.encode(response)
    span = error_token_span(response, ids, lambda x: tokenizer.decode(x) + " ",
                            extract_action(response))
    assert span is None
