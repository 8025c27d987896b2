"""Where a policy's token entropy sits, and where its failures start (docs/sweep_gate).

Teacher-forces a fixed set of programs (the valid solve episodes of `--programs` runs, rendered
as the agent's answer to the solve prompt) through the warm start and through each run's final
checkpoint, at the sampling temperature and truncation of training, and splits the response
positions by the warm start's most likely token: "confident" where its probability is >=
`--gate` (the positions `learner.entropy_gate` lets the entropy term sharpen), "uncertain"
elsewhere. Per policy it prints the mean token entropy at each kind of position and the mean
probability outside the top token at the confident ones (the tail a garbled line is drawn from).

Then, for the failed solve episodes of the `--programs` runs, where each failure starts: the
failed program's least likely token under the warm start, and whether the warm start's top token
there was >= the gate (a failure the gated term can reach) or not.

  python scripts/analyse_entropy_positions.py --programs workdirs/old/seed5 \
      --runs workdirs/lc567/gate0p9_m2/seed5,workdirs/lc567/gate0p9_m2/seed6 --n 60

Every run must have the first `--programs` run's task, model, prompt, warm start and sampling
settings (checked). About 25 s on 2 cores for 60 programs and three checkpoints.
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

from configs import task as task_config  # noqa: E402
from rl4mle_jax import compile_cache  # noqa: E402
from rl4mle_jax.components import build_components  # noqa: E402
from rl4mle_jax.env import prompts as prompts_lib  # noqa: E402
from rl4mle_jax.models import qwen2  # noqa: E402
from rl4mle_jax.models.convert import load_params_orbax  # noqa: E402
from rl4mle_jax.rl.learner import truncated_log_softmax  # noqa: E402
from rl4mle_jax.sampling import truncation_settings  # noqa: E402
from rl4mle_jax.warmstart.demo_runs import render_response  # noqa: E402

_PROGRAMS = flags.DEFINE_list("programs", None, "Run workdirs whose solve episodes are the "
                              "fixed programs (valid ones) and the failures (failed ones).")
_RUNS = flags.DEFINE_list("runs", [], "Run workdirs whose final checkpoint is measured.")
_N = flags.DEFINE_integer("n", 60, "At most this many valid programs (the first, in order).")
_GATE = flags.DEFINE_float("gate", 0.9, "A position is confident where the warm start's top "
                           "token has at least this probability.")
_BATCH = flags.DEFINE_integer("batch", 4, "Programs per forward pass.")


# What makes the warm start and the prompt: every run measured must agree with the programs' run.
_SAME = ("task", "tasks", "data_root", "model", "prompt", "warmstart", "sampling")


def _config(workdir: Path):
    """The run's own settings over today's defaults (as experiments/evaluate.py reads them)."""
    config = task_config.get_config()
    config.update(json.loads((workdir / "config.json").read_text()))
    return config


def _episodes(workdirs: list[Path]) -> list[dict]:
    rows = []
    for wd in workdirs:
        with open(wd / "experience.jsonl", encoding="utf-8") as f:
            rows += [r for r in map(json.loads, f)
                     if r.get("kind") == "solve" and r.get("record") and r.get("code")]
    return rows


def _encode(comps, episodes: list[dict]) -> list[tuple[list[int], int]]:
    """(prompt + response ids, prompt length) per episode, the response as the agent writes it."""
    tok = comps.tokenizer
    chat = tok.apply_chat_template if tok.is_chat else None
    prompt = prompts_lib.solve_prompt(comps.context, cfg=comps.prompt_cfg, chat_template=chat,
                                      count_tokens=lambda s: len(tok.encode(s))).text
    prompt_ids = tok.encode(prompt)
    out = []
    for e in episodes:
        response_ids = tok.encode(render_response(e["plan"] or "", e["code"] or ""))
        out.append((prompt_ids + response_ids, len(prompt_ids)))
    return out


def distributions(model_config, pad_id: int, params, seqs, temperature: float, trunc: dict,
                  batch: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per (ids, prompt length) in `seqs`: the response positions' log-probs [R, V] of the
    tempered, truncated distribution the learner trains (`rl.learner.truncated_log_softmax`), and
    the log-prob of each held token [R]."""

    @jax.jit
    def run(params, tokens, mask):
        x = qwen2.logits(model_config, params, tokens, mask)[:, :-1] / temperature
        return truncated_log_softmax(x, tokens[:, 1:], trunc["top_k"], trunc["top_p"],
                                     trunc["min_p"])

    out = []
    for i in range(0, len(seqs), batch):
        chunk = seqs[i:i + batch]
        width = max(len(s) for s, _ in chunk)
        width += -width % 64  # a few shapes only
        tokens = np.full((len(chunk), width), pad_id, np.int32)
        mask = np.zeros_like(tokens)
        for j, (s, _) in enumerate(chunk):  # left-padded, as qwen2.logits expects
            tokens[j, width - len(s):], mask[j, width - len(s):] = s, 1
        logp = np.asarray(run(params, jnp.asarray(tokens), jnp.asarray(mask)))
        for j, (s, p) in enumerate(chunk):
            first = width - len(s) + p - 1  # the position that predicts the first response token
            rows = logp[j, first:width - 1]
            out.append((rows, rows[np.arange(len(rows)), np.asarray(s[p:])]))
    return out


