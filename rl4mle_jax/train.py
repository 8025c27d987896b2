"""The asynchronous actor-learner loop.

  RolloutPool (K episodes in flight, host asyncio)      Learner (jitted, sharded)
    prompt → policy sample → instrument (frozen copy)     B finished episodes, fastest first
    → sandbox (Δt) → grade on the reward split → reward   → PPO train_step with Δt weights
    finished episodes queue up in completion order  ───▶  → new policy version to the sampler

Device work runs on "device lane" threads; sandboxes run beside them, so executions continue
while the learner trains. With one mesh, sampling and train steps take turns on one lane; with
`mesh.sampler_devices` > 0 the sampler's devices (policy and frozen copy) have a lane of their
own, so sampling continues during a train step, and each update is published to them
(rollout.publish; the sampler switches versions between requests).
Everything a run makes goes to `workdir`: checkpoints/, experience.jsonl, metrics.jsonl, tb/,
plots/, best_solution/, report.md.
A run killed at any point resumes from its last checkpoint with the same command.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from rl4mle_jax import allocator, multitask, sharding, spmd, study
from rl4mle_jax import checkpoint as ckpt_lib
from rl4mle_jax.best_of_n import (
    best_of_n,
    needs_repick,
    save_eval,
    select_pick,
    solve_prompt_text,
    token_lengths,
)
from rl4mle_jax.components import Components, build_components, task_views
from rl4mle_jax.engine import Engine
from rl4mle_jax.env.instrument_lm import Instrumenter
from rl4mle_jax.env.instrument_static import MILESTONES
from rl4mle_jax.env.reward import RESCALE_MIN_SE, reward_replicates
from rl4mle_jax.report import brief_eval, write_best_solution, write_report
from rl4mle_jax.rl.advantages import valid_rank_bonus
from rl4mle_jax.rl.arrival import ArrivalModel
from rl4mle_jax.rl.learner import make_learner
from rl4mle_jax.rl.rescue import (
    RescueMonitor,
    best_reference,
    load_references,
    sft_batch,
    sft_update,
)
from rl4mle_jax.rollout.buffer import ExperienceLog, SolutionBuffer
from rl4mle_jax.rollout.collate import (
    ShapeForecast,
    batch_shape,
    build_batch,
    compile_pays_off,
    episode_durations,
    smallest_cover,
)
from rl4mle_jax.rollout.engine_service import EngineService
from rl4mle_jax.rollout.episode import EpisodeRunner, Experience
from rl4mle_jax.rollout.pool import RolloutPool
from rl4mle_jax.rollout.publish import WeightPublisher, param_shardings
from rl4mle_jax.rollout.service import BusySpans, GenerationService
from rl4mle_jax.rollout.task_mix import TaskMix, task_group_ids
from rl4mle_jax.sampling import truncation_settings
from rl4mle_jax.tracking import MetricLogger, plot_metrics
from rl4mle_jax.warmstart.demo_runs import render_response

log = logging.getLogger("rl4mle_jax.train")


@dataclasses.dataclass
class LoopState:
    """Host-side state that goes into each checkpoint's metadata."""

    step: int = 0
    version: int = 0  # policy version = number of published updates
    wall_s: float = 0.0  # RL wall-clock used so far, over all resumes
    best_score: float | None = None
    best_reward: float = float("-inf")
    best_episode: int | None = None
    episodes_started: int = 0
    episodes_trained: int = 0
    episodes_dropped: int = 0  # finished but discarded for staleness (0 under admission control)
    episodes_failed: int = 0  # the episode itself raised (logged with its error)
    episodes_over_staleness: int = 0  # kept although older than run.max_staleness versions
    stop_reason: str | None = None  # set when the run stops before its budget (rescue.*)


# Sections that do not change the initial policy's best-of-N (it samples the warm start and runs
# the candidates without instrumentation); everything else, and the seed, is in its key.
_NOT_IN_INITIAL_EVAL = ("learner", "instrument", "mesh", "run", "rescue")


