"""The arrival model: how likely an episode of a given Δt is to reach the learner (host, NumPy).

DAG's premise is that an action of duration Δt reaches the learner at a rate ∝ π/Δt. Whether
that holds depends on the loop: a pool that keeps every finished episode trains what it starts
(inclusion 1 for every Δt), one that drops stale finishers or cancels stragglers loses slow
episodes. `ArrivalModel` measures this from the run's own counts, episodes *started* against
episodes *trained*, per Δt bucket, and `rl.duration`'s "inverse_inclusion" weight divides it out.

An episode's Δt is known only when it finishes. Started episodes end in one of four ways:

- finished and trained (accepted for training: under admission control every finisher);
- finished and dropped (staleness drop, error): Δt known, lost;
- cancelled by the loop while running (straggler cancellation): lost, Δt censored at the elapsed
  time (it would have been longer);
- still running (in flight), or cancelled because the run stops: not lost to the arrival
  process, only unresolved; Δt censored at the elapsed time.

Counting censored episodes in the bucket of their elapsed time, or leaving them out, both bias
the estimate (slow episodes are the ones most often unfinished). So p(Δt) is split into two
factors that can each be estimated without bias:

    p(Δt) = S_C(Δt) · q(Δt)

- S_C(t) = P(not cancelled before t): the survival function of the loop's cancellation time C,
  estimated with a piecewise-constant hazard (the piecewise-exponential model, the maximum-
  likelihood estimate under censoring): in each bucket, λ_b = cancels_b / exposure_b, where
  exposure_b is the episode-seconds spent running inside the bucket by every started episode
  (finished, dropped, cancelled, in flight or stopped at shutdown, each up to its Δt or elapsed
  time), so S_C(t) = exp(−∫₀ᵗ λ). Cancellations are the events; everything else is censoring.
  This is unbiased when C does not depend on the episode's own Δt (the loop cancels on its own
  clock, e.g. at an update), and S_C = 1 exactly when nothing is cancelled. It is evaluated at
  each sample's own Δt, not at the bucket's middle (a bucket spans a factor 2 of Δt, over which
  S_C can change a lot).
- q(t) = P(trained | finished with Δt = t): trained / finished in the bucket of Δt.

Buckets: log-spaced edges (default 2^(k+½) s, k = −4..13: 0.09 s to 3.2 h, ratio 2; anything
below the first edge or above the last falls in the end buckets). Smoothing: each bucket's rate
is pooled towards the run's overall rate with a prior worth `prior_strength` (α) pseudo-
episodes: q_b = (trained_b + α·q̄)/(finished_b + α) with q̄ = Σ trained/Σ finished (a Beta
prior), and λ_b = (cancels_b + α·λ̄·w_b)/(exposure_b + α·w_b) with λ̄ = Σ cancels/Σ exposure
and w_b the bucket's width (a Gamma prior: α pseudo-episodes crossing the bucket at the overall
hazard). An empty bucket takes the overall rate; nothing lost anywhere gives p = 1 exactly. p̂ is
floored at `min_inclusion` so that 1/p̂ stays finite. Counts are cumulative over the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_EDGES_S = 2.0 ** (np.arange(-4, 14) + 0.5)  # [18] bucket edges in seconds (ratio 2)


class ArrivalModel:
    """Inclusion probability P(trained | started, Δt) per Δt bucket, from the run's counts.

    The loop calls `started` when an episode starts, then exactly one of `finished` (trained or
    not) or `cancelled`; `inclusion(dt_b)` gives p̂ for a batch's Δt [B].
    """

    def __init__(self, edges_s: Any = None, prior_strength: float = 2.0,
                 min_inclusion: float = 1e-3):
        edges = np.asarray(DEFAULT_EDGES_S if edges_s is None else edges_s, np.float64)
        if edges.ndim != 1 or len(edges) < 1 or not np.all(np.isfinite(edges)) or np.any(
                edges <= 0) or np.any(np.diff(edges) <= 0):
            raise ValueError(f"ArrivalModel edges_s must be finite, > 0 and strictly increasing, "
                             f"got {edges.tolist()}")
        if not prior_strength >= 0:
            raise ValueError(f"ArrivalModel prior_strength must be >= 0, got {prior_strength}")
        if not 0 < min_inclusion <= 1:
            raise ValueError(f"ArrivalModel min_inclusion must be in (0, 1], got {min_inclusion}")
        self.edges_s = edges
        self.prior_strength = float(prior_strength)
        self.min_inclusion = float(min_inclusion)
        n = len(edges) + 1
        self._lo = np.concatenate([[0.0], edges])  # [n] bucket starts
        # Bucket widths, for the hazard's prior; the open last bucket counts as one more ratio.
        self._width = np.diff(np.concatenate([self._lo, [edges[-1] * 2]]))
        self.trained = np.zeros(n, np.int64)  # finished, accepted for training
        self.dropped = np.zeros(n, np.int64)  # finished, not trained (stale, failed)
        self.cancelled_lost = np.zeros(n, np.int64)  # cancelled by the loop, by elapsed time
        self.censored = np.zeros(n, np.int64)  # stopped with the run, by elapsed time
        self.finished_offset_s = np.zeros(n)  # Σ (Δt − bucket start) of the finished episodes
        self.stopped_offset_s = np.zeros(n)  # the same for cancelled and censored (elapsed)
        self.num_started = 0
        self.now = 0.0  # the latest start time seen: in-flight elapsed times default to it
        self._in_flight: dict[int, float] = {}  # episode id -> start time (s)

    # -- the loop's events ---------------------------------------------------------------------
    def started(self, episode_id: int, t: float) -> None:
        """Episode `episode_id` started at time t (seconds on any clock the loop keeps)."""
        if episode_id in self._in_flight:
            raise ValueError(f"ArrivalModel: episode {episode_id} started twice")
        self._in_flight[int(episode_id)] = float(t)
        self.num_started += 1
        self.now = max(self.now, float(t))

    def finished(self, episode_id: int, dt_s: float, trained: bool = True) -> None:
        """It finished after dt_s; trained=False when it will not be trained (dropped, failed).

        trained=True means accepted for training (it will reach the learner).
        """
        b = self._pop(episode_id, dt_s, "dt_s")
        (self.trained if trained else self.dropped)[b] += 1
        self.finished_offset_s[b] += dt_s - self._lo[b]

    def cancelled(self, episode_id: int, elapsed_s: float, at_shutdown: bool = False) -> None:
        """It was stopped after elapsed_s: a loss (Δt > elapsed_s), unless the run is ending.

        at_shutdown=True: stopped only because the run stops; censored, not lost (counting it
        as lost would make the last minutes of a run look like a bias against slow episodes).
        """
        b = self._pop(episode_id, elapsed_s, "elapsed_s")
        (self.censored if at_shutdown else self.cancelled_lost)[b] += 1
        self.stopped_offset_s[b] += elapsed_s - self._lo[b]

    def stop_in_flight(self, now: float | None = None) -> None:
        """Every episode still in flight was stopped by the run (e.g. the checkpoint a run
        resumes from was written while they ran): censored at `now` (default: the latest
        start seen), never lost."""
        now = self.now if now is None else float(now)
        for eid, t0 in list(self._in_flight.items()):
            self.cancelled(eid, max(now - t0, 0.0), at_shutdown=True)

    def _pop(self, episode_id: int, x: float, name: str) -> int:
        if episode_id not in self._in_flight:
            raise KeyError(f"ArrivalModel: episode {episode_id} was not started (or already "
                           f"ended)")
        if not (np.isfinite(x) and x >= 0):
            raise ValueError(f"ArrivalModel: {name} of episode {episode_id} must be finite and "
                             f">= 0, got {x}")
        del self._in_flight[episode_id]
        return int(self.bucket(x))

    # -- estimates -----------------------------------------------------------------------------
    def bucket(self, dt_s: Any) -> np.ndarray:
        """Bucket index of each Δt (0 below the first edge, len(edges) from the last)."""
        return np.searchsorted(self.edges_s, np.asarray(dt_s, np.float64), side="right")

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def _estimate(self, now: float | None) -> dict[str, Any]:
        a, n = self.prior_strength, len(self.trained)
        now = self.now if now is None else float(now)
        elapsed = np.maximum(now - np.fromiter(self._in_flight.values(), np.float64), 0.0)
        b_fl = self.bucket(elapsed)
        in_flight = np.bincount(b_fl, minlength=n)
        finished = self.trained + self.dropped
        # Piecewise-exponential hazard of the cancellation time: cancels are the events; every
        # started episode is exposed up to its Δt or elapsed time.
        exits = finished + self.cancelled_lost + self.censored + in_flight
        beyond = np.cumsum(exits[::-1])[::-1] - exits  # episodes that ran past the bucket
        exposure = (self.finished_offset_s + self.stopped_offset_s
                    + np.bincount(b_fl, elapsed - self._lo[b_fl], minlength=n)
                    + beyond * self._width)
        lam_bar = self.cancelled_lost.sum() / exposure.sum() if exposure.sum() > 0 else 0.0
        den = exposure + a * self._width
        lam = np.where(den > 0, (self.cancelled_lost + a * lam_bar * self._width)
                       / np.where(den > 0, den, 1.0), lam_bar)
        cum_enter = np.concatenate([[0.0], np.cumsum(lam * self._width)[:-1]])
        q_bar = self.trained.sum() / finished.sum() if finished.sum() > 0 else 1.0
        q = np.where(finished + a > 0, (self.trained + a * q_bar)
                     / np.where(finished + a > 0, finished + a, 1.0), q_bar)
        return {"finished": finished, "in_flight": in_flight, "lam": lam,
                "cum_enter": cum_enter, "q": q}

    def _survival(self, est: dict[str, Any], dt: np.ndarray) -> np.ndarray:
        """S_C(Δt) = exp(−∫₀^Δt λ), λ constant within each bucket."""
        b = self.bucket(dt)
        return np.exp(-(est["cum_enter"][b] + est["lam"][b] * (dt - self._lo[b])))

    def _p(self, est: dict[str, Any], dt: np.ndarray) -> np.ndarray:
        p = est["q"][self.bucket(dt)] * self._survival(est, dt)
        return np.clip(p, self.min_inclusion, 1.0)

    def inclusion(self, dt_b: Any, now: float | None = None) -> np.ndarray:
        """p̂ for each Δt in dt_b (float32, same shape): the batch's `inclusion`."""
        dt = np.asarray(dt_b, np.float64)
        if not np.all(np.isfinite(dt)) or np.any(dt < 0):
            raise ValueError(f"ArrivalModel.inclusion: dt_b must be finite and >= 0, got "
                             f"{dt.ravel().tolist()[:10]}")
        return self._p(self._estimate(now), dt).astype(np.float32)

    def table(self, now: float | None = None) -> list[dict]:
        """One row per bucket, for plots and reports.

        started: the episodes started whose Δt falls in the bucket, estimated as finished / S_C
        at their mean Δt (censored ones cannot be counted directly; in-flight ones not yet);
        rate = trained / started; inclusion: the smoothed p̂ the weights use, at at_s: the mean
        Δt of the bucket's finishers (its geometric middle when none finished), since p̂ varies
        within a bucket through S_C.
        """
        est = self._estimate(now)
        hi = np.concatenate([self.edges_s, [np.inf]])
        mid = np.sqrt(np.maximum(self._lo, self.edges_s[0] / 2) * (self._lo + self._width))
        at = np.where(est["finished"] > 0, self._lo + self.finished_offset_s
                      / np.maximum(est["finished"], 1), mid)
        p, survival = self._p(est, at), self._survival(est, at)
        rows = []
        for b in range(len(at)):
            started = est["finished"][b] / survival[b] if survival[b] > 0 else 0.0
            rows.append({
                "lo_s": float(self._lo[b]), "hi_s": float(hi[b]), "at_s": float(at[b]),
                "started": float(started),
                "trained": int(self.trained[b]), "dropped": int(self.dropped[b]),
                "cancelled": int(self.cancelled_lost[b]), "censored": int(self.censored[b]),
                "in_flight": int(est["in_flight"][b]),
                "rate": float(self.trained[b] / started) if started > 0 else float("nan"),
                "inclusion": float(p[b])})
        return rows

    # -- checkpoints ---------------------------------------------------------------------------
    _ARRAYS = {"trained": "trained", "dropped": "dropped", "cancelled": "cancelled_lost",
               "censored": "censored", "finished_offset_s": "finished_offset_s",
               "stopped_offset_s": "stopped_offset_s"}

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (counts, settings and the episodes still in flight)."""
        return {"edges_s": self.edges_s.tolist(), "prior_strength": self.prior_strength,
                "min_inclusion": self.min_inclusion,
                **{k: getattr(self, attr).tolist() for k, attr in self._ARRAYS.items()},
                "num_started": self.num_started, "now": self.now,
                "in_flight": [[k, v] for k, v in self._in_flight.items()]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ArrivalModel:
        model = cls(state["edges_s"], state["prior_strength"], state["min_inclusion"])
        n = len(model.trained)
        for key, attr in cls._ARRAYS.items():
            x = np.asarray(state[key], getattr(model, attr).dtype)
            if x.shape != (n,):
                raise ValueError(f"ArrivalModel state {key!r} has {x.shape} buckets, the edges "
                                 f"give {n}")
            setattr(model, attr, x)
        model.num_started = int(state["num_started"])
        model.now = float(state["now"])
        model._in_flight = {int(k): float(v) for k, v in state["in_flight"]}
        return model
