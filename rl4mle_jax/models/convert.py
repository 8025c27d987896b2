"""Hugging Face (safetensors) <-> our Qwen2 params, and params <-> orbax checkpoints.

No torch: tensors are read lazily with `safetensors.safe_open(framework="numpy")` (bf16 arrives as
`ml_dtypes.bfloat16`), checked against the expected shapes from the config before any data is
read, converted to the target dtype on the host and placed straight onto an optional sharding.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rl4mle_jax.models.presets import (  # noqa: F401 (config_*_hf_dict re-exported)
    Qwen2Config,
    config_from_dict,
    config_from_hf_dict,
    config_to_dict,
    config_to_hf_dict,
)
from rl4mle_jax.models.qwen2 import Params, param_shapes

# ---------------------------------------------------------------------------------------------
# Key map (data): HF name template, our "/"-joined path template, layout transform.
# ---------------------------------------------------------------------------------------------

KEY_MAP: tuple[tuple[str, str, str], ...] = (
    ("model.embed_tokens.weight", "embed_tokens/embedding", "copy"),
    ("model.layers.{layer}.self_attn.{qkv}_proj.weight",
     "layers_{layer}/self_attn/{qkv}_proj/kernel", "in_heads"),
    ("model.layers.{layer}.self_attn.{qkv}_proj.bias",
     "layers_{layer}/self_attn/{qkv}_proj/bias", "heads"),
    ("model.layers.{layer}.self_attn.o_proj.weight",
     "layers_{layer}/self_attn/o_proj/kernel", "out_heads"),
    ("model.layers.{layer}.mlp.{mlp}_proj.weight", "layers_{layer}/mlp/{mlp}_proj/kernel",
     "transpose"),
    ("model.layers.{layer}.{norm}.weight", "layers_{layer}/{norm}/scale", "copy"),
    ("model.norm.weight", "norm/scale", "copy"),
    ("lm_head.weight", "lm_head/kernel", "transpose"),
)
_PLACEHOLDERS = {"layer": r"\d+", "qkv": "q|k|v", "mlp": "gate|up|down",
                 "norm": "input_layernorm|post_attention_layernorm"}
# Buffers some exporters save; they carry no parameters.
IGNORED_HF_KEYS = (re.compile(r".*\.rotary_emb\.inv_freq"),)


def _template_regex(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)  # literal, name, literal, name, ...
    pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_PLACEHOLDERS[p]})"
                      for i, p in enumerate(parts))
    return re.compile(pattern)


_HF_TO_OURS = [(_template_regex(hf), ours, t) for hf, ours, t in KEY_MAP]
_OURS_TO_HF = [(_template_regex(ours), hf, t) for hf, ours, t in KEY_MAP]


def hf_to_ours_key(hf_key: str) -> tuple[str, str] | None:
    """(our path, transform name) for an HF tensor name, or None when no rule matches."""
    for regex, template, transform in _HF_TO_OURS:
        m = regex.fullmatch(hf_key)
        if m:
            return template.format(**m.groupdict()), transform
    return None


def ours_to_hf_key(path: str) -> tuple[str, str]:
    for regex, template, transform in _OURS_TO_HF:
        m = regex.fullmatch(path)
        if m:
            return template.format(**m.groupdict()), transform
    raise KeyError(f"no Hugging Face name for parameter {path!r}")


# Layout transforms between torch's [out, in] Linear weights and our [in, *out] kernels.
# Each: (hf shape from our shape, ours from hf array + our shape, hf from our array).
_Transform = tuple[Callable, Callable, Callable]
TRANSFORMS: dict[str, _Transform] = {
    "copy": (lambda s: tuple(s), lambda w, s: w, lambda x: x),
    "transpose": (lambda s: tuple(s[::-1]), lambda w, s: w.T, lambda x: x.T),
    # q/k/v kernel [H, n, D] <-> weight [n*D, H]
    "in_heads": (lambda s: (s[1] * s[2], s[0]), lambda w, s: w.T.reshape(s),
                 lambda x: x.reshape(x.shape[0], -1).T),
    # q/k/v bias [n, D] <-> [n*D]
    "heads": (lambda s: (s[0] * s[1],), lambda w, s: w.reshape(s), lambda x: x.reshape(-1)),
    # o_proj kernel [n, D, H] <-> weight [H, n*D]
    "out_heads": (lambda s: (s[2], s[0] * s[1]), lambda w, s: w.T.reshape(s),
                  lambda x: x.reshape(-1, x.shape[-1]).T),
}


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not fit the architecture in its config.json."""


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        path = f"{prefix}/{k}" if prefix else k
        out.update(_flatten(v, path) if isinstance(v, dict) else {path: v})
    return out


