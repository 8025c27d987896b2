"""The paper's duration-bias toy in miniature, learned with the project's own PPO code.

    python experiments/duration_bias.py --arrivals pool --seeds 0 1 2 3 4 5 6 7 --budget 3600
    # every weight mode under every arrival process, one table (docs/duration_bias/results.md):
    python experiments/duration_bias.py --seeds 0 1 2 3 4 5 6 7 --budget 3600 \
        --arrivals pool premise cancel admission@0 drop_stale@1 --out_dir docs/duration_bias

Setting (the paper fixes wall-clock time, not steps). One state, three actions:

    fast_fail   reward −10    Δt ≈ 1 s   (a program that crashes)
    fast_valid  score 0.62    Δt ≈ 1 s   (logistic regression)
    slow_valid  score 0.67    Δt ≈ 10 s  (gradient boosting)

K simulated actors run on an event clock: each samples an action from the current policy
(recording its behaviour log-prob), "executes" it for Δt·lognormal(0, jitter) seconds and puts
the finished episode in a queue; episodes are taken in completion order, B at a time, by the
learner, which updates the policy at once (actors pick up the new policy for their next episode,
so in-flight episodes are stale, as in the real loop). The run stops at the wall-clock budget.

The learner is the real learner's default path on one-token episodes: token rewards with the
score at the last (only) response token, GAE with γ = λ = 1 against a learned value baseline
(the critic, trained with the clipped value loss), advantages whitened over the batch, the
clipped PPO surrogate against the behaviour log-probs (ε = 0.2, token-mean), optional DAG
weights (`rl.duration`), gradient clipping by global norm, one update per batch.
With one step and whitening, A_i = (r_i − mean_batch r)/std_batch r: the critic's value cancels.

Why the bias appears (the paper's argument): while failures are common they drag the batch
mean far below both valid actions, so fast_valid and slow_valid get nearly the same large
positive advantage; if the fast one completes about ten times as often (n_x ∝ π_x/Δt_x), it gets
about ten times the gradient and takes the probability mass. Weighting each sample by
Δt_i/mean_batch(Δt) cancels the 1/Δt.

What this toy shows about that premise (see `--arrivals`):
- "pool" (default, how our RolloutPool works): completions follow π, not π/Δt. Each actor's
  episodes are i.i.d. draws from π, so over any long window a fraction π_x of its completions
  are action x (renewal-reward theorem); a slow episode just keeps its actor busy longer. The
  only count bias is the start-up transient (nothing slow can finish in the first ~10 s) and the
  lag of slow episodes. Vanilla PPO therefore ends on slow_valid, after a short detour; DAG then
  weights slow samples by ~Δt beyond what is needed (it would favour a slow *worse* action too).
- "premise": the premise imposed directly (an actor draws x ∝ π_x/Δt_x and reports log π_x).
  Vanilla detours deeply through fast_valid while failures dominate the baseline; DAG's detour is
  shallower and slow_valid wins earlier. Both still end on slow_valid: once failures are gone the
  whitened batch-mean baseline makes the 0.05 gap an O(1) advantage whose sign favours the slow
  action whatever the counts (Σ_i A_i = 0, so the logit gap moves by 2·Σ_{i∈slow} A_i/B > 0).
- "cancel": stragglers are cancelled at each update, so with K > B slow episodes hardly ever
  finish; vanilla collapses onto fast_valid and DAG cannot help (nothing slow to weight).
- "admission" (the loop's run.admission="bounded"; bound (max_staleness + 1)·B, binding here
  at max_staleness 0 since K = B): nothing is lost, batches follow π; like "pool".
- "drop_stale" (the loop's old rule): slow finishers are the stale ones, so they are discarded
  and vanilla collapses onto fast_valid; every Δt weight rescues the slow action.
- "inverse_inclusion" weights by 1/p̂(Δt) of the run's own `rl.arrival.ArrivalModel` (started
  vs trained per Δt bucket): it is vanilla wherever nothing is lost (pool, admission, and
  premise, whose bias is in what is *started*, which no started-vs-trained count can see), and
  it corrects exactly the loss that drop_stale makes. Numbers: docs/duration_bias/results.md.
- With small batches and rare slow samples Δt/mean_batch(Δt) under-corrects: the batch mean is
  a ratio estimator (B = 32: DAG's expected push on fast_valid ≈ 1.3× that on slow_valid at a
  uniform policy under the premise; equal at B = 512).

Optimiser: plain SGD on the three logits by default. A per-coordinate adaptive optimiser (Adam)
on a tabular policy normalises each action's logit step separately, which removes the gradient-
magnitude imbalance that the bias is about (in an LM the actions share parameters, so it does
not); `--optimizer adam` runs that variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import json
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl4mle_jax.rl import advantages as adv_lib
from rl4mle_jax.rl import ppo
from rl4mle_jax.rl.arrival import ArrivalModel
from rl4mle_jax.rl.duration import duration_weights

ACTIONS = ("fast_fail", "fast_valid", "slow_valid")
REWARDS = np.array([-10.0, 0.62, 0.67], np.float32)
DURATIONS_S = np.array([1.0, 1.0, 10.0], np.float32)
# How episodes reach the learner:
#   "pool":    each actor draws every new episode from the current policy (our RolloutPool);
#   "cancel":  as "pool", but at each update every in-flight episode is cancelled and restarted
#              with the new policy: each batch is the first B finishers of a fresh cohort;
#   "premise": the paper's premise imposed directly: an actor draws x with probability
#              ∝ π(x)/Δt_x while the sampler still reports log π(x) as the behaviour log-prob;
#   "admission": the loop's run.admission="bounded": an actor starts an episode only while
#              started-but-untrained episodes (in flight + accepted, not yet trained) number
#              < (max_staleness + 1) × batch_size, else waits for the learner; nothing finished
#              is dropped;
#   "drop_stale": the loop's old rule (run.admission="drop_stale"): as "pool", but a finished
#              episode sampled more than max_staleness policy versions ago is discarded.
ARRIVALS = ("pool", "cancel", "premise", "admission", "drop_stale")
WEIGHT_MODES = ("off", "batch_mean", "log1p", "inverse_inclusion")  # rl.duration's modes


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    # "off" (vanilla), "batch_mean" (the paper's DAG), "log1p" or "inverse_inclusion" (1/p̂ of
    # the run's own rl.arrival.ArrivalModel, as the loop would use it)
    dag_mode: str = "off"
    num_actors: int = 32
    batch_size: int = 32
    budget_s: float = 3600.0
    duration_jitter: float = 0.1  # σ of the lognormal factor on each Δt
    optimizer: str = "sgd"
    lr: float = 0.1
    critic_lr: float = 0.1
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    entropy_coef: float = 0.0
    init_logits: tuple[float, float, float] = (0.0, 0.0, 0.0)
    arrivals: str = "pool"  # see ARRIVALS
    # arrivals="admission": the bound is (max_staleness + 1) × batch_size; "drop_stale": the age
    # (in policy versions) beyond which a finished episode is discarded
    max_staleness: int = 0


class LearnerState(NamedTuple):
    params: dict  # {"actor": logits [3], "critic": value []}
    opt_state: optax.OptState
    step: jax.Array


def _optimizer(name: str, lr: float) -> optax.GradientTransformation:
    if name == "sgd":
        return optax.sgd(lr)
    if name == "adam":
        return optax.adam(lr)
    raise ValueError(f"optimizer {name!r} is not one of ('sgd', 'adam')")


def make_learner(cfg: ToyConfig):
    """(init, update): init() -> state; update(state, actions, old_logprobs, rewards, durations,
    inclusion) (inclusion: p̂ per sample, used by dag_mode="inverse_inclusion" only).

    Cached on the fields the learner uses, so runs that differ only in the clock share one jit.
    """
    return _make_learner(dataclasses.replace(cfg, budget_s=0.0, arrivals="pool", num_actors=0,
                                             duration_jitter=0.0, max_staleness=0))


@functools.lru_cache(maxsize=16)
def _make_learner(cfg: ToyConfig):
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.multi_transform({"actor": _optimizer(cfg.optimizer, cfg.lr),
                               "critic": _optimizer(cfg.optimizer, cfg.critic_lr)},
                              {"actor": "actor", "critic": "critic"}))

    def init() -> LearnerState:
        params = {"actor": jnp.asarray(cfg.init_logits, jnp.float32),
                  "critic": jnp.zeros((), jnp.float32)}
        return LearnerState(params, tx.init(params), jnp.zeros((), jnp.int32))

    def loss_fn(params, actions_b, old_logprobs_b, adv_bt, returns_bt, values_old_bt, weights_b):
        mask_bt = jnp.ones_like(adv_bt)  # one response token per episode
        logp_all = jax.nn.log_softmax(params["actor"])
        logprobs_bt = logp_all[actions_b][:, None]
        entropy_bt = jnp.broadcast_to(ppo.entropy_from_logits(params["actor"][None, None]),
                                      adv_bt.shape)
        actor, metrics = ppo.actor_loss(
            logprobs_bt, old_logprobs_b[:, None], adv_bt, mask_bt, sample_weights_b=weights_b,
            entropy_bt=entropy_bt, entropy_coef=cfg.entropy_coef, clip_eps=cfg.clip_eps)
        values_bt = jnp.broadcast_to(params["critic"], adv_bt.shape)
        critic, vf_metrics = ppo.value_loss(values_bt, values_old_bt, returns_bt, mask_bt)
        return actor + critic, {**metrics, **vf_metrics}

    @jax.jit
    def update(state: LearnerState, actions_b, old_logprobs_b, rewards_b, durations_b,
               inclusion_b):
        b = actions_b.shape[0]
        mask_bt = jnp.ones((b, 1), jnp.float32)
        values_old_bt = jnp.broadcast_to(state.params["critic"], (b, 1))
        adv = adv_lib.compute_advantages("gae", rewards_b, mask_bt, values_bt=values_old_bt)
        weights_b = duration_weights(durations_b, cfg.dag_mode, inclusion_b=inclusion_b)
        grads, metrics = jax.grad(loss_fn, has_aux=True)(
            state.params, actions_b, old_logprobs_b, adv.advantages_bt, adv.returns_bt,
            values_old_bt, weights_b)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics["probs"] = jax.nn.softmax(params["actor"])
        return LearnerState(params, opt_state, state.step + 1), metrics

    return init, update


@dataclasses.dataclass
class RunResult:
    times_s: np.ndarray  # [U+1] wall-clock of each update (0 first: the initial policy)
    probs: np.ndarray  # [U+1, 3] policy after each update
    batch_mean_dt: np.ndarray  # [U+1] mean Δt of the batch that update used (nan at 0)
    action_counts: np.ndarray  # [3] completed episodes of each action that reached the learner
    episodes: int  # finished within the budget (trained or not)
    updates: int
    dropped: int = 0  # finished but discarded (arrivals="drop_stale")
    max_unsettled: int = 0  # the most episodes started but not yet trained or dropped at once
    arrival: list[dict] = dataclasses.field(default_factory=list)  # ArrivalModel.table() at end
    final_inclusion: np.ndarray | None = None  # [3] p̂ at each action's nominal Δt, at the end


def simulate(cfg: ToyConfig, seed: int) -> RunResult:
    """One asynchronous run on the event clock until cfg.budget_s of simulated wall-clock.

    Every episode's start, finish and cancellation goes to an `ArrivalModel` (the class the
    loop uses); dag_mode="inverse_inclusion" weights each batch by its p̂ at update time.
    """
    if cfg.arrivals not in ARRIVALS:
        raise ValueError(f"arrivals {cfg.arrivals!r} is not one of {ARRIVALS}")
    init, update = make_learner(cfg)
    rng = np.random.default_rng(seed)
    state = init()
    arrival = ArrivalModel()

    def draw_cdf(probs: np.ndarray) -> np.ndarray:
        q = probs / DURATIONS_S if cfg.arrivals == "premise" else probs
        return np.cumsum(q / q.sum())

    probs = np.asarray(jax.nn.softmax(state.params["actor"]), np.float64)
    cum = draw_cdf(probs)
    heap: list[tuple] = []  # (finish, id, action, logp, Δt, policy version at start)
    counter = 0
    bound = (cfg.max_staleness + 1) * cfg.batch_size
    settled = max_unsettled = 0  # episodes trained or dropped; the most unsettled at once

    def admit() -> bool:
        return cfg.arrivals != "admission" or counter - settled < bound

    def start(now: float) -> None:
        nonlocal counter, max_unsettled
        a = int(min(np.searchsorted(cum, rng.random(), side="right"), 2))
        dt = float(DURATIONS_S[a] * np.exp(cfg.duration_jitter * rng.standard_normal()))
        heapq.heappush(heap, (now + dt, counter, a, float(np.log(probs[a])), dt, len(times) - 1))
        arrival.started(counter, now)
        counter += 1
        max_unsettled = max(max_unsettled, counter - settled)

    times, prob_hist, dts = [0.0], [probs.copy()], [np.nan]
    waiting = cfg.num_actors  # actors without an episode (waiting for admission)
    while waiting and admit():
        start(0.0)
        waiting -= 1
    counts = np.zeros(3, np.int64)
    queue: list[tuple[int, float, float]] = []
    episodes = dropped = 0
    while heap:
        finish, episode_id, a, logp, dt, version = entry = heapq.heappop(heap)
        if finish > cfg.budget_s:
            heapq.heappush(heap, entry)
            break
        episodes += 1
        waiting += 1
        stale = len(times) - 1 - version > cfg.max_staleness
        if cfg.arrivals == "drop_stale" and stale:
            arrival.finished(episode_id, dt, trained=False)
            dropped += 1
            settled += 1
        else:
            arrival.finished(episode_id, dt, trained=True)
            queue.append((a, logp, dt))
        if len(queue) >= cfg.batch_size:
            batch, queue = queue[:cfg.batch_size], queue[cfg.batch_size:]
            actions = np.array([e[0] for e in batch], np.int32)
            counts += np.bincount(actions, minlength=3)
            durations = np.array([e[2] for e in batch], np.float32)
            inclusion = arrival.inclusion(durations, now=finish)
            state, metrics = update(state, actions, np.array([e[1] for e in batch], np.float32),
                                    REWARDS[actions], durations, inclusion)
            settled += len(batch)
            probs = np.asarray(metrics["probs"], np.float64)
            cum = draw_cdf(probs)
            times.append(finish)
            prob_hist.append(probs.copy())
            dts.append(float(durations.mean()))
            if cfg.arrivals == "cancel":
                for end, cancelled_id, _, _, cancelled_dt, _ in heap:
                    arrival.cancelled(cancelled_id, finish - (end - cancelled_dt))
                waiting, settled, heap[:] = waiting + len(heap), settled + len(heap), []
        while waiting and admit():
            start(finish)
            waiting -= 1
    # Still running at the budget: censored at their elapsed time, not lost.
    for end, episode_id, _, _, dt, _ in heap:
        arrival.cancelled(episode_id, max(cfg.budget_s - (end - dt), 0.0), at_shutdown=True)
    return RunResult(np.array(times), np.array(prob_hist), np.array(dts), counts, episodes,
                     len(times) - 1, dropped=dropped, max_unsettled=max_unsettled,
                     arrival=arrival.table(),
                     final_inclusion=arrival.inclusion(DURATIONS_S, now=cfg.budget_s))


def on_grid(result: RunResult, grid_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities [G, 3] and batch mean Δt [G] as step functions of wall-clock."""
    idx = np.searchsorted(result.times_s, grid_s, side="right") - 1
    return result.probs[idx], result.batch_mean_dt[idx]