def entropy(logp: np.ndarray) -> np.ndarray:
    """Entropy of each row of log-probs [..., V] (-inf entries add 0)."""
    p = np.exp(logp)
    return -np.sum(p * np.where(p > 0, logp, 0.0), axis=-1)


def split(dists, confident) -> dict[str, float]:
    """Mean entropy at the confident and the other positions, the mean probability outside the
    top token at the confident ones, and the confident positions' share of the entropy."""
    ent = np.concatenate([entropy(d) for d, _ in dists])
    tail = np.concatenate([1 - np.exp(d.max(axis=-1)) for d, _ in dists])
    c = np.concatenate(confident)
    return {"entropy_confident": float(ent[c].mean()), "entropy_uncertain": float(ent[~c].mean()),
            "tail_confident": float(tail[c].mean()), "confident_share": float(ent[c].sum()
                                                                              / ent.sum())}


def _row(name: str, dists, confident) -> str:
    s = split(dists, confident)
    return (f"| {name} | {s['entropy_confident']:.4f} | {s['entropy_uncertain']:.3f} | "
            f"{s['tail_confident']:.4f} | {s['confident_share']:.1%} |")


def _measure(comps, params, seqs, temperature, trunc):
    return distributions(comps.model_config, comps.tokenizer.pad_id, params, seqs, temperature,
                         trunc, _BATCH.value)


def main(argv):
    del argv
    compile_cache.enable()
    programs = [Path(p) for p in _PROGRAMS.value]
    config = _config(programs[0])
    comps = build_components(config, programs[0])
    temperature = config.sampling.temperature
    trunc = truncation_settings(config.sampling)
    episodes = _episodes(programs)
    valid = [e for e in episodes if e["record"]["status"] == "valid"][:_N.value]
    failed = [e for e in episodes if e["record"]["status"] == "failure"]
    if not valid:
        raise SystemExit(f"no valid solve episodes in {', '.join(map(str, programs))}")
    seqs = _encode(comps, valid)
    base = _measure(comps, comps.params, seqs, temperature, trunc)
    confident = [d.max(axis=-1) >= np.log(_GATE.value) for d, _ in base]
    c = np.concatenate(confident)
    print(f"{len(valid)} valid solve programs from {', '.join(map(str, programs))}; "
          f"{c.size} response tokens, {c.mean():.1%} at confident positions (warm start's "
          f"top token >= {_GATE.value}); T = {temperature}, truncation {trunc}\n")
    print("| policy | entropy, confident | entropy, uncertain | tail mass, confident | "
          "confident share of the entropy |")
    print("|---|---|---|---|---|")
    print(_row("warm start", base, confident))
    for run_dir in map(Path, _RUNS.value):
        run_config = _config(run_dir)
        for key in _SAME:
            if run_config[key] != config[key]:
                raise SystemExit(f"{run_dir}: config.{key} differs from {programs[0]}'s (the "
                                 "positions are those of one warm start on one task)")
        step = ocp.CheckpointManager((run_dir / "checkpoints").absolute()).latest_step()
        # Only the policy of the latest train state (no learner, optimiser or critic).
        _, policy = load_params_orbax(run_dir / "checkpoints", step, config=comps.model_config)
        dists = _measure(comps, policy, seqs, temperature, trunc)
        print(_row(f"{run_dir} (step {step})", dists, confident))

    if failed:
        fails = _measure(comps, comps.params, _encode(comps, failed), temperature, trunc)
        tops = np.array([np.exp(d[np.argmin(held)].max()) for d, held in fails])
        print(f"\nWhere {len(failed)} failed solve programs start (their least likely token "
              f"under the warm start): the top token there >= {_GATE.value} in "
              f"{int((tops >= _GATE.value).sum())}, >= 0.8 in {int((tops >= 0.8).sum())}.")


if __name__ == "__main__":
    flags.mark_flag_as_required("programs")
    app.run(main)
