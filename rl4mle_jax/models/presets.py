"""Qwen2 configuration and named presets (published Qwen2.5 values plus a tiny CPU model)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Architecture of a Qwen2 decoder; frozen so it can be a static argument of `jax.jit`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    dtype: str = "float32"  # compute dtype; norms, softmax and logits always run in float32
    param_dtype: str = "float32"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            if not isinstance(value, str):  # accept jnp.float32 etc. but store a hashable name
                object.__setattr__(self, name, jnp.dtype(value).name)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    def replace(self, **changes) -> Qwen2Config:
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        nq, nkv, d = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attn = h * nq * d + nq * d + 2 * (h * nkv * d + nkv * d) + nq * d * h
        layer = attn + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else h * v
        return v * h + self.num_hidden_layers * layer + h + head


_PRESETS = {
    # Values from the published Qwen2.5 config.json files (see REFERENCE.md).
    "qwen2.5-0.5b": Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
    "qwen2.5-1.5b": Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True),
    "qwen2.5-3b": Qwen2Config(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True),
    "qwen2.5-7b": Qwen2Config(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False),
    # CPU model; vocab fits the 4096-entry BPE of `train_bpe_tokenizer` (override freely).
    "tiny": Qwen2Config(
        vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        tie_word_embeddings=True, max_position_embeddings=32768),
}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def get_preset(name: str, **overrides) -> Qwen2Config:
    """Returns the named preset, with any field overridden (e.g. `vocab_size=`, `dtype=`)."""
    key = name.lower()
    if key not in _PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {preset_names()}")
    return _PRESETS[key].replace(**overrides) if overrides else _PRESETS[key]


# ---------------------------------------------------------------------------------------------
# config.json (transformers) and plain dicts
# ---------------------------------------------------------------------------------------------


def config_from_hf_dict(d: dict[str, Any], dtype: Any = jnp.float32,
                        param_dtype: Any = None) -> Qwen2Config:
    """Qwen2Config from a transformers config.json dict (v4 `rope_theta`, v5 `rope_parameters`)."""
    model_type = d.get("model_type", "qwen2")
    if model_type != "qwen2":
        raise ValueError(f"config.json has model_type={model_type!r}; only 'qwen2' is supported")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"rope_type={rope_type!r} is not supported (only 'default')")
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    if d.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act={d['hidden_act']!r} is not supported (only silu)")
    if d.get("use_sliding_window"):
        raise NotImplementedError("use_sliding_window=true is not supported")
    heads = d["num_attention_heads"]
    dtype_name = jnp.dtype(dtype).name
    return Qwen2Config(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads, rope_theta=float(theta),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=d.get("max_position_embeddings", 32768),
        dtype=dtype_name, param_dtype=jnp.dtype(param_dtype or dtype).name)


def config_to_hf_dict(config: Qwen2Config, dtype: Any = None) -> dict[str, Any]:
    """transformers Qwen2 config.json (both the v5 `rope_parameters` and the v4 `rope_theta`)."""
    dtype_name = jnp.dtype(dtype or config.param_dtype).name
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "hidden_act": "silu", "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": config.tie_word_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_theta": config.rope_theta,
        "use_sliding_window": False, "sliding_window": None, "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True, "dtype": dtype_name,
        "torch_dtype": dtype_name,
    }


def config_to_dict(config: Qwen2Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_dict(d: dict[str, Any]) -> Qwen2Config:
    fields = {f.name for f in dataclasses.fields(Qwen2Config)}
    return Qwen2Config(**{k: v for k, v in d.items() if k in fields})
