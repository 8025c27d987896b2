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
there was >= the gate (a failure the gated term can reach) or not; and, under the warm start and
each run's final checkpoint, the mean probability of that failing token and how often it is the
top token itself (a confident mistake, which the gated term sharpens instead of removing), with
the most frequent failure starts in their context.

`--fork TEXT --fork_token TOKEN`: in the failed episodes whose code holds TEXT + TOKEN (a confident
mistake, e.g. `GridSearchCV(LogisticRegression(max_iter=1` + `)\n` on food-reviews), the
probability of TOKEN after the response up to TEXT, under the warm start and each run's final
checkpoint (docs/sweep_agree/flip.md).

`--kind improve` does all of this for the improve episodes instead, each teacher-forced after
its own improve prompt (rebuilt from its parent episode's code and outcome in the same log).

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
_KIND = flags.DEFINE_enum("kind", "solve", ["solve", "improve"], "Which episodes: solve, or "
                          "improve (each after the improve prompt of its parent episode).")
_TOP = flags.DEFINE_integer("top", 8, "List this many of the most frequent failure starts.")
_FORK = flags.DEFINE_string("fork", None, "With --fork_token: the response text before a "
                            "confident mistake's token.")
_FORK_TOKEN = flags.DEFINE_string("fork_token", None, "The mistaken token after --fork (one "
                                  "token; Python escapes such as \\n are read).")
_ERROR_LINE = flags.DEFINE_bool("error_line", False, "Only the failures with a syntax error "
                                "line (the episode's credit_span, where re-encoding its text "
                                "gives the sampled tokens' count) and their least likely token "
                                "on that line.")


# What makes the warm start and the prompt: every run measured must agree with the programs' run.
_SAME = ("task", "tasks", "data_root", "model", "prompt", "warmstart", "sampling")


def _config(workdir: Path):
    """The run's own settings over today's defaults (as experiments/evaluate.py reads them)."""
    config = task_config.get_config()
    config.update(json.loads((workdir / "config.json").read_text()))
    return config


def _episodes(workdirs: list[Path], kind: str = "solve") -> list[dict]:
    """The episodes of `kind` with a record and code; an improve episode carries its parent
    (`_parent`: the episode of the same log whose code and outcome its prompt showed) and is
    left out when the log does not hold that parent."""
    rows = []
    for wd in workdirs:
        with open(wd / "experience.jsonl", encoding="utf-8") as f:
            logged = [r for r in map(json.loads, f) if r.get("record") and r.get("code")]
        by_id = {r.get("episode_id"): r for r in logged}
        for r in logged:
            if r.get("kind") != kind:
                continue
            if kind == "improve":
                parent = by_id.get(r.get("parent_episode"))
                if parent is None:
                    continue
                r = {**r, "_parent": parent}
            rows.append(r)
    return rows


def _encode(comps, episodes: list[dict]) -> list[tuple[list[int], int]]:
    """(prompt + response ids, prompt length) per episode, the response as the agent writes it
    after the prompt the loop showed it (episode.py: solve, or improve on its parent)."""
    tok = comps.tokenizer
    kw = dict(cfg=comps.prompt_cfg, chat_template=tok.apply_chat_template if tok.is_chat else None,
              count_tokens=lambda s: len(tok.encode(s)))
    solve_ids = tok.encode(prompts_lib.solve_prompt(comps.context, **kw).text)
    out = []
    for e in episodes:
        parent = e.get("_parent")
        prompt_ids = solve_ids if parent is None else tok.encode(prompts_lib.improve_prompt(
            comps.context, parent["code"], parent["record"], **kw).text)
        response_ids = tok.encode(render_response(e["plan"] or "", e["code"] or ""))
        out.append((prompt_ids + response_ids, len(prompt_ids)))
    return out


def failure_starts(dists, spans=None) -> list[tuple[int, float]]:
    """Per failed program (its response's log-probs and held tokens' log-probs under the warm
    start): the position of its least likely held token and that token's probability; within
    its span [a, b) of response positions where `spans` gives one (the error line)."""
    out = []
    for k, (_, held) in enumerate(dists):
        a, b = spans[k] if spans is not None and spans[k] is not None else (0, len(held))
        i = a + int(np.argmin(held[a:b]))
        out.append((i, float(np.exp(held[i]))))
    return out


def held_at(dists, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The held token's probability at each program's `positions` entry, and whether it is the
    top token there."""
    p = np.array([np.exp(held[i]) for (_, held), i in zip(dists, positions)])
    top = np.array([np.isclose(d[i].max(), held[i]) for (d, held), i in zip(dists, positions)])
    return p, top


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


def fork_sequences(comps, failed: list[dict], text: str, token: str
                   ) -> list[tuple[list[int], int]]:
    """Per failed episode whose code holds `text` + `token`: its prompt and response up to
    `text`, then `token`'s id, as (ids, prompt length) for `distributions` (whose last held
    log-prob is then the token's after the prefix). `token` must be one token after `text`."""
    tok = comps.tokenizer
    ids = tok.encode(text + token)
    if ids[:-1] != tok.encode(text):
        raise SystemExit(f"--fork_token {token!r} is not one token after --fork {text!r}")
    rows = [e for e in failed if text + token in (e["code"] or "")]
    out = []
    for e, (seq, plen) in zip(rows, _encode(comps, rows)):
        response = render_response(e["plan"] or "", e["code"] or "")
        # the occurrence in the code that the token follows (not one in the plan, nor an
        # earlier one in the code that goes on otherwise)
        code_at = response.index(e["code"].rstrip())
        cut = response.index(text + token, code_at) + len(text)
        out.append((seq[:plen] + tok.encode(response[:cut]) + [ids[-1]], plen))
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
    if bool(_FORK.value) != bool(_FORK_TOKEN.value):
        raise app.UsageError("--fork and --fork_token go together")
    compile_cache.enable()
    programs = [Path(p) for p in _PROGRAMS.value]
    config = _config(programs[0])
    comps = build_components(config, programs[0])
    temperature = config.sampling.temperature
    trunc = truncation_settings(config.sampling)
    kind = _KIND.value
    episodes = _episodes(programs, kind)
    valid = [e for e in episodes if e["record"]["status"] == "valid"][:_N.value]
    failed = [e for e in episodes if e["record"]["status"] == "failure"]
    if not valid:
        raise SystemExit(f"no valid {kind} episodes in {', '.join(map(str, programs))}")
    seqs = _encode(comps, valid)
    base = _measure(comps, comps.params, seqs, temperature, trunc)
    confident = [d.max(axis=-1) >= np.log(_GATE.value) for d, _ in base]
    c = np.concatenate(confident)
    print(f"{len(valid)} valid {kind} programs from {', '.join(map(str, programs))}; "
          f"{c.size} response tokens, {c.mean():.1%} at confident positions (warm start's "
          f"top token >= {_GATE.value}); T = {temperature}, truncation {trunc}\n")
    print("| policy | entropy, confident | entropy, uncertain | tail mass, confident | "
          "confident share of the entropy |")
    print("|---|---|---|---|---|")
    print(_row("warm start", base, confident))
    policies = []
    for run_dir in map(Path, _RUNS.value):
        run_config = _config(run_dir)
        for key in _SAME:
            if run_config[key] != config[key]:
                raise SystemExit(f"{run_dir}: config.{key} differs from {programs[0]}'s (the "
                                 "positions are those of one warm start on one task)")
        step = ocp.CheckpointManager((run_dir / "checkpoints").absolute()).latest_step()
        # Only the policy of the latest train state (no learner, optimiser or critic).
        _, policy = load_params_orbax(run_dir / "checkpoints", step, config=comps.model_config)
        policies.append((f"{run_dir} (step {step})", policy))
        dists = _measure(comps, policy, seqs, temperature, trunc)
        print(_row(policies[-1][0], dists, confident))

    if failed and _FORK.value:
        token = _FORK_TOKEN.value.encode().decode("unicode_escape")
        fork_seqs = fork_sequences(comps, failed, _FORK.value, token)
        print(f"\n{len(fork_seqs)} failed {kind} programs hold {_FORK.value + token!r}; the "
              f"probability of {token!r} after {_FORK.value!r}:\n")
        print("| policy | median | mean | share >= the gate |\n|---|---|---|---|")
        for name, params in [("warm start", comps.params), *policies]:
            p = np.array([np.exp(held[-1]) for _, held in _measure(
                comps, params, fork_seqs, temperature, trunc)])
            if len(p):
                print(f"| {name} | {np.median(p):.3f} | {p.mean():.3f} | "
                      f"{(p >= _GATE.value).mean():.2f} |")

    if failed:
        fail_seqs = _encode(comps, failed)
        spans = None
        if _ERROR_LINE.value:
            # the sampled response's tokens end with the stop token when it stopped
            keep = [k for k, (e, (ids, plen)) in enumerate(zip(failed, fail_seqs))
                    if e.get("credit_span") and len(ids) - plen
                    == e.get("response_tokens", 0) - bool(e.get("response_stopped"))]
            failed, fail_seqs = [failed[k] for k in keep], [fail_seqs[k] for k in keep]
            spans = [tuple(e["credit_span"]) for e in failed]
        fails = _measure(comps, comps.params, fail_seqs, temperature, trunc)
        starts = failure_starts(fails, spans)
        pos = [i for i, _ in starts]
        tops = np.array([np.exp(d[i].max()) for (d, _), i in zip(fails, pos)])
        print(f"\nWhere {len(failed)} failed {kind} programs start (their least likely token "
              f"under the warm start): the top token there >= {_GATE.value} in "
              f"{int((tops >= _GATE.value).sum())}, >= 0.8 in {int((tops >= 0.8).sum())}.")
        print("\n| policy | failing token's probability there (mean) | the failing token is the "
              "top one | and >= the gate |\n|---|---|---|---|")
        for name, params in [("warm start", comps.params), *policies]:
            dists = fails if params is comps.params else _measure(comps, params, fail_seqs,
                                                                   temperature, trunc)
            p, top = held_at(dists, pos)
            if not len(p):
                break
            print(f"| {name} | {p.mean():.3f} | {int(top.sum())} of {len(p)} | "
                  f"{int((top & (p >= _GATE.value)).sum())} |")
        tok = comps.tokenizer
        counts: dict[str, list[float]] = {}
        for (ids, plen), (i, p) in zip(fail_seqs, starts):
            at = plen + i
            where = (repr(tok.decode(ids[max(plen, at - 8):at])) + " -> "
                     + repr(tok.decode(ids[at:at + 1])))
            counts.setdefault(where, []).append(p)
        print(f"\nThe {_TOP.value} most frequent failure starts (context -> failing token: "
              "count, its mean probability under the warm start):")
        for where, ps in sorted(counts.items(), key=lambda kv: -len(kv[1]))[:_TOP.value]:
            print(f"- {where}: {len(ps)}, {np.mean(ps):.3f}")


if __name__ == "__main__":
    flags.mark_flag_as_required("programs")
    app.run(main)