def initial_eval_key(config: Any, source: dict[str, Any] | None = None) -> str:
    """A digest of what the initial best-of-N depends on: runs of a sweep whose variants only
    change the learner or the loop share it (same seed → same draws → same result). `source`:
    where the initial policy came from (Components.source: its `warmstart` cache entry, whose
    name is its content key, or its `hf_dir`; the rest of it, timings, is not in the key)."""
    d = json.loads(config.to_json_best_effort())
    for name in _NOT_IN_INITIAL_EVAL:
        d.pop(name, None)
    # Niceness orders the programs' CPU after the host's, it changes no outcome (and the key
    # of the evaluations made before the field existed stays).
    d.get("env", {}).pop("nice", None)
    if not d.get("sampling", {}).get("min_p"):  # off: the key from before the field existed
        d.get("sampling", {}).pop("min_p", None)
    if d.get("reward", {}).get("rescale_min_se") == RESCALE_MIN_SE:  # the key from before it
        d["reward"].pop("rescale_min_se")
    if not d.get("tasks"):  # one task: the key of the runs made before config.tasks existed
        d.pop("tasks", None)
    d["eval_samples"] = config.run.eval_samples
    d["eval_reuse_runs"] = config.run.reuse_runs  # identical candidates share a run (best_of_n)
    d["policy_source"] = {k: str((source or {}).get(k)) for k in ("hf_dir", "warmstart")}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _write_provenance(workdir: Path, host_allocator: str) -> None:
    """provenance.json: the commit, command and host allocator of every start or resume of
    this workdir."""
    path = workdir / "provenance.json"
    try:
        starts = json.loads(path.read_text())["starts"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        starts = []
    starts.append({"commit": study.git_commit(Path(__file__).parent), "argv": sys.argv,
                   "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "allocator": host_allocator})
    path.write_text(json.dumps({"starts": starts}, indent=1))


def train(config: Any, workdir: str | Path, shared_evals: str | Path | None = None
          ) -> dict[str, Any]:
    """Run (or resume) the loop the config describes; returns the final summary.

    Order: build (or load the cached warm start) → best-of-N of the initial policy (cached in
    the workdir, and in `shared_evals/<initial_eval_key>.json` when given, so the variants of a
    sweep evaluate each seed's initial policy once) → RL until max_steps or the wall-clock
    budget → best-of-N of the final policy → best solution and report.md.
    """
    spmd.check_config(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=1))
    host_allocator = allocator.loaded_allocator()
    _write_provenance(workdir, host_allocator)
    log.info("host allocator: %s", host_allocator)
    comps = build_components(config, workdir)
    try:
        return _train(config, workdir, comps, shared_evals)
    finally:
        comps.close()  # the sandboxes' threads and pre-imported interpreters


def _train(config: Any, workdir: Path, comps: Components,
           shared_evals: str | Path | None) -> dict[str, Any]:
    key = jax.random.PRNGKey(config.seed)
    n, temp, slots = config.run.eval_samples, config.sampling.temperature, config.run.slots
    # The evaluations sample the policy as the loop does: the same truncation.
    truncation = truncation_settings(config.sampling)
    reuse = config.run.reuse_runs  # identical candidates share a run, as in the loop
    pick = dict(pick=config.run.eval_pick, select_folds=config.run.eval_select_folds,
                finalist_se=config.run.eval_finalist_se, max_finalists=config.run.eval_finalists)

    def evaluate(params: Any) -> dict[str, Any]:
        # The same draws before and after RL: a difference is the policy's, not the dice's.
        if comps.views:  # multi-task: per task, the draws of that task's single-task run
            return multitask.evaluate_tasks(comps.views, params, n, jax.random.fold_in(key, 1),
                                            temp, slots, reuse, truncation, **pick)
        return best_of_n(comps, params, n, jax.random.fold_in(key, 1), temp, slots, reuse,
                         truncation, **pick)

    def repick(ev: dict[str, Any]) -> dict[str, Any]:
        """A cached evaluation under this run's pick rule (its candidates are the same)."""
        for view, one in ([(comps, ev)] if not comps.views else
                          [(comps.views[t], r) for t, r in ev.get("tasks", {}).items()]):
            if needs_repick(one, pick["pick"], pick["finalist_se"], pick["max_finalists"]):
                select_pick(one, view.task, view.sandbox, pick["pick"], pick["select_folds"],
                            view.episode_cfg.timeout_s, slots, pick["finalist_se"],
                            pick["max_finalists"])
        return ev
    initial_path = workdir / "eval_initial.json"
    shared = (Path(shared_evals) / f"{initial_eval_key(config, comps.source)}.json"
              if shared_evals else None)
    if not initial_path.exists() and shared is not None and shared.exists():
        log.info("best-of-%d of the initial policy: shared %s", n, shared)
        shutil.copyfile(shared, initial_path)
    if initial_path.exists():
        initial = json.loads(initial_path.read_text())
        before = json.dumps(initial.get("pick")), json.dumps(initial.get("tasks"))
        initial = repick(initial)
        if (json.dumps(initial.get("pick")), json.dumps(initial.get("tasks"))) != before:
            log.info("best-of-%d of the initial policy: re-picked by %r", n, pick["pick"])
            save_eval(initial, initial_path)
            if shared is not None and shared.exists():  # the next variant finds the runs
                shutil.copyfile(initial_path, shared)
    else:
        log.info("best-of-%d of the initial policy", n)
        initial = evaluate(comps.params)
        save_eval(initial, initial_path)
        if shared is not None:
            shared.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(initial_path, shared)
    trainer = _Trainer(config, workdir, comps, warmup_lengths=token_lengths(initial))
    try:
        summary = asyncio.run(trainer.run())
    finally:
        trainer.leader.stop("the run failed")  # no-op once stopped (or with one process)
    log.info("best-of-%d of the final policy", n)
    final = evaluate(trainer.publisher.latest()[0])  # the sampler's copy of the last version
    save_eval(final, workdir / "eval_final.json")
    if comps.views:
        bests = {t: write_best_solution(v, workdir / "best_solution" / t, trainer.buffers[t],
                                        final["tasks"][t], pick["pick"], pick["select_folds"])
                 for t, v in comps.views.items()}
        save_eval(final, workdir / "eval_final.json")  # with the RL episodes' selection runs
        report = multitask.write_report(workdir, config, comps.views, initial, final, summary,
                                        bests)
        return {"workdir": str(workdir), "report": str(report),
                "initial": multitask.brief_tasks(initial),
                "final": multitask.brief_tasks(final), **summary}
    best = write_best_solution(comps, workdir / "best_solution", trainer.buffer, final,
                               pick["pick"], pick["select_folds"])
    save_eval(final, workdir / "eval_final.json")  # with the RL episode's selection runs
    report = write_report(workdir, config, comps, initial, final, summary, best)
    return {"workdir": str(workdir), "report": str(report), "initial": brief_eval(initial),
            "final": brief_eval(final), **summary}


class _Trainer:
    def __init__(self, config: Any, workdir: Path, comps: Components,
                 warmup_lengths: list[tuple[int, int]] = ()):
        self.config, self.workdir, self.c = config, workdir, comps
        # (prompt, response) token lengths the warm-up forecasts the first batches' shapes from.
        self.warmup_lengths = list(warmup_lengths)
        run = config.run
        # Several JAX processes: this is process 0; the others mirror its learner operations
        # (spmd.follow), from loading the same initial policy on.
        self.leader = spmd.Leader()
        if spmd.multiprocess():
            self.leader.init(comps.source, str(config.model.dtype))
        meshes = sharding.make_meshes(**config.mesh)
        self.learner = make_learner(comps.model_config, dict(config.learner), meshes.learner)
        self.lane = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="device-lane")
        # Split devices: the sampler gets its own lane and copies of the weights on its mesh.
        self.split = meshes.sampler is not None
        self.sampler_lane = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sampler-lane")
            if self.split else self.lane)
        self.sampler_busy = BusySpans()
        # Several processes: the samplers use process 0's own copy on its first device.
        sampler_mesh = (meshes.sampler if self.split
                        else spmd.sampler_mesh() if spmd.multiprocess() else None)
        self.publisher = WeightPublisher(
            param_shardings(comps.model_config, sampler_mesh) if sampler_mesh else None)
        self.ckpt = ckpt_lib.CheckpointManager(workdir / "checkpoints",
                                               max_to_keep=run.keep_checkpoints)
        self.explog = ExperienceLog(workdir / "experience.jsonl")
        latest = self.ckpt.latest_step()
        self.metrics = MetricLogger(workdir, resume_step=latest or 0)
        self.loop = LoopState()
        # Per task (one entry for one task): the improve prompts' buffer, the rescue monitor,
        # the references; `buffer` and `rescue` are the first task's (the single-task names).
        self.views = task_views(comps)
        self.task_ids = list(self.views)
        self.multi = len(self.task_ids) > 1
        self.buffers = {t: SolutionBuffer(run.buffer_size) for t in self.task_ids}
        # Which Δt get trained, from the run's own starts, finishes and cancellations (the
        # arrival bias in report.md; learner.duration_weighting="inverse_inclusion").
        self.arrivals = ArrivalModel()
        rc = config.rescue  # SFT rescue (rl/rescue.py): off unless rescue.enabled
        self.rescues = {t: RescueMonitor(rc.window_steps, rc.margin, rc.patience_steps,
                                         rc.max_rescues) for t in self.task_ids}
        self._references = {t: load_references(v, rc.reference_file) if rc.enabled else []
                            for t, v in self.views.items()}
        # Multi-task: each episode's task (rollout/task_mix.py) and each task's best so far.
        self.mix = TaskMix(self.task_ids, run.task_sampling, run.task_sampling_floor,
                           run.task_separation_window, run.task_separation_group, config.seed)
        self.task_best = {t: multitask.new_best() for t in self.task_ids}
        self._step_shapes: set[tuple[int, int]] = set()  # (P, R) the step has run at
        self._train_s, self._train_steps = 0.0, 0  # this session's train steps (report.md)
        self._program_cpu_s, self._program_runs = 0.0, 0  # this session's own sandbox runs
        # The step compiled ahead for the shapes the next batches will likely have.
        self.shapes = ShapeForecast(run.batch_size, config.prompt.max_prompt_tokens,
                                    config.prompt.max_response_tokens, run.length_bucket)
        self._compiler = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="compile-ahead")
        self._compiling: dict[tuple[int, int], concurrent.futures.Future] = {}
        # What compile_pays_off weighs: seconds per token of recent steps without a compile
        # ((P + R) columns), seconds per compile of the train step (ahead or in a step), the
        # shapes it declined (logged once each) and where this session's clock started.
        self._step_s_per_token: collections.deque[float] = collections.deque(maxlen=16)
        self._compile_s: list[float] = []
        self._declined: set[tuple[int, int]] = set()
        self._session_wall0 = 0.0
        initial = self.learner.shard_params(comps.params)
        # The frozen copy (never updated) samples on the sampler's devices; the learner keeps
        # one on its own mesh only as the KL reference.
        self.frozen = initial if sampler_mesh is None else self.publisher.place(comps.params)
        self.reference = initial if self.learner.config.uses_ref else None
        if latest is None:
            self.state = self.learner.init_state(initial, jax.random.PRNGKey(config.seed))
        else:
            self.state, meta = self.ckpt.restore(self.learner.abstract_state(), latest)
            self.loop = LoopState(**meta["loop"])
            if self.multi:
                mt = meta.get("multitask") or {"task_mix": {"task_ids": [meta["config"]["task"]]}}
                if mt["task_mix"]["task_ids"] != self.task_ids:
                    raise ValueError(f"config.tasks: {self.task_ids} but {workdir} holds a run "
                                     f"of {mt['task_mix']['task_ids']}; resume with the same "
                                     "tasks or start a new workdir")
                self.buffers = {t: SolutionBuffer.from_state_dict(b)
                                for t, b in mt["buffers"].items()}
                self.rescues = {t: RescueMonitor.from_state_dict(r)
                                for t, r in mt["rescues"].items()}
                # The history resumes; the rule is the config's (it may change on a resume).
                self.mix = TaskMix.from_state_dict({**self.mix.state_dict(), **{
                    k: mt["task_mix"][k] for k in ("rewards", "dropped", "drawn")}})
                self.task_best = mt["best"]
            else:
                if "multitask" in meta:
                    raise ValueError(f"config.tasks: empty, but {workdir} holds a multi-task "
                                     f"run of {meta['multitask']['task_mix']['task_ids']}")
                self.buffers = {self.task_ids[0]: SolutionBuffer.from_state_dict(meta["buffer"])}
                if "rescue" in meta:
                    self.rescues = {self.task_ids[0]: RescueMonitor.from_state_dict(
                        meta["rescue"])}
            if "arrivals" in meta:
                self.arrivals = ArrivalModel.from_state_dict(meta["arrivals"])
                # What was running when the checkpoint was written never finishes in this
                # process: stopped by the run, so censored, not lost.
                self.arrivals.stop_in_flight()
            log.info("resumed from step %d (policy version %d, %.0f s of RL done)",
                     self.loop.step, self.loop.version, self.loop.wall_s)
        self.publisher.publish(self.state.policy_params, self.loop.version)

    @property
    def buffer(self) -> SolutionBuffer:
        return self.buffers[self.task_ids[0]]

    @property
    def rescue(self) -> RescueMonitor:
        return self.rescues[self.task_ids[0]]

    # --------------------------------------------------------------------- set-up
    def _services(self) -> tuple[Any, Any | None]:
        cfg = self.config
        key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), 1_000_003 + self.loop.step)
        policy = self._service(self.publisher.latest, jax.random.fold_in(key, 0),
                               cfg.prompt.max_response_tokens, cfg.sampling.temperature)
        frozen = None
        if cfg.instrument.mode == "lm":
            frozen = self._service(lambda: (self.frozen, -1), jax.random.fold_in(key, 1),
                                   cfg.instrument.max_new_tokens, cfg.instrument.temperature)
        return policy, frozen

    def _service(self, get_params: Any, key: jax.Array, max_new: int, temperature: float
                 ) -> Any:
        """One generation service (policy or frozen copy) on the sampler's lane."""
        samp, c = self.config.sampling, self.c
        if samp.engine == "continuous":
            engine = Engine(c.model_config, c.tokenizer.stop_token_ids, c.tokenizer.pad_id,
                            num_slots=samp.engine_slots, prompt_buckets=tuple(samp.prompt_buckets),
                            max_new_tokens=max_new, steps_per_call=samp.engine_steps_per_call,
                            **truncation_settings(samp))
            return EngineService(engine, get_params, self.sampler_lane, key,
                                 max_new_tokens=max_new, temperature=temperature,
                                 busy=self.sampler_busy)
        return GenerationService(
            c.sampler, get_params, self.sampler_lane, key, max_batch=samp.max_batch,
            max_wait_s=samp.max_wait_s, busy=self.sampler_busy, max_new_tokens=max_new,
            temperature=temperature, **truncation_settings(samp))

    # --------------------------------------------------------------------- the loop
    async def run(self) -> dict[str, Any]:
        cfg, run = self.config, self.config.run
        policy, frozen = self._services()
        # In "lm" mode the episodes send the frozen copy's prompts through its generation
        # service and verify the answers (EpisodeRunner._instrument), so no generate here.
        instrumenter = Instrumenter(
            cfg.instrument.mode, realign=cfg.instrument.realign,
            chat_template=(self.c.tokenizer.apply_chat_template if self.c.tokenizer.is_chat
                           else None))
        first_id = self.explog.next_episode_id
        runners = {t: EpisodeRunner(
            v.task, v.tokenizer, policy, v.sandbox, instrumenter, self.buffers[t], v.context,
            v.episode_cfg, v.reward_cfg, v.prompt_cfg, frozen=frozen,
            rng=random.Random(cfg.seed * 7919 + first_id if not self.multi
                              else f"{cfg.seed}:{t}:{first_id}"))
            for t, v in self.views.items()}
        runner = runners[self.task_ids[0]]

        async def run_episode(request: dict[str, Any]) -> Experience:
            return await runners[request.get("task", self.task_ids[0])](request)
        # Admission control: started-but-untrained episodes (this process's) stay below the
        # staleness bound; finished ones are never discarded for staleness.
        bound = (run.max_staleness + 1) * run.batch_size
        self._settled = 0  # this process's finished episodes trained, failed or dropped

        def admit() -> bool:
            return pool.started - self._settled < bound

        def make_request(episode_id: int) -> dict[str, Any]:
            self.loop.episodes_started += 1
            self.arrivals.started(episode_id, time.time())
            if not self.multi:
                return runner.make_request(episode_id)
            task = self.mix.draw(episode_id)  # seeded by (seed, episode id): resumes as is
            return {**runners[task].make_request(episode_id), "task": task}

        pool = RolloutPool(runner if not self.multi else run_episode, make_request, run.slots,
                           first_episode_id=first_id,
                           admit=admit if run.admission == "bounded" else None)
        warmup = self._warm_up(policy, frozen) if run.warmup else {}
        for svc in (policy, frozen):
            if svc is not None:
                svc.start()
        pool.start()
        t_start, wall0 = time.time(), self.loop.wall_s
        self._session_wall0 = wall0
        cpu0 = os.times()
        # The bar follows what stops the run: the wall-clock budget (seconds) if there is one,
        # else the step limit; steps, reward, valid rate and best score ride beside it.
        by_time = run.time_budget_s > 0
        bar = tqdm(total=run.time_budget_s if by_time else run.max_steps,
                   initial=min(self.loop.wall_s, run.time_budget_s) if by_time else self.loop.step,
                   desc="RL", unit="s" if by_time else "step", dynamic_ncols=True,
                   disable=not run.progress,
                   bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}<{remaining}"
                              "{postfix}]" if by_time else None)
        postfix = {"step": f"{self.loop.step}/{run.max_steps}"}

        def advance() -> None:
            if by_time:
                bar.n = min(self.loop.wall_s, run.time_budget_s)
                bar.set_postfix(postfix, refresh=True)
        ready: list[Experience] = []
        recent: collections.deque[Experience] = collections.deque(maxlen=run.batch_size)
        try:
            while not self._done():
                finished = await pool.get_batch(1, timeout_s=5.0)
                self.loop.wall_s = wall0 + time.time() - t_start
                advance()
                for f in finished:
                    exp = self._accept(f)
                    if exp is not None:
                        ready.append(exp)
                        self.shapes.observe(len(exp.prompt_ids), len(exp.response_ids))
                        recent.append(exp)
                self._precompile_ahead(list(recent))
                if len(ready) < run.batch_size:
                    continue
                batch, ready = ready[:run.batch_size], ready[run.batch_size:]
                metrics = await asyncio.get_running_loop().run_in_executor(
                    self.lane, self._learn, batch)
                self._settled += len(batch)
                pool.wake()  # slots waiting for admission may start now
                self.loop.wall_s = wall0 + time.time() - t_start
                metrics.update(self._rollout_metrics(batch, pool, instrumenter))
                if self.multi:
                    for t in self.task_ids:
                        self.mix.observe(t, [e.reward for e in batch if e.task == t])
                if cfg.rescue.enabled:
                    metrics.update(await self._rescue_check(batch))
                if self.multi:
                    metrics.update(multitask.task_metrics(batch, self.task_ids, self.mix,
                                                          self.task_best, self.buffers,
                                                          self.rescues))
                self.metrics.write(self.loop.step, self.loop.wall_s, metrics)
                if self.loop.step % run.checkpoint_every == 0 or self._done():
                    self._save()
                postfix.update(step=f"{self.loop.step}/{run.max_steps}",
                               reward=f"{metrics['reward/mean']:.2f}",
                               valid=f"{metrics['reward/valid_rate']:.2f}",
                               best=_fmt(self.loop.best_score))
                if by_time:
                    advance()
                else:
                    bar.update(1)
                    bar.set_postfix(postfix, refresh=False)
        finally:
            bar.close()
            # The episodes still running will not be trained: logged with their Δt censored
            # at the elapsed time (the arrival bias counts them).
            for c in await pool.stop():
                self.explog.append({**c, "cancelled": True, "selected": False})
                self.arrivals.cancelled(c["episode_id"], c["elapsed_s"], at_shutdown=True)
            # Finished while the last batch trained, taken by no batch: logged all the same
            # (accepted like any other, untrained only because the run ended).
            for f in pool.drain():
                self._accept(f)
            for svc in (policy, frozen):
                if svc is not None:
                    await svc.stop()
        self._save(force=True)
        self.leader.stop("done")  # before closing: orbax's close waits for every process
        self.ckpt.close()
        self.explog.close()
        self.metrics.close()
        self.lane.shutdown()
        self.sampler_lane.shutdown()
        self._compiler.shutdown(cancel_futures=True)
        plot_metrics(self.workdir / "metrics.jsonl", self.workdir / "plots",
                     *((multitask.task_plots(self.task_ids),) if self.multi else ()))
        summary = {"loop": dataclasses.asdict(self.loop), "buffer": self.buffer.state_dict(),
                   "slots": pool.stats().to_dict(), "instrument": instrumenter.metrics(),
                   "warmup": warmup,
                   "lane": self._lane_time(policy, frozen, self.loop.wall_s - wall0, cpu0)}
        if self.multi:
            summary.update(task_mix=self.mix.state_dict(), task_best=self.task_best)
        return summary

    def _lane_time(self, policy: Any, frozen: Any | None, wall_s: float,
                   cpu0: os.times_result) -> dict[str, Any]:
        """Where this session's RL wall-clock went on the device lanes: train steps, the
        policy's sampling and the frozen copy's (instrumentation), with requests and tokens;
        and where the CPU went: this process (lanes, host work) against the sandboxed programs
        it ran (their own CPU seconds as the launcher measured them; reused runs cost none)."""
        cpu1 = os.times()
        out: dict[str, Any] = {"wall_s": wall_s,
                               "train_steps_s": self._train_s, "train_steps": self._train_steps,
                               "host_cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
                               "programs_cpu_s": self._program_cpu_s,
                               "program_runs": self._program_runs}
        for name, svc in (("policy", policy), ("frozen", frozen)):
            if svc is not None:
                out[name] = {"busy_s": svc.busy_s, "requests": svc.requests,
                             "tokens": svc.tokens}
                # The static service's sampler calls (requests merged per call: its batch
                # sizes), or the continuous engine's jitted step calls.
                if hasattr(svc, "calls"):
                    out[name]["calls"] = svc.calls
                elif hasattr(svc, "steps"):
                    out[name]["engine_calls"] = svc.steps
        return out

    def _done(self) -> bool:
        run = self.config.run
        return (self.loop.step >= run.max_steps or self.loop.stop_reason is not None
                or (run.time_budget_s > 0 and self.loop.wall_s >= run.time_budget_s))

    # --------------------------------------------------------------------- SFT rescue
    async def _rescue_check(self, batch: list[Experience]) -> dict[str, float]:
        """After a learner step, per task with rows in the batch (every row for one task): note
        them, finish or give up on its last rescue, or rescue now (rl/rescue.py says when).
        Giving up stops a single-task run; with several tasks it drops the task from the mix
        (the last live one stops the run). Each event is a line of rescues.jsonl."""
        for t in list(self.mix.live):
            rows = [e for e in batch if e.task == t] if self.multi else batch
            if rows:
                await self._rescue_task(t, rows)
            if self.loop.stop_reason is not None:
                break
        return {"rescue/count": float(sum(len(m.rescues) for m in self.rescues.values()))}

    async def _rescue_task(self, task: str, rows: list[Experience]) -> None:
        mon, tag = self.rescues[task], ({"task": task} if self.multi else {})
        if not mon.observe([e.reward for e in rows], [e.record["status"] == "valid" for e in rows],
                           [e.params_version for e in rows]):
            return  # every row was sampled before the last rescue: nothing to judge it by
        done = mon.outcome()
        if done is not None:
            self._log_rescue({"event": "outcome", "step": self.loop.step, **tag, **done})
        msg = mon.give_up()
        if msg is not None:
            if self.multi and len(self.mix.live) > 1:
                self.mix.drop(task, msg)
                self._log_rescue({"event": "drop", "step": self.loop.step, "task": task,
                                  "reason": msg, "drawn": self.mix.drawn[task],
                                  "live": self.mix.live})
                log.error("task %s dropped from the mix: %s", task, msg)
            else:
                log.error("%s", msg)
                self.loop.stop_reason = msg
            return
        view = self.views[task]
        ref = best_reference(self._references[task], self.buffers[task].best(), self._fits)
        reason = mon.reason(ref["reward"] if ref else None)
        if reason is not None and ref is not None:
            losses = await asyncio.get_running_loop().run_in_executor(
                self.lane, self._sft_rescue, ref, view)
            rec = mon.record(reason, ref, losses, version=self.loop.version)
            self._log_rescue({"event": "rescue", "step": self.loop.step, **tag, **rec})
            log.warning("SFT rescue (%s)%s on %s (reward %.3f): loss %.3f -> %.3f", reason,
                        f" of {task}" if self.multi else "", ref["origin"], ref["reward"],
                        losses[0], losses[-1])

    def _fits(self, ref: dict[str, Any]) -> bool:
        n = len(self.c.tokenizer.encode(render_response(ref["plan"], ref["code"])))
        return n < self.config.prompt.max_response_tokens

    def _sft_rescue(self, ref: dict[str, Any], view: Components) -> list[float]:
        """On the learner's lane: SFT steps on the reference (the solve prompt of its task),
        published as a new version."""
        rc, prompt = self.config.rescue, self.config.prompt
        batch = sft_batch(self.c.tokenizer, solve_prompt_text(view),
                          [render_response(ref["plan"], ref["code"])],
                          prompt.max_prompt_tokens, prompt.max_response_tokens)
        self.state, losses = sft_update(self.learner, self.state, batch, rc.sft_lr,
                                        rc.sft_steps, rc.sft_target_loss, rc.sft_min_steps)
        self.loop.version += 1
        self.publisher.publish(self.state.policy_params, self.loop.version)
        return losses

    def _log_rescue(self, record: dict[str, Any]) -> None:
        with open(self.workdir / "rescues.jsonl", "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def _accept(self, f: Any) -> Experience | None:
        """Log a finished episode; keep it for training unless it failed or is too stale."""
        run = self.config.run
        if f.error is not None or f.result is None:
            self.explog.append({"episode_id": f.episode_id, "kind": f.request.get("kind"),
                                **({"task": f.request["task"]} if self.multi else {}),
                                "error": f.error, "started_at": f.started_at,
                                "finished_at": f.finished_at,
                                "elapsed_s": f.finished_at - f.started_at, "selected": False})
            log.warning("episode %d failed after %.1f s: %s", f.episode_id,
                        f.finished_at - f.started_at, f.error)
            self.loop.episodes_failed += 1
            self._settled += 1
            self.arrivals.finished(f.episode_id, max(f.finished_at - f.started_at, 0.0),
                                   trained=False)
            return None
        exp: Experience = f.result
        if not exp.reused_run and "program_cpu_s" in exp.timings:
            self._program_cpu_s += exp.timings["program_cpu_s"]
            self._program_runs += 1
        staleness = self.loop.version - exp.params_version
        stale = staleness > run.max_staleness
        keep = not stale or run.admission == "bounded"
        self.loop.episodes_over_staleness += int(stale and keep)
        self.arrivals.finished(exp.episode_id, float(episode_durations(
            [exp], run.duration_source, run.duration_floor_s)[0]), trained=keep)
        self.explog.append(exp.log_record({"staleness": staleness, "selected": keep,
                                           "wall_s": self.loop.wall_s}))
        rec = exp.record
        if rec["status"] == "valid" and exp.code is not None:
            task = exp.task or self.task_ids[0]
            self.buffers[task].add(exp.code, exp.reward, record=rec, episode_id=exp.episode_id)
            if self.multi:  # scores of different tasks do not compare: a best per task
                best = self.task_best[task]
                if exp.reward > best["reward"]:
                    best.update(reward=exp.reward, score=rec["score"], episode=exp.episode_id)
            elif exp.reward > self.loop.best_reward:
                self.loop.best_reward, self.loop.best_score = exp.reward, rec["score"]
                self.loop.best_episode = exp.episode_id
        if not keep:
            self.loop.episodes_dropped += 1
            self._settled += 1
            log.info("episode %d dropped: %d versions old, Δt %.1f s", exp.episode_id,
                     staleness, exp.duration_s)
            return None
        return exp

    def _host_arrays(self, batch: list[Experience], pad_to: tuple[int, int] | None = None,
                     forward: bool = True) -> dict[str, np.ndarray]:
        """The train step's batch as host arrays (spmd.device_inputs adds what device passes
        compute). forward=False: for compiling the step ahead (values unused)."""
        cfg, learner = self.config, self.learner
        arrays = build_batch(batch, cfg.prompt.max_prompt_tokens, cfg.prompt.max_response_tokens,
                             self.c.tokenizer.pad_id, cfg.run.duration_source,
                             cfg.run.duration_floor_s, length_bucket=cfg.run.length_bucket,
                             pad_to=pad_to)
        if cfg.run.rank_bonus > 0:  # what the learner trains on; metrics keep e.reward
            valid = [e.record.get("status") == "valid" for e in batch]
            tasks = [self.task_ids.index(e.task) if self.multi else 0 for e in batch]
            boot = (reward_replicates([e.record for e in batch], cfg.reward)
                    if cfg.run.rank_tie_se > 0 else None)
            arrays["rewards"] = arrays["rewards"] + valid_rank_bonus(
                arrays["rewards"], valid, cfg.run.rank_bonus, np.asarray(tasks), boot,
                cfg.run.rank_tie_se)
        # Rows sampled with the params being trained: the behaviour log-prob gap's rows.
        arrays["fresh"] = np.asarray([e.params_version == self.loop.version for e in batch],
                                     np.float32)
        if self.multi and learner.config.advantage_estimator != "gae":
            # A group baseline compares rows of one task only (rollout/task_mix.py).
            arrays["group_ids"] = task_group_ids([self.task_ids.index(e.task) for e in batch],
                                                 learner.config.group_size)
        if learner.config.duration_weighting.replace("-", "_") == "inverse_inclusion":
            arrays["inclusion"] = (self.arrivals.inclusion(arrays["dt_s"]) if forward
                                   else np.ones_like(arrays["dt_s"]))
        return arrays

    def _behaviour_gap(self, arrays: dict[str, Any], logprobs: Any) -> float | None:
        """Sampler vs learner log-probs of the same tokens under the same params (the rows
        sampled with the params being trained), from the old-values pass when there is one."""
        if logprobs is None or spmd.multiprocess():  # (those are spread over the processes)
            return None
        resp = arrays["response_mask"] * arrays["fresh"][:, None]
        return float((np.abs(np.asarray(logprobs) - arrays["old_logprobs"]) * resp).max())

    def _warm_up(self, policy: Any, frozen: Any | None) -> dict[str, Any]:
        """Before the RL clock: compiles each service's sampler programs and the train step at
        the likeliest batch shapes of the initial evaluation's lengths (`run.warmup`). What a
        cold process would otherwise compile inside the budget, on the lanes the loop needs."""
        run, t0 = self.config.run, time.perf_counter()
        buckets = list(self.config.sampling.prompt_buckets)
        programs = sum(svc.warm_up(buckets) for svc in (policy, frozen) if svc is not None)
        t1 = time.perf_counter()
        forecast = ShapeForecast(run.batch_size, self.config.prompt.max_prompt_tokens,
                                 self.config.prompt.max_response_tokens, run.length_bucket,
                                 window=max(len(self.warmup_lengths), 1))
        for p, r in self.warmup_lengths:
            forecast.observe(p, r)
        pad, task = self.c.tokenizer.pad_id, self.task_ids[0] if self.multi else ""
        # The likeliest shapes, then the largest: every batch fits it, so no step compiles
        # inside the clock (a batch of an uncompiled shape runs padded to a compiled one).
        largest = (self.config.prompt.max_prompt_tokens, self.config.prompt.max_response_tokens)
        likely = [s for s in forecast.likely(run.precompile_min_prob) if s != largest]
        shapes = (likely[:run.warmup_shapes - 1] + [largest])[:run.warmup_shapes]
        execute = (run.warmup_execute and jax.default_backend() == "cpu"
                   and not spmd.multiprocess())
        compiled = []
        for p, r in shapes:
            stand_in = Experience(-1, "solve", [pad] * p, [pad] * r, [0.0] * r, self.loop.version,
                                  0.0, {}, "", None, True, 0.0, 1.0, 1.0, {}, task=task)
            if self._compile_step_ahead(p, r, [stand_in], execute=execute).result():
                compiled.append([p, r])  # one at a time
        t2 = time.perf_counter()
        out = {"seconds": t2 - t0, "sampler_s": t1 - t0, "sampler_programs": programs,
               "train_step_s": t2 - t1, "train_step_shapes": compiled}
        log.info("warm-up before the RL clock: %.1f s (%d sampler programs in %.1f s; train "
                 "step at (P, R) %s in %.1f s)", out["seconds"], programs, out["sampler_s"],
                 compiled, out["train_step_s"])
        return out

    def _precompile_ahead(self, recent: list[Experience]) -> None:
        """Compile the train step, off the lanes, for the next likely batch shape not compiled
        yet (rollout.collate.ShapeForecast), one at a time; `recent` (finished episodes, any
        number) are cut to that shape to stand in for a batch (their values are not used)."""
        run = self.config.run
        if not run.precompile or not recent or any(not f.done() for f in
                                                   self._compiling.values()):
            return
        compiled = self._compiled_shapes()
        probs = self.shapes.probabilities()
        todo = [s for s in self.shapes.likely(run.precompile_min_prob)
                if s not in compiled and s not in self._compiling
                and not self._pads_within_slack(s, compiled)]
        for s in todo:
            if self._compile_worth_it(s, probs[s], compiled):
                self._compile_step_ahead(*s, recent)
                return

    def _compile_worth_it(self, shape: tuple[int, int], prob: float,
                          compiled: set[tuple[int, int]]) -> bool:
        """rollout.collate.compile_pays_off for a likely shape, from this session's own
        measurements (run.precompile_payback; a shape no compiled one holds always is). Until
        one step and one compile have been timed, a shape that can run padded waits."""
        run = self.config.run
        cover = smallest_cover(shape, compiled)
        if run.precompile_payback <= 0 or cover is None:
            return True
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        share = 1.0 / cores if jax.default_backend() == "cpu" else 0.0
        steps_left = self._steps_left()
        if share > 0 and (steps_left is None or not self._step_s_per_token
                          or not self._compile_s):
            return False
        per_token = float(np.median(self._step_s_per_token)) if self._step_s_per_token else 0.0
        compile_s = float(np.median(self._compile_s)) if self._compile_s else 0.0
        ok = compile_pays_off(prob, steps_left or 0.0, per_token, sum(shape), sum(cover),
                              compile_s, share, run.precompile_payback)
        if not ok and shape not in self._declined:
            self._declined.add(shape)
            log.info("not compiling the train step ahead for (P=%d, R=%d): its batches run "
                     "padded to (%d, %d); expected saving %.1f s (p=%.2f x %.0f steps left x "
                     "%.2f ms/token x %d tokens) < %.1f x its cost %.1f s (%.1f s compile x "
                     "%.2f of the machine)", *shape, *cover,
                     prob * (steps_left or 0.0) * per_token * (sum(cover) - sum(shape)), prob,
                     steps_left or 0.0, 1e3 * per_token, sum(cover) - sum(shape),
                     run.precompile_payback, compile_s * share, compile_s, share)
        return ok

    def _steps_left(self) -> float | None:
        """Learner steps left in this run: to max_steps, and to the time budget at this
        session's mean seconds per step (None before its first step)."""
        run = self.config.run
        left = [float(run.max_steps - self.loop.step)]
        if run.time_budget_s > 0:
            if not self._train_steps:
                return None
            per_step = (self.loop.wall_s - self._session_wall0) / self._train_steps
            left.append((run.time_budget_s - self.loop.wall_s) / max(per_step, 1e-6))
        return max(min(left), 0.0)

    def _compiled_shapes(self) -> set[tuple[int, int]]:
        """(P, R) the train step is compiled for: run at, or compiled ahead."""
        return self._step_shapes | {s for s, f in self._compiling.items()
                                    if f.done() and f.result()}

    def _pads_within_slack(self, shape: tuple[int, int],
                           compiled: set[tuple[int, int]]) -> bool:
        """Whether a batch of `shape` runs padded to a compiled shape at most run.pad_slack
        longer (then compiling `shape` ahead is not worth its compile)."""
        cover = smallest_cover(shape, compiled)
        return cover is not None and sum(cover) <= (1 + self.config.run.pad_slack) * sum(shape)

    def _compile_step_ahead(self, p: int, r: int, recent: list[Experience],
                            execute: bool = False) -> concurrent.futures.Future:
        """Submits the train step's compile for (P, R) to the compile-ahead thread, with
        `recent` cut to that shape standing in for a batch; the future (True if compiled) is
        what a step at that shape waits for instead of compiling. execute: then run it once on
        a copy of the state (Learner.run_once; only while nothing trains)."""
        run = self.config.run
        # Stand-ins only for the shapes: cut to (p, r), so a credit span (positions in the
        # uncut response) is dropped; the mask's values do not change the compiled program.
        rows = [dataclasses.replace(e, prompt_ids=list(e.prompt_ids)[-p:],
                                    response_ids=list(e.response_ids)[:r],
                                    logprobs=list(e.logprobs)[:r], credit_span=None)
                for e in (recent * run.batch_size)[:run.batch_size]]
        try:
            host = self._host_arrays(rows, pad_to=(p, r), forward=False)
        except Exception as e:  # noqa: BLE001 - compiling ahead must never stop the run
            log.warning("compiling the train step ahead for P=%d, R=%d: no stand-in batch "
                        "(%r); a step at that shape compiles it", p, r, e)
            failed: concurrent.futures.Future = concurrent.futures.Future()
            failed.set_result(False)
            self._compiling[(p, r)] = failed
            return failed

        def compile_it() -> bool:
            t = time.perf_counter()
            self.leader.send("compile", host)
            try:
                arrays, _ = spmd.device_inputs(self.learner, self.state, self.reference, host,
                                               forward=False)
                self.learner.compile_train_step(arrays)
                self._compile_s.append(time.perf_counter() - t)
                if execute:
                    self.learner.run_once(self.state, arrays)
            except Exception as e:  # noqa: BLE001 - then the step compiles it, as without this
                log.warning("compiling the train step ahead for P=%d, R=%d failed: %r", p, r, e)
                return False
            log.info("train step compiled ahead%s for batch shape (%d, %d) (P=%d, R=%d): "
                     "%.1f s", " and run once" if execute else "", run.batch_size, p + r, p, r,
                     time.perf_counter() - t)
            return True

        self._compiling[(p, r)] = self._compiler.submit(compile_it)
        return self._compiling[(p, r)]

    def _learn(self, batch: list[Experience]) -> dict[str, float]:
        """Runs on the learner's lane: batch → (old values, ref log-probs if needed) →
        train_step → the new version published to the sampler."""
        learner, t0 = self.learner, time.perf_counter()
        limits = self.config.prompt
        own = batch_shape(batch, limits.max_prompt_tokens, limits.max_response_tokens,
                          self.config.run.length_bucket)
        # Not compiled for its own shape: padded to the smallest compiled one that holds it
        # (padding changes no loss), so the step compiles only when none does.
        compiled = self._compiled_shapes()
        shape = own if own in compiled else (smallest_cover(own, compiled) or own)
        ahead, waited = self._compiling.get(shape), 0.0
        if ahead is not None and not ahead.done():  # never compile the same shape twice
            t = time.perf_counter()
            ahead.result()
            waited = time.perf_counter() - t
        new_shape = shape not in compiled and (ahead is None or not ahead.result())
        self._step_shapes.add(shape)
        host = self._host_arrays(batch, pad_to=shape)
        sent = self.leader.send("train", host)
        arrays, logprobs = spmd.device_inputs(learner, self.state, self.reference, host)
        behaviour_gap = self._behaviour_gap(host, logprobs)
        tokens = arrays["tokens"]
        self.state, metrics = learner.train_step(self.state, arrays)
        out = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.leader.forget(sent)  # every process took part in this step: it read the commands
        # Sampler vs learner log-probs of the same tokens under the same params (only at
        # staleness 0): a check that both compute the same distribution.
        if "behaviour_logp_gap_max" in out:
            behaviour_gap = out.pop("behaviour_logp_gap_max")
        if behaviour_gap is not None:
            out["learner/behaviour_logp_gap_max"] = behaviour_gap
        self.loop.step += 1
        self.loop.version += 1
        # After device_get: the step is done, so the sampler's next call waits for the copy
        # at most, never for the learner.
        self.publisher.publish(self.state.policy_params, self.loop.version)
        self.loop.episodes_trained += len(batch)
        t1 = time.perf_counter()
        out["time/train_step_s"] = t1 - t0
        if new_shape:  # (its compile, with one execution: what compile-ahead weighs, at most)
            self._compile_s.append(t1 - t0)
        else:
            self._step_s_per_token.append(max(t1 - t0 - waited, 0.0) / tokens.shape[1])
        self._train_s += t1 - t0
        self._train_steps += 1
        # ~1 with one mesh (the lane is the learner's); with split devices, how much of the
        # step the sampler sat idle (for want of requests, too).
        out["sampler/idle_frac_during_learn"] = self.sampler_busy.idle_frac(t0, t1)
        out["learner/seq_len"] = float(tokens.shape[1])
        out["learner/padded_to_compiled"] = float(shape != own)  # 1: ran at a larger shape
        out["learner/compiled_in_step"] = float(new_shape)  # 1: this step's time has a compile
        out["learner/compiled_shapes"] = float(len(self._step_shapes))
        # Compiled ahead while episodes ran; the wait is the part the step still sat through.
        out["learner/compiled_ahead"] = float(sum(
            f.done() and f.result() for f in self._compiling.values()))
        out["time/compile_ahead_wait_s"] = waited
        out["learner/compile_ahead_declined"] = float(len(self._declined))
        if new_shape:  # this step's time includes compiling the step for the new shape
            log.info("train step for batch shape %s (new, %d shapes so far): %.1f s",
                     tokens.shape, len(self._step_shapes), out["time/train_step_s"])
        return out

    def _rollout_metrics(self, batch: list[Experience], pool: RolloutPool,
                         instrumenter: Instrumenter) -> dict[str, float]:
        recs = [e.record for e in batch]
        rewards = np.asarray([e.reward for e in batch])
        out = {
            "reward/mean": float(rewards.mean()), "reward/max": float(rewards.max()),
            "reward/valid_rate": float(np.mean([r["status"] == "valid" for r in recs])),
            "duration_s/mean": float(np.mean([e.duration_s for e in batch])),
            "episode_wall_s/mean": float(np.mean([e.finished_at - e.started_at
                                                  for e in batch])),
            "episodes/improve_rate": float(np.mean([e.kind == "improve" for e in batch])),
            "episodes/reused_run_rate": float(np.mean([e.reused_run for e in batch])),
            "episodes/staleness_mean": float(np.mean([self.loop.version - 1 - e.params_version
                                                      for e in batch])),
            "episodes/dropped": float(self.loop.episodes_dropped),
            "episodes/started": float(self.loop.episodes_started),
            "episodes/trained": float(self.loop.episodes_trained),
            "episodes/failed": float(self.loop.episodes_failed),
            "episodes/over_staleness": float(self.loop.episodes_over_staleness),
            "episodes/in_flight": float(pool.in_flight),
            "buffer/size": float(sum(len(b) for b in self.buffers.values())),
        }
        cut = [bool(e.parent_lines_omitted) for e in batch if e.kind == "improve"]
        if cut:  # improve prompts that left out lines of their parent to fit the budget
            out["episodes/improve_parent_cut_rate"] = float(np.mean(cut))
        if self.loop.best_score is not None:
            out["score/best"] = float(self.loop.best_score)
        for m in MILESTONES:
            out[f"milestones/{m}"] = float(np.mean([m in r.get("milestones", []) for r in recs]))
        stats = pool.stats()
        out["slots/utilisation"] = stats.utilisation
        out["slots/sync_utilisation"] = stats.sync_utilisation
        out["slots/admission_idle_frac"] = stats.admission_idle_frac
        inst = instrumenter.metrics()
        out.update(inst)
        if "instrument/lm_accept_rate" in inst:
            out["instrument/accept_rate"] = inst["instrument/lm_accept_rate"]
        return out

    def _save(self, force: bool = False) -> None:
        if self.ckpt.latest_step() == self.loop.step:
            return  # this step is saved already
        meta = {"loop": dataclasses.asdict(self.loop), "buffer": self.buffer.state_dict(),
                "arrivals": self.arrivals.state_dict(), "rescue": self.rescue.state_dict(),
                "config": self.config.to_dict(), "policy_version": self.loop.version,
                # lets `convert_hf_checkpoint.py --to_hf` export the policy without extra flags
                "model_config": dataclasses.asdict(self.c.model_config)}
        if self.multi:
            meta["multitask"] = {
                "task_mix": self.mix.state_dict(), "best": self.task_best,
                "buffers": {t: b.state_dict() for t, b in self.buffers.items()},
                "rescues": {t: r.state_dict() for t, r in self.rescues.items()}}
        self.leader.send("save", step=self.loop.step, force=force)
        self.ckpt.save(self.loop.step, self.state, meta, force=force)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"

