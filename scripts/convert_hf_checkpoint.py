"""Convert a Hugging Face Qwen2 checkpoint to an orbax params checkpoint, or back.

HF -> orbax:  python scripts/convert_hf_checkpoint.py --hf_dir HF_DIR --out ORBAX_DIR
              [--dtype bfloat16]
orbax -> HF:  python scripts/convert_hf_checkpoint.py --to_hf --ckpt_dir ORBAX_DIR --out HF_DIR
              [--dtype bfloat16] [--step N] [--max_shard_bytes 5000000000]
              [--tokenizer_dir DIR]
The orbax checkpoint holds items `params` and `meta` (JSON with the model config); see
`rl4mle_jax.models.convert.save_params_orbax`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import jax.numpy as jnp

from rl4mle_jax.models.convert import (
    config_from_hf_dict,
    load_hf_checkpoint,
    load_params_orbax,
    save_hf_checkpoint,
    save_params_orbax,
)
from rl4mle_jax.models.presets import get_preset

# Files besides the weights that make an HF directory usable (tokenizer, generation defaults).
_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
               "merges.txt", "generation_config.json", "chat_template.jinja", "added_tokens.json")


def _copy_side_files(src: Path, dst: Path) -> list[str]:
    copied = []
    for name in _SIDE_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hf_dir", help="HF checkpoint directory (input of HF -> orbax)")
    p.add_argument("--ckpt_dir", "--orbax_dir", dest="ckpt_dir",
                   help="orbax checkpoint directory (input of --to_hf)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--to_hf", action="store_true", help="convert orbax -> HF instead")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: keep)")
    p.add_argument("--step", type=int, default=None, help="orbax step (default: latest)")
    p.add_argument("--max_shard_bytes", type=int, default=None, help="shard HF safetensors")
    p.add_argument("--tokenizer_dir", default=None,
                   help="copy tokenizer/generation files from here into the HF output")
    p.add_argument("--params_path", default=None,
                   help="--to_hf from a train state: '/'-joined path of the policy params "
                        "inside the `state` item (default: policy_params or params)")
    p.add_argument("--hf_config", default=None,
                   help="--to_hf: HF dir (or config.json) giving the model config when the "
                        "checkpoint metadata has none")
    p.add_argument("--preset", default=None, help="--to_hf: model preset name, as --hf_config")
    args = p.parse_args(argv)
    if args.to_hf and not args.ckpt_dir:
        p.error("--to_hf needs --ckpt_dir")
    if not args.to_hf and not args.hf_dir:
        p.error("HF -> orbax needs --hf_dir")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    if args.to_hf:
        config = None
        if args.hf_config:
            path = Path(args.hf_config)
            path = path / "config.json" if path.is_dir() else path
            config = config_from_hf_dict(json.loads(path.read_text()))
        elif args.preset:
            config = get_preset(args.preset)
        config, params = load_params_orbax(args.ckpt_dir, step=args.step, config=config,
                                           params_path=args.params_path)
        save_hf_checkpoint(config, params, out, dtype=args.dtype,
                           max_shard_bytes=args.max_shard_bytes)
        copied = _copy_side_files(Path(args.tokenizer_dir), out) if args.tokenizer_dir else []
        summary = {"direction": "orbax->hf", "out": str(out), "copied": copied}
    else:
        dtype = jnp.dtype(args.dtype) if args.dtype else _checkpoint_dtype(Path(args.hf_dir))
        config, params = load_hf_checkpoint(args.hf_dir, dtype=dtype)
        save_params_orbax(params, config, out, step=args.step or 0,
                          extra_meta={"source_hf_dir": str(Path(args.hf_dir).absolute())})
        summary = {"direction": "hf->orbax", "out": str(out), "dtype": config.param_dtype}
    summary["config"] = config.__dict__
    print(json.dumps(summary, indent=1, default=str))
    return summary


def _checkpoint_dtype(hf_dir: Path) -> jnp.dtype:
    """The dtype config.json declares (v5 `dtype`, v4 `torch_dtype`), float32 if none."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return jnp.dtype(name if name in ("float32", "bfloat16", "float16") else "float32")


if __name__ == "__main__":
    main(sys.argv[1:])
