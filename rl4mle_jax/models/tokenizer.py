"""Tokenizers: load a Hugging Face tokenizer directory, or train a small byte-level BPE like Qwen's.

Uses the `tokenizers` library directly (no transformers import) and renders chat templates with
jinja2 the way transformers does (sandboxed, trim_blocks, lstrip_blocks), so that
`load_tokenizer(d).apply_chat_template(m)` equals `AutoTokenizer.from_pretrained(d)
.apply_chat_template(m, tokenize=False)` for ordinary ChatML templates.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

# Qwen2's pre-tokenizer split (tokenizer.json of every Qwen2/2.5 checkpoint).
QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHATML_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Qwen2.5-Instruct's ChatML template without the tool-calling branches: a default system turn
# when the conversation has none, `<|im_start|>{role}\n{content}<|im_end|>\n` per turn, and
# `<|im_start|>assistant\n` as generation prompt.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\n" + QWEN_DEFAULT_SYSTEM + "<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'system' and loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content"
    " + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def _token_content(tok: Any) -> str | None:
    """tokenizer_config stores special tokens either as strings or as AddedToken dicts."""
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def _as_id_list(x: Any) -> list[int]:
    if x is None:
        return []
    return [int(i) for i in (x if isinstance(x, (list, tuple)) else [x])]


def _render_env() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def plain_chat_template(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """Fallback for tokenizers without a chat template: `Role: content` blocks."""
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
    return text + ("Assistant:" if add_generation_prompt else "")


@dataclasses.dataclass
class Tokenizer:
    """A `tokenizers.Tokenizer` plus what generation needs: chat template, stop ids, pad id."""

    backend: tokenizers.Tokenizer
    chat_template: str | None
    stop_token_ids: tuple[int, ...]
    pad_id: int
    special_tokens_map: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self._template = (
            _render_env().from_string(self.chat_template) if self.chat_template else None
        )

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer can emit (with added tokens); the model may have more."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def is_chat(self) -> bool:
        return self.chat_template is not None

    @property
    def eos_id(self) -> int:
        return self.stop_token_ids[0]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. `<|im_start|>`) map to
        their ids. `add_special_tokens` runs the post-processor (BOS etc.; a no-op for Qwen)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str],
                     add_special_tokens: bool = False) -> list[list[int]]:
        encs = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encs]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Sequence[Iterable[int]],
                     skip_special_tokens: bool = False) -> list[str]:
        return self.backend.decode_batch([[int(i) for i in ids] for ids in batch],
                                         skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict],
                            add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role", "content"}]) to the prompt string the model was tuned on."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(
                    f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")
        if not messages:
            raise ValueError("messages is empty")
        if self._template is None:
            return plain_chat_template(messages, add_generation_prompt)
        return self._template.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            tools=None, documents=None, **self.special_tokens_map,
        )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _find_chat_template(path: Path, tok_config: dict) -> str | None:
    tpl = tok_config.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        named = {t["name"]: t["template"] for t in tpl}
        tpl = named.get("default")
    if tpl is None and (path / "chat_template.jinja").exists():  # transformers v5 layout
        tpl = (path / "chat_template.jinja").read_text(encoding="utf-8")
    if tpl is None and (path / "chat_template.json").exists():
        tpl = _read_json(path / "chat_template.json").get("chat_template")
    return tpl


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json).

    Stop ids: the `eos_token` of tokenizer_config, the `eos_token_id`s of generation_config.json
    and config.json, and `<|im_end|>` / `<|endoftext|>` when the vocabulary has them (ChatML).
    """
    path = Path(path)
    tok_file = path / "tokenizer.json"
    if not tok_file.exists():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    backend = tokenizers.Tokenizer.from_file(str(tok_file))
    tok_config = _read_json(path / "tokenizer_config.json")
    gen_config = _read_json(path / "generation_config.json")
    model_config = _read_json(path / "config.json")

    special = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        content = _token_content(tok_config.get(name))
        if content is not None:
            if backend.token_to_id(content) is None:
                raise ValueError(f"{path}/tokenizer_config.json: {name}={content!r} "
                                 "is not in the vocabulary")
            special[name] = content

    stop: list[int] = []
    if "eos_token" in special:
        stop.append(backend.token_to_id(special["eos_token"]))
    stop += _as_id_list(gen_config.get("eos_token_id"))
    stop += _as_id_list(model_config.get("eos_token_id"))
    for tok in (IM_END, ENDOFTEXT):
        tid = backend.token_to_id(tok)
        if tid is not None:
            stop.append(tid)
    stop_ids = tuple(dict.fromkeys(stop))  # dedupe, keep order
    if not stop_ids:
        raise ValueError(f"{path}: no stop token found "
                         f"(no eos_token, eos_token_id, {IM_END} or {ENDOFTEXT})")

    if "pad_token" in special:
        pad_id = backend.token_to_id(special["pad_token"])
    elif gen_config.get("pad_token_id") is not None:
        pad_id = int(gen_config["pad_token_id"])
    else:
        pad_id = stop_ids[0]
    return Tokenizer(backend=backend, chat_template=_find_chat_template(path, tok_config),
                     stop_token_ids=stop_ids, pad_id=pad_id, special_tokens_map=special)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | os.PathLike,
    special_tokens: Sequence[str] = CHATML_SPECIAL_TOKENS,
    chat_template: str | None = QWEN25_CHAT_TEMPLATE,
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a byte-level BPE with Qwen2's normaliser, pre-tokeniser and decoder; save it in
    Hugging Face format (tokenizer.json + tokenizer_config.json) and return it loaded.

    `special_tokens` take the first ids in order (so `<|endoftext|>` = 0 by default). With the
    default ChatML specials the eos is `<|im_end|>` and the pad is `<|endoftext|>`, as in
    Qwen2.5-Instruct. `chat_template=None` writes no template (plain-text fallback).
    """
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(
            f"vocab_size={vocab_size} < 256 byte tokens + {len(special_tokens)} specials")
    tok = _qwen_pipeline(tokenizers.Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _save_hf(tok, Path(out_dir), list(special_tokens), chat_template)


def _qwen_pipeline(tok: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """Qwen2's normaliser, pre-tokeniser and decoder (as in every Qwen2/2.5 tokenizer.json)."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated",
                             invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    return tok