def slow_wins_at(result: RunResult) -> float:
    """Wall-clock from which slow_valid stays the most probable action (inf if it never does)."""
    not_slow = np.nonzero(result.probs.argmax(1) != 2)[0]
    if len(not_slow) == 0:
        return 0.0
    last = not_slow[-1]
    return float(result.times_s[last + 1]) if last + 1 < len(result.times_s) else float("inf")


def fast_detour_s(result: RunResult) -> float:
    """Wall-clock during which fast_valid is the most probable action (all intervals summed)."""
    ends = np.append(result.times_s[1:], result.times_s[-1])  # the last policy: no length
    return float(np.sum((ends - result.times_s)[result.probs.argmax(1) == 1]))


def fail_unlearned_at(result: RunResult, below: float = 0.05) -> float:
    """Wall-clock from which P(fast_fail) stays below `below` (inf if it never does)."""
    above = np.nonzero(result.probs[:, 0] >= below)[0]
    if len(above) == 0:
        return 0.0
    last = above[-1]
    return float(result.times_s[last + 1]) if last + 1 < len(result.times_s) else float("inf")


def summarise(results: dict[str, list[RunResult]]) -> list[dict]:
    """One row per mode: final probabilities over seeds and which action ends most probable."""
    rows = []
    for mode, runs in results.items():
        final = np.stack([r.probs[-1] for r in runs])  # [S, 3]
        winners = np.bincount(final.argmax(1), minlength=3)
        rows.append({
            "mode": mode, "seeds": len(runs),
            **{f"P({n})": float(final[:, i].mean()) for i, n in enumerate(ACTIONS)},
            **{f"P({n})_std": float(final[:, i].std()) for i, n in enumerate(ACTIONS)},
            **{f"argmax={n}": int(winners[i]) for i, n in enumerate(ACTIONS)},
            "expected_score": float((final @ REWARDS).mean()),
            "peak_P(fast_valid)": float(np.mean([r.probs[:, 1].max() for r in runs])),
            "slow_wins_at_s": float(np.median([slow_wins_at(r) for r in runs])),
            "fast_detour_s": float(np.median([fast_detour_s(r) for r in runs])),
            "fail_unlearned_at_s": float(np.median([fail_unlearned_at(r) for r in runs])),
            "final_inclusion": np.mean([r.final_inclusion for r in runs], 0).tolist(),
            "final_batch_mean_dt": float(np.nanmean([r.batch_mean_dt[-1] for r in runs])),
            "completed_share": (sum(r.action_counts for r in runs)
                                / max(1, sum(r.action_counts.sum() for r in runs))).tolist(),
            "updates": float(np.mean([r.updates for r in runs])),
            "episodes": float(np.mean([r.episodes for r in runs])),
            "dropped_share": float(np.mean([r.dropped / max(r.episodes, 1) for r in runs])),
        })
    return rows


