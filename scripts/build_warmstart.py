"""Build (or load from cache) the warm-started tiny model for local tasks; prints its stats.

    python scripts/build_warmstart.py --task food-reviews [--out DIR] [--set steps=60 ...]
"""

from __future__ import annotations

import argparse
import json
import sys

from rl4mle_jax.warmstart import WarmStartConfig, build_warmstart, default_warmstart_dir


def _parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a bare string, e.g. sandbox_backend=subprocess
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", action="append", required=True, help="task id (repeatable)")
    ap.add_argument("--out", default=None, help=f"cache directory (default "
                                                f"{default_warmstart_dir()})")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="WarmStartConfig override, value parsed as JSON when it can be")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = ap.parse_args(argv)
    try:
        config = WarmStartConfig.from_mapping(_parse_sets(args.set))
    except (TypeError, ValueError) as e:
        raise SystemExit(f"bad --set: {e}") from None
    ws = build_warmstart(args.task, args.out or default_warmstart_dir(), config,
                         force=args.force, log=lambda s: print(s, file=sys.stderr))
    print(json.dumps({"hf_dir": str(ws.hf_dir), "cached": ws.cached, **ws.stats}, indent=2,
                     default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