def _unflatten(flat: dict[str, Any]) -> dict:
    tree: dict = {}
    for path, v in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


def checkpoint_files(hf_dir: str | os.PathLike) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it (single file or sharded index)."""
    hf_dir = Path(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: hf_dir / f for k, f in weight_map.items()}
    files = [hf_dir / "model.safetensors"] if (hf_dir / "model.safetensors").exists() \
        else sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no model.safetensors, model.safetensors.index.json or "
                                f"*.safetensors in {hf_dir}")
    out = {}
    for f in files:
        with safe_open(f, framework="numpy") as st:
            out.update({k: f for k in st.keys()})
    return out


def _plan(config: Qwen2Config, files: dict[str, Path]) -> dict[str, tuple[str, str, tuple]]:
    """Checks names and shapes (metadata only) -> {our path: (hf key, transform, our shape)}."""
    expected = {p: tuple(s.shape) for p, s in _flatten(param_shapes(config)).items()}
    plan, unexpected, wrong = {}, [], []
    shapes: dict[str, tuple] = {}
    for f in sorted(set(files.values())):
        with safe_open(f, framework="numpy") as st:
            shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()
                           if files.get(k) == f})
    for key in sorted(files):
        if key not in shapes:
            wrong.append(f"  {key}: listed in the index but absent from {files[key].name}")
            continue
        mapped = hf_to_ours_key(key)
        if mapped is None or mapped[0] not in expected:
            if any(r.fullmatch(key) for r in IGNORED_HF_KEYS):
                continue
            if key == "lm_head.weight" and config.tie_word_embeddings:
                continue  # tied: the output layer is the embedding
            unexpected.append(key)
            continue
        path, transform = mapped
        want = TRANSFORMS[transform][0](expected[path])
        if shapes[key] != want:
            wrong.append(f"  {key} (-> {path}): expected shape {want}, found {shapes[key]}")
        plan[path] = (key, transform, expected[path])
    missing = [f"{ours_to_hf_key(p)[0]} (-> {p})" for p in sorted(expected) if p not in plan]
    if wrong or missing or unexpected:
        lines = [f"checkpoint does not match its config ({config.num_hidden_layers} layers, "
                 f"hidden {config.hidden_size}, vocab {config.vocab_size}, "
                 f"tied={config.tie_word_embeddings}):"]
        if wrong:
            lines += ["wrong shapes:", *wrong]
        if missing:
            lines += ["missing tensors:", *[f"  {m}" for m in missing]]
        if unexpected:
            lines += ["unexpected tensors:", *[f"  {u}" for u in unexpected]]
        raise CheckpointMismatchError("\n".join(lines))
    return plan


def _place(arr: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
    if sharding is None:
        return jnp.asarray(arr)
    # Each device (and, multi-host, each process) copies only its own slice.
    return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def load_hf_checkpoint(hf_dir: str | os.PathLike, dtype: Any = jnp.float32,
                       shardings: Any = None) -> tuple[Qwen2Config, Params]:
    """Reads config.json + safetensors from `hf_dir` -> (config, params) in `dtype`.

    shardings: optional tree like the params with a `jax.sharding.Sharding` per leaf; each
    tensor then goes straight onto its sharding. Raises CheckpointMismatchError naming every
    wrong-shaped, missing or unexpected tensor.
    """
    hf_dir = Path(hf_dir)
    config_path = hf_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no config.json in {hf_dir}")
    config = config_from_hf_dict(json.loads(config_path.read_text()), dtype=dtype)
    files = checkpoint_files(hf_dir)
    plan = _plan(config, files)
    flat_shardings = _flatten(shardings) if shardings is not None else {}
    np_dtype = jnp.dtype(dtype)
    by_file: dict[Path, list[str]] = {}
    for path, (key, _, _) in plan.items():
        by_file.setdefault(files[key], []).append(path)
    flat = {}
    for f, paths in sorted(by_file.items()):
        with safe_open(f, framework="numpy") as st:
            for path in paths:
                key, transform, shape = plan[path]
                arr = TRANSFORMS[transform][1](st.get_tensor(key), shape)
                arr = np.ascontiguousarray(arr.astype(np_dtype, copy=False))
                flat[path] = _place(arr, flat_shardings.get(path))
    return config, _unflatten(flat)


# ---------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------


def _check_params(config: Qwen2Config, params: Params) -> dict[str, Any]:
    flat = _flatten(params)
    expected = {p: tuple(s.shape) for p, s in _flatten(param_shapes(config)).items()}
    problems = [f"  {p}: missing" for p in sorted(expected) if p not in flat]
    problems += [f"  {p}: unexpected" for p in sorted(flat) if p not in expected]
    problems += [f"  {p}: expected shape {expected[p]}, found {tuple(flat[p].shape)}"
                 for p in sorted(flat) if p in expected and tuple(flat[p].shape) != expected[p]]
    if problems:
        raise CheckpointMismatchError("params do not match the config:\n" + "\n".join(problems))
    return flat


def save_hf_checkpoint(config: Qwen2Config, params: Params, out_dir: str | os.PathLike,
                       dtype: Any = None, max_shard_bytes: int | None = None) -> Path:
    """Writes config.json + safetensors (sharded with an index past `max_shard_bytes`).

    dtype defaults to the params' own dtype. The directory loads with transformers'
    `Qwen2ForCausalLM.from_pretrained` (and so with vLLM).
    """
    flat = _check_params(config, params)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    np_dtype = jnp.dtype(dtype) if dtype is not None else jnp.dtype(flat["norm/scale"].dtype)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for path in sorted(flat, key=_hf_order):
        key, transform = ours_to_hf_key(path)
        arr = np.asarray(jax.device_get(flat[path]))
        arr = np.ascontiguousarray(TRANSFORMS[transform][2](arr).astype(np_dtype, copy=False))
        if max_shard_bytes and shards[-1] and size + arr.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = arr
        size += arr.nbytes
    for stale in list(out_dir.glob("model*.safetensors")) + [
            out_dir / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out_dir / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
        total = sum(a.nbytes for s in shards for a in s.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out_dir / "config.json").write_text(
        json.dumps(config_to_hf_dict(config, np_dtype), indent=2) + "\n")
    return out_dir


def _hf_order(path: str):
    """Embedding first, then layers in numeric order, then final norm and head (as HF writes)."""
    m = re.match(r"layers_(\d+)/", path)
    if m:
        return (1, int(m.group(1)), path)
    return (0 if path.startswith("embed") else 2, 0, path)


# ---------------------------------------------------------------------------------------------
# Orbax (params + JSON metadata holding the config)
# ---------------------------------------------------------------------------------------------

ORBAX_FORMAT = "rl4mle_jax.params/v1"


def save_params_orbax(params: Params, config: Qwen2Config, out_dir: str | os.PathLike,
                      step: int = 0, extra_meta: dict[str, Any] | None = None) -> Path:
    """Writes items `params` (StandardSave) and `meta` ({"format", "config", ...}) at `step`."""
    import orbax.checkpoint as ocp

    _check_params(config, params)
    out_dir = Path(out_dir).absolute()
    meta = {"format": ORBAX_FORMAT, "config": config_to_dict(config), **(extra_meta or {})}
    mngr = ocp.CheckpointManager(out_dir, options=ocp.CheckpointManagerOptions(create=True))
    mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                            meta=ocp.args.JsonSave(meta)), force=True)
    mngr.wait_until_finished()
    mngr.close()
    return out_dir


def _dict_paths_with(tree: Any, key: str, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of every dict in `tree` (nested dicts/lists) that has `key`."""
    if isinstance(tree, dict):
        found = [path] if key in tree else []
        for k, v in tree.items():
            found += _dict_paths_with(v, key, (*path, str(k)))
        return found
    if isinstance(tree, list | tuple):
        return [p for i, v in enumerate(tree) for p in _dict_paths_with(v, key, (*path, str(i)))]
    return []


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        tree = tree[int(k)] if isinstance(tree, list | tuple) else tree[k]
    return tree


