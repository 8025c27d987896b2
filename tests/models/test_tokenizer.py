"""Tokenizer: ChatML rendering, stop ids, round trips, parity with transformers' AutoTokenizer."""

import json

import pytest
import regex

from rl4mle_jax.models.tokenizer import (
    QWEN25_CHAT_TEMPLATE,
    QWEN_PRETOKENIZE_REGEX,
    build_code_corpus,
    load_tokenizer,
    train_bpe_tokenizer,
)

CODE_SAMPLES = [
    "import pandas as pd\n\ndef f(x):\n    return  x + 1  # café ünïcode 漢字 😀\n",
    "\tif a!=b:\r\n\t\tprint('it''s'  ,  \"done\")   \n\n\n",
    "x = [1,2,3]\n# résumé — naïve “quotes” …\n    \n",
    "<|im_start|>user\nwrite code<|im_end|>\n<|im_start|>assistant\n",
    "",
    "   leading and trailing   ",
]


@pytest.fixture(scope="module")
def corpus():
    return build_code_corpus(("sklearn",), max_bytes=300_000)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("chat_tok")
    train_bpe_tokenizer(corpus, 600, out)
    return out


def test_corpus_is_python_source(corpus):
    assert 0 < sum(map(len, corpus)) <= 300_000
    assert any("import " in t for t in corpus)


def test_chatml_rendering_exact(chat_dir):
    tok = load_tokenizer(chat_dir)
    assert tok.is_chat
    default_sys = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\n"
    )
    got = tok.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert got == default_sys + "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"

    msgs = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1\n```python\nprint(1)\n```"},
        {"role": "user", "content": "Q2"},
    ]
    want = (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1\n```python\nprint(1)\n```<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
    )
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == want
    assert tok.apply_chat_template(msgs) == want + "<|im_start|>assistant\n"


def test_stop_and_pad_ids(chat_dir):
    tok = load_tokenizer(chat_dir)
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert tok.stop_token_ids == (im_end, eot)
    assert tok.eos_id == im_end and tok.pad_id == eot
    assert tok.vocab_size == 600
    # Special tokens written in the text are single ids.
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == im_end


def test_generation_config_eos_ids_are_stop_ids(tmp_path, chat_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((chat_dir / name).read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    tok = load_tokenizer(tmp_path)
    assert tok.stop_token_ids == (2, 7, 0)  # eos_token first, then generation_config, then ChatML


def test_roundtrip(chat_dir):
    tok = load_tokenizer(chat_dir)
    for s in CODE_SAMPLES:
        assert tok.decode(tok.encode(s)) == s
    batch = tok.encode_batch(CODE_SAMPLES)
    assert tok.decode_batch(batch) == CODE_SAMPLES
    assert tok.decode(tok.encode(CODE_SAMPLES[3]), skip_special_tokens=True) == (
        "user\nwrite code\nassistant\n"
    )


def test_pretokenizer_matches_qwen_regex(chat_dir):
    tok = load_tokenizer(chat_dir)
    # Split pre-tokenisation must equal Python `regex` findall with Qwen's pattern (byte-mapped).
    byte_level = tok.backend.pre_tokenizer
    for s in CODE_SAMPLES[:3]:
        pieces = [p for p, _ in byte_level.pre_tokenize_str(s)]
        want = regex.findall(QWEN_PRETOKENIZE_REGEX, s)
        assert len(pieces) == len(want)
        assert [tok.backend.decoder.decode([p]) for p in pieces] == want


def test_matches_transformers_autotokenizer(chat_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(chat_dir))
    tok = load_tokenizer(chat_dir)
    for s in CODE_SAMPLES:
        assert tok.encode(s) == hf.encode(s, add_special_tokens=False)
        assert tok.encode(s, add_special_tokens=True) == hf.encode(s)
        ids = tok.encode(s)
        assert tok.decode(ids) == hf.decode(ids)
    msgs = [{"role": "user", "content": CODE_SAMPLES[0]}]
    for gen in (True, False):
        assert tok.apply_chat_template(msgs, add_generation_prompt=gen) == hf.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)
    assert hf.eos_token_id == tok.eos_id and hf.pad_token_id == tok.pad_id


def test_template_from_jinja_file_and_list_form(tmp_path, chat_dir):
    (tmp_path / "tokenizer.json").write_bytes((chat_dir / "tokenizer.json").read_bytes())
    cfg = json.loads((chat_dir / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "chat_template.jinja").write_text(QWEN25_CHAT_TEMPLATE)
    msgs = [{"role": "user", "content": "x"}]
    want = load_tokenizer(chat_dir).apply_chat_template(msgs)
    assert load_tokenizer(tmp_path).apply_chat_template(msgs) == want
    (tmp_path / "chat_template.jinja").unlink()
    cfg["chat_template"] = [{"name": "default", "template": QWEN25_CHAT_TEMPLATE}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_tokenizer(tmp_path).apply_chat_template(msgs) == want


def test_plain_template_fallback(tmp_path, corpus):
    tok = train_bpe_tokenizer(corpus[:20], 300, tmp_path, chat_template=None)
    assert not tok.is_chat
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tok.apply_chat_template(msgs) == "System: S\n\nUser: U\n\nAssistant:"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == "System: S\n\nUser: U\n\n"


def test_bad_inputs(tmp_path, chat_dir, corpus):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json in"):
        load_tokenizer(tmp_path)
    tok = load_tokenizer(chat_dir)
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict with 'role' and 'content'"):
        tok.apply_chat_template([{"content": "no role"}])
    with pytest.raises(ValueError, match="messages is empty"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match="vocab_size=100 < 256 byte tokens"):
        train_bpe_tokenizer(corpus[:2], 100, tmp_path / "small")
    with pytest.raises(ValueError, match="package 'no_such_pkg_xyz' is not installed"):
        build_code_corpus(("no_such_pkg_xyz",))
    cfg = json.loads((chat_dir / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|nope|>"
    (tmp_path / "tokenizer.json").write_bytes((chat_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"eos_token='<\|nope\|>' is not in the vocabulary"):
        load_tokenizer(tmp_path)
