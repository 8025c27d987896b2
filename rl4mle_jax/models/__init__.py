"""Qwen2 model, presets and Hugging Face conversion (nothing here knows about RL)."""

from rl4mle_jax.models.convert import (
    CheckpointMismatchError,
    config_from_hf_dict,
    config_to_hf_dict,
    load_hf_checkpoint,
    load_params_orbax,
    save_hf_checkpoint,
    save_params_orbax,
)
from rl4mle_jax.models.presets import Qwen2Config, get_preset, preset_names
from rl4mle_jax.models.qwen2 import (
    KVCache,
    forward,
    forward_with_hidden,
    grow_cache,
    init_cache,
    init_params,
    logits,
    param_logical_axes,
    param_shapes,
    positions_from_mask,
)

__all__ = [
    "CheckpointMismatchError",
    "KVCache",
    "Qwen2Config",
    "config_from_hf_dict",
    "config_to_hf_dict",
    "forward",
    "forward_with_hidden",
    "get_preset",
    "grow_cache",
    "init_cache",
    "init_params",
    "load_hf_checkpoint",
    "load_params_orbax",
    "logits",
    "param_logical_axes",
    "param_shapes",
    "positions_from_mask",
    "preset_names",
    "save_hf_checkpoint",
    "save_params_orbax",
]