def _save_hf(tok: tokenizers.Tokenizer, out: Path, specials: list[str],
             chat_template: str | None, plain_added: Sequence[str] = ()) -> Tokenizer:
    """tokenizer.json + tokenizer_config.json (ChatML eos/pad when the specials have them).

    plain_added: added tokens that are not special (kept by `skip_special_tokens`)."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    eos = IM_END if IM_END in specials else (ENDOFTEXT if ENDOFTEXT in specials else None)
    pad = ENDOFTEXT if ENDOFTEXT in specials else eos
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 32768,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                      "rstrip": False, "single_word": False,
                                      "special": t not in plain_added}
            for t in sorted([*specials, *plain_added], key=tok.token_to_id)
        },
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False),
                                               encoding="utf-8")
    return load_tokenizer(out)


def build_code_corpus(
    packages: Sequence[str] = ("sklearn", "pandas"), max_bytes: int = 4_000_000
) -> list[str]:
    """Python sources of installed packages (deterministic order), about `max_bytes` in total
    (split evenly over the packages).

    A local, offline code corpus for the tiny model's tokenizer and pre-training.
    """
    texts: list[str] = []
    per_package = max_bytes // max(len(packages), 1)
    for pkg in packages:
        total = 0
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"package {pkg!r} is not installed (needed for the code corpus)")
        for root in spec.submodule_search_locations:
            for f in sorted(Path(root).rglob("*.py")):
                try:
                    text = f.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                if total + len(text) > per_package:
                    break
                texts.append(text)
                total += len(text)
            else:
                continue
            break
    return texts
