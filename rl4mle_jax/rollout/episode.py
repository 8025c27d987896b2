"""One episode: prompt → sample → extract → instrument (+verify) → execute → grade → reward.

Host-side asyncio. The two model calls go through generation services (the policy for the
action, the frozen copy for LM instrumentation); execute → grade → reward is the environment's
one run-and-grade step (`env.execute.arun_and_grade`), off the event loop, so K episodes overlap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from typing import Any

from rl4mle_jax.env import execute
from rl4mle_jax.env import prompts as prompts_lib
from rl4mle_jax.env.actions import extract_action
from rl4mle_jax.env.instrument_lm import Instrumenter
from rl4mle_jax.env.reward import RewardConfig
from rl4mle_jax.rollout.buffer import SolutionBuffer
from rl4mle_jax.rollout.credit import error_token_span
from rl4mle_jax.rollout.run_cache import RunCache
from rl4mle_jax.rollout.service import GenerationService

log = logging.getLogger("rl4mle_jax.episode")


@dataclasses.dataclass
class Experience:
    """A finished episode: what the learner trains on and what the experience log keeps."""

    episode_id: int
    kind: str  # "solve" | "improve"
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # behaviour log-probs of response_ids
    params_version: int
    reward: float
    record: dict[str, Any]  # RewardRecord.to_dict()
    plan: str
    code: str | None  # the agent's own (un-instrumented) code
    response_stopped: bool
    started_at: float
    finished_at: float
    duration_s: float  # the program's own time in the sandbox (0 when nothing ran)
    timings: dict[str, float]  # seconds: sample_s, instrument_s, sandbox_wall_s, grade_s,
    # program_cpu_s (a reused run carries its original's)
    parent_episode: int | None = None  # for improve prompts: the solution being improved
    reused_run: bool = False  # the run of an identical earlier program (rollout/run_cache.py)
    task: str = ""  # multi-task training: the task id (empty, and not logged, for one task)
    # [start, end) of the response tokens a syntax error's line holds (rollout/credit.py);
    # None: the outcome belongs to the whole response
    credit_span: tuple[int, int] | None = None
    # Improve prompts: how many of the parent's lines the prompt left out to fit its budget
    # (0: shown whole; None: a solve prompt)
    parent_lines_omitted: int | None = None

    def log_record(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The experience-log line (token ids left out; the code and every reward part kept)."""
        rec = {k: v for k, v in dataclasses.asdict(self).items()
               if k not in ("prompt_ids", "response_ids", "logprobs")
               and not (k == "task" and not v)}
        rec.update(prompt_tokens=len(self.prompt_ids), response_tokens=len(self.response_ids))
        rec.update(extra or {})
        return rec


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    improve_prob: float = 0.5  # the paper's share of self-improvement prompts
    split: str = "reward"  # RL is never rewarded on the private test labels
    timeout_s: float = 60.0
    instrument_timeout_s: float = 120.0  # the frozen copy's answer; then static fallback
    reuse_runs: int = 0  # reuses of an identical program's run (rollout/run_cache.py); 0: none