def _secs(x: float) -> str:
    return f"{x:.0f}s" if np.isfinite(x) else "never"


def format_table(rows: list[dict]) -> str:
    head = (f"{'arrivals/mode':<32}{'seeds':>6}" + "".join(f"{'P(' + n + ')':>17}" for n in ACTIONS)
            + f"{'argmax fail/fast/slow':>23}{'E[score]':>10}{'batch Δt':>10}{'updates':>9}"
            + f"{'completed % fail/fast/slow':>28}{'peak P(fast)':>14}{'slow wins at':>14}"
            + f"{'fast detour':>13}{'fail<5% at':>12}{'p̂ 1s/10s':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        probs = "".join(f"{r[f'P({n})']:>10.3f} ±{r[f'P({n})_std']:5.3f}" for n in ACTIONS)
        wins = "/".join(str(r[f"argmax={n}"]) for n in ACTIONS)
        incl = r["final_inclusion"]
        label = f"{r['arrivals']}/{r['mode']}" if "arrivals" in r else r["mode"]
        lines.append(f"{label:<32}{r['seeds']:>6}{probs}{wins:>23}"
                     f"{r['expected_score']:>10.3f}{r['final_batch_mean_dt']:>10.2f}"
                     f"{r['updates']:>9.0f}"
                     f"{'/'.join(f'{100 * c:.0f}' for c in r['completed_share']):>28}"
                     f"{r['peak_P(fast_valid)']:>14.3f}{_secs(r['slow_wins_at_s']):>14}"
                     f"{_secs(r['fast_detour_s']):>13}{_secs(r['fail_unlearned_at_s']):>12}"
                     f"{incl[1]:>6.2f}/{incl[2]:<5.3f}")
    return "\n".join(lines)


def format_markdown(rows: list[dict]) -> str:
    """The table as markdown, one row per (arrivals, mode); medians of times over seeds."""
    head = ("| arrivals | weight | ends on slow | P(slow) | E[score] | peak P(fast_valid) | "
            "fast detour | slow leads from | P(fail) < 5% from | completed % fail/fast/slow | "
            "dropped % | updates | p̂(1 s) / p̂(10 s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        incl = r["final_inclusion"]
        lines.append(
            f"| {r.get('arrivals', '')} | {r['mode']} | {r['argmax=slow_valid']}/{r['seeds']} | "
            f"{r['P(slow_valid)']:.3f} ± {r['P(slow_valid)_std']:.3f} | "
            f"{r['expected_score']:.3f} | {r['peak_P(fast_valid)']:.3f} | "
            f"{_secs(r['fast_detour_s'])} | {_secs(r['slow_wins_at_s'])} | "
            f"{_secs(r['fail_unlearned_at_s'])} | "
            f"{'/'.join(f'{100 * c:.0f}' for c in r['completed_share'])} | "
            f"{100 * r['dropped_share']:.0f} | {r['updates']:.0f} | "
            f"{incl[1]:.2f} / {incl[2]:.3f} |")
    return "\n".join(lines)


def plot(results: dict[str, list[RunResult]], budget_s: float, path: Path) -> None:
    """P(action) for each action and the batch mean Δt against wall-clock, mean ± std over seeds."""
    plot_grid({"": results}, budget_s, path)


def plot_grid(results: dict[str, dict[str, list[RunResult]]], budget_s: float,
              path: Path) -> None:
    """`plot` with one row per arrival process: results[arrivals][mode] = runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.linspace(0.0, budget_s, 400)
    fig, axes = plt.subplots(len(results), 4, figsize=(18, 3.8 * len(results)), squeeze=False)
    for row, (arrivals, by_mode) in zip(axes, results.items()):
        where = f"[{arrivals}] " if arrivals else ""
        for mode, runs in by_mode.items():
            probs, dts = zip(*(on_grid(r, grid) for r in runs))
            probs, dts = np.stack(probs), np.stack(dts)  # [S, G, 3], [S, G]
            style = "--" if mode == "inverse_inclusion" else "-"  # often equal to "off"
            for i, name in enumerate(ACTIONS):
                mean, std = probs[..., i].mean(0), probs[..., i].std(0)
                row[i].plot(grid, mean, style, label=mode)
                row[i].fill_between(grid, mean - std, mean + std, alpha=0.2)
                row[i].set_title(f"{where}P({name})  r={REWARDS[i]:g}, Δt≈{DURATIONS_S[i]:g}s")
                row[i].set_ylim(0, 1)
            has_batch = ~np.all(np.isnan(dts), axis=0)
            row[3].plot(grid[has_batch], np.nanmean(dts[:, has_batch], 0), style, label=mode)
            row[3].set_title(f"{where}batch mean Δt (s)")
        for ax in row:
            ax.set_xlabel("wall-clock (s)")
            ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90 if len(results) > 1 else 110)
    plt.close(fig)


def run_all(cfg: ToyConfig, seeds: list[int], modes: list[str]) -> dict[str, list[RunResult]]:
    results = {}
    for mode in modes:
        mode_cfg = dataclasses.replace(cfg, dag_mode=mode)
        results[mode] = [simulate(mode_cfg, s) for s in seeds]
    return results


def _git_commit() -> str:
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted changes' if dirty.strip() else ''}"


def main(argv: list[str] | None = None) -> list[dict]:
    import shlex
    import sys

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    p.add_argument("--budget", type=float, default=ToyConfig.budget_s, help="wall-clock s")
    p.add_argument("--modes", nargs="+", default=list(WEIGHT_MODES), choices=WEIGHT_MODES)
    p.add_argument("--actors", type=int, default=ToyConfig.num_actors)
    p.add_argument("--batch_size", type=int, default=ToyConfig.batch_size)
    p.add_argument("--optimizer", default=ToyConfig.optimizer, choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=ToyConfig.lr)
    p.add_argument("--entropy_coef", type=float, default=ToyConfig.entropy_coef)
    p.add_argument("--arrivals", nargs="+", default=[ToyConfig.arrivals],
                   help=f"how episodes reach the learner, of {ARRIVALS}; NAME@S sets "
                        f"max_staleness S for that one (e.g. drop_stale@1); several: one table")
    p.add_argument("--max_staleness", type=int, default=ToyConfig.max_staleness,
                   help="admission: the bound is (max_staleness + 1) x batch_size; drop_stale: "
                        "the age in versions beyond which a finished episode is discarded")
    p.add_argument("--out_dir", type=Path, default=Path("workdirs/duration_bias"))
    args = p.parse_args(argv)
    cfg = ToyConfig(budget_s=args.budget, num_actors=args.actors, batch_size=args.batch_size,
                    optimizer=args.optimizer, lr=args.lr, entropy_coef=args.entropy_coef,
                    max_staleness=args.max_staleness)
    t0 = time.time()
    results, rows = {}, []
    for spec in args.arrivals:
        name, _, staleness = spec.partition("@")
        if name not in ARRIVALS or (staleness and not staleness.isdigit()):
            p.error(f"--arrivals {spec!r}: expected NAME or NAME@S with NAME in {ARRIVALS}")
        run_cfg = dataclasses.replace(cfg, arrivals=name,
                                      max_staleness=int(staleness or cfg.max_staleness))
        label = (f"{name}@{run_cfg.max_staleness}" if name in ("admission", "drop_stale")
                 else name)
        results[label] = run_all(run_cfg, args.seeds, args.modes)
        rows += [{"arrivals": label, **r} for r in summarise(results[label])]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    png = args.out_dir / "duration_bias.png"
    if len(results) == 1:
        plot(next(iter(results.values())), cfg.budget_s, png)
    else:
        plot_grid(results, cfg.budget_s, png)
    command = "python experiments/duration_bias.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    commit, elapsed = _git_commit(), time.time() - t0
    (args.out_dir / "summary.json").write_text(json.dumps(
        {"config": {**dataclasses.asdict(cfg), "arrivals": args.arrivals}, "seeds": args.seeds,
         "command": command, "git_commit": commit, "rows": rows}, indent=1))
    (args.out_dir / "results.md").write_text(
        f"# Duration-bias toy: weight modes × arrival processes\n\n"
        f"```\n{command}\n```\n\ngit: `{commit}`; seeds {args.seeds}; budget "
        f"{cfg.budget_s:g} s of simulated wall-clock; {cfg.num_actors} actors, batch "
        f"{cfg.batch_size}; NAME@S: max_staleness S (admission: started-but-untrained < "
        f"(S + 1) × batch; drop_stale: finished episodes more than S versions old are "
        f"discarded); {elapsed:.0f} s to run.\n\n{format_markdown(rows)}\n\n"
        f"![P(action) and batch Δt against wall-clock]({png.name})\n")
    print(format_table(rows))
    print(f"plot: {png}  ({elapsed:.1f} s)")
    return rows


if __name__ == "__main__":
    main()