# Where a train state keeps the policy, tried in order (optimizer moments and a critic trunk
# have the same tree, so "the first dict with embed_tokens" would be wrong).
_STATE_PARAMS_PATHS = ("policy_params", "params", "policy")


def load_params_orbax(ckpt_dir: str | os.PathLike, step: int | None = None, dtype: Any = None,
                      shardings: Any = None, *, config: Qwen2Config | None = None,
                      params_path: str | None = None) -> tuple[Qwen2Config, Params]:
    """Reads (config, params) written by `save_params_orbax` (latest step unless given).

    Also reads the policy out of a train-state checkpoint (items `state` + `meta`): the params
    are at `params_path` ("/"-joined inside the item; default: the first of policy_params,
    params, policy that exists) and only they are read. The config comes from `config` or else
    from a dict with "vocab_size" and "num_hidden_layers" in `meta`. dtype defaults to the
    config's param_dtype; shardings: optional tree like the params of `Sharding`s.
    """
    import orbax.checkpoint as ocp

    ckpt_dir = Path(ckpt_dir).absolute()
    step = ocp.CheckpointManager(ckpt_dir).latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no orbax checkpoint steps in {ckpt_dir}")
    where = f"{ckpt_dir}/{step}"
    items = sorted(p.name for p in (ckpt_dir / str(step)).iterdir() if p.is_dir())
    item = "params" if "params" in items else "state" if "state" in items else None
    if item is None:
        raise FileNotFoundError(f"{where} has neither a 'params' nor a 'state' item ({items})")
    handlers = {name: ocp.JsonCheckpointHandler() if name == "meta"
                else ocp.PyTreeCheckpointHandler() for name in items}
    mngr = ocp.CheckpointManager(ckpt_dir, item_handlers=handlers)
    if config is None:
        meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"] \
            if "meta" in items else {}
        found = [p for p in _dict_paths_with(meta, "vocab_size")
                 if "num_hidden_layers" in _get(meta, p)]
        if not found:
            raise ValueError(f"{where}/meta holds no model config (a dict with vocab_size and "
                             f"num_hidden_layers); pass config=")
        config = config_from_dict(_get(meta, found[0]))
    if dtype is not None:
        config = config.replace(param_dtype=jnp.dtype(dtype).name)
    saved = mngr.item_metadata(step)[item]
    saved = getattr(saved, "tree", saved)
    if params_path is not None:
        prefix = tuple(p for p in params_path.split("/") if p)
    elif item == "params":
        prefix = ()
    else:
        prefix = next(((p,) for p in _STATE_PARAMS_PATHS
                       if isinstance(saved, dict) and p in saved), None)
        if prefix is None:
            options = ["/".join(p) for p in _dict_paths_with(saved, "embed_tokens")]
            raise ValueError(f"{where}/state: no {' / '.join(_STATE_PARAMS_PATHS)}; pass "
                             f"params_path= (trees with embed_tokens: {options})")
    flat_shardings = _flatten(shardings) if shardings is not None else {}
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    flat_shapes = _flatten(param_shapes(config))
    target = _unflatten({p: jax.ShapeDtypeStruct(s.shape, config.params_dtype,
                                                 sharding=flat_shardings.get(p, default))
                         for p, s in flat_shapes.items()})
    restore_args = jax.tree.map(
        lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype), target)
    for k in reversed(prefix):
        target, restore_args = {k: target}, {k: restore_args}
    restored = mngr.restore(step, args=ocp.args.Composite(**{item: ocp.args.PyTreeRestore(
        item=target, restore_args=restore_args, partial_restore=bool(prefix))}))[item]
    mngr.close()
    params = _to_plain(_get(restored, prefix))
    _check_params(config, params)
    return config, params


def _to_plain(tree: Any) -> Any:
    return {k: _to_plain(v) for k, v in tree.items()} if isinstance(tree, dict) else tree