class EpisodeRunner:
    """Builds requests (solve or improve) and runs episodes for one task."""

    def __init__(self, task: Any, tokenizer: Any, policy: GenerationService, sandbox: Any,
                 instrumenter: Instrumenter, buffer: SolutionBuffer, context: Any,
                 cfg: EpisodeConfig, reward_cfg: RewardConfig,
                 prompt_cfg: prompts_lib.PromptConfig, frozen: GenerationService | None = None,
                 rng: random.Random | None = None):
        self.task, self.tokenizer, self.policy, self.sandbox = task, tokenizer, policy, sandbox
        self.instrumenter, self.buffer, self.context = instrumenter, buffer, context
        self.cfg, self.reward_cfg, self.prompt_cfg = cfg, reward_cfg, prompt_cfg
        self.frozen = frozen
        self.rng = rng or random.Random(0)
        self.chat_template = tokenizer.apply_chat_template if tokenizer.is_chat else None
        self.run_cache = RunCache(cfg.reuse_runs)
        self._told_parent_cut = False

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def make_request(self, episode_id: int) -> dict[str, Any]:
        """Solve, or (with probability improve_prob, once a valid solution exists) improve."""
        parent = None
        if self.buffer and self.rng.random() < self.cfg.improve_prob:
            parent = self.buffer.sample(self.rng)
        return {"episode_id": episode_id, "kind": "improve" if parent else "solve",
                "parent": parent}

    def prompt_for(self, request: dict[str, Any]) -> prompts_lib.Prompt:
        """The solve prompt, or the improve prompt on the parent's code and reward record."""
        parent = request.get("parent")
        kw = dict(cfg=self.prompt_cfg, chat_template=self.chat_template,
                  count_tokens=self.count_tokens)
        if parent:
            prompt = prompts_lib.improve_prompt(self.context, parent["code"], parent["record"],
                                                **kw)
            omitted = prompt.trimmed.get("code_lines_omitted", 0)
            if omitted and not self._told_parent_cut:
                # Said once, not warned: for the tiny default the cut is no harm (README,
                # "Learner": the whole parent at 768 tokens learned less, docs/sweep_prompt).
                self._told_parent_cut = True
                log.info(
                    "improve prompt: %d of the earlier program's %d lines are left out to fit "
                    "prompt.max_prompt_tokens=%d; the policy writes them without seeing them "
                    "(metric episodes/improve_parent_cut_rate, experience field "
                    "parent_lines_omitted)",
                    omitted, len(parent["code"].splitlines()), self.prompt_cfg.max_prompt_tokens)
            return prompt
        return prompts_lib.solve_prompt(self.context, **kw)

    def render_prompt(self, request: dict[str, Any]) -> str:
        return self.prompt_for(request).text

    async def __call__(self, request: dict[str, Any]) -> Experience:
        started = time.time()
        timings: dict[str, float] = {}
        prompt = self.prompt_for(request)
        prompt_ids = self.tokenizer.encode(prompt.text)

        t = time.perf_counter()
        gen = await self.policy.generate(prompt_ids)
        timings["sample_s"] = time.perf_counter() - t
        response = self._decode(gen.response_ids)
        action = extract_action(response)
        span = error_token_span(response, gen.response_ids, self._decode, action)

        duration_s, reused = 0.0, False
        if not action.ok:
            record = execute.no_run_record(action, self.cfg.split, self.reward_cfg).reward
        else:
            key = RunCache.key(action.code, self.cfg.split, self.cfg.timeout_s)
            (record, duration_s, run_timings), reused = await self.run_cache.get(
                key, lambda: self._run(action))
            timings.update(run_timings)

        rec = record.to_dict()
        parent = request.get("parent")
        return Experience(
            episode_id=request["episode_id"], kind=request["kind"], prompt_ids=prompt_ids,
            response_ids=gen.response_ids, logprobs=gen.logprobs,
            params_version=gen.params_version, reward=float(record.reward), record=rec,
            plan=action.plan, code=action.code, response_stopped=gen.stopped,
            started_at=started, finished_at=time.time(), duration_s=duration_s,
            timings=timings,
            parent_episode=parent.get("episode_id") if parent else None, reused_run=reused,
            task=request.get("task", ""), credit_span=span,
            parent_lines_omitted=(prompt.trimmed.get("code_lines_omitted", 0) if parent
                                  else None))

    def _decode(self, ids: list[int]) -> str:
        """A response's text: the one decoding every step of the episode reads (and
        rollout.credit maps back to tokens)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def _run(self, action: Any) -> tuple[Any, float, dict[str, float]]:
        """Instrument, execute, grade: (reward record, Δt in the sandbox, timings)."""
        t = time.perf_counter()
        program = await self._instrument(action.code)
        timings = {"instrument_s": time.perf_counter() - t}
        run = await execute.arun_and_grade(action.code, self.task, self.sandbox,
                                           split=self.cfg.split, program=program,
                                           cfg=self.reward_cfg, timeout_s=self.cfg.timeout_s,
                                           action=action)
        timings.update(sandbox_wall_s=run.timings["sandbox_wall_s"],
                       grade_s=run.timings["grade_s"])
        cpu = (run.exec or {}).get("cpu_s")
        if cpu is not None:  # the program's own CPU seconds (the launcher's wait4)
            timings["program_cpu_s"] = float(cpu)
        return run.reward, run.duration_s, timings

    async def _instrument(self, code: str) -> Any:
        """LM instrumentation by the frozen copy (verified; static fallback) or static/none."""
        if self.instrumenter.mode != "lm":
            return execute.instrument(code, self.instrumenter)
        if self.frozen is None:
            raise ValueError("instrumentation mode 'lm' needs the frozen-copy generation service")
        prompt_ids = self.tokenizer.encode(self.instrumenter.prompt(code))
        try:
            gen = await asyncio.wait_for(self.frozen.generate(prompt_ids),
                                         self.cfg.instrument_timeout_s)
        except asyncio.TimeoutError:
            # An answer that never comes is a rejection like any other: static fallback.
            return self.instrumenter.reject(
                code, "timeout", f"no answer within {self.cfg.instrument_timeout_s:.0f} s")
        response = self._decode(gen.response_ids)
        return execute.instrument(code, lambda c: self.instrumenter.from_lm_response(c, response))
