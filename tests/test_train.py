"""End to end: the default config's loop on a (small) warm start, resume after SIGKILL, and
config errors that fail before any work starts."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import task as task_config  # noqa: E402
from rl4mle_jax.components import validate_config  # noqa: E402
from tests.warm import WARMSTART_SETTINGS as WARMSTART  # noqa: E402  (the shared warm start)
from tests.warm import warm_config  # noqa: E402

QUICK = {"mesh.data": 1, "run.max_steps": 2, "run.batch_size": 4, "run.slots": 2,
         "run.checkpoint_every": 1, "run.time_budget_s": 0.0, "run.progress": False,
         "instrument.max_new_tokens": 256, "run.precompile": False}


def _config(cache_dir, **overrides):
    cfg = warm_config(cache_dir)
    cfg.update_from_flattened_dict({**QUICK, **overrides})
    return cfg


def _cli_flags(cache_dir, **overrides):
    flags = [f"--config.warmstart.cache_dir={cache_dir}"]
    for k, v in {**QUICK, **overrides}.items():
        flags.append(f"--config.{k}={v}")
    flags += [f"--config.warmstart.settings.{k}={v!r}" for k, v in WARMSTART.items()]
    return flags


def _records(path):
    lines = Path(path).read_text().splitlines()
    return [json.loads(line) for line in lines]  # every line must be valid JSON


def test_default_config_end_to_end(warm_cache, tmp_path):
    from rl4mle_jax.train import initial_eval_key, train

    workdir, cfg = tmp_path / "run", _config(warm_cache, **{"run.eval_samples": 2,
                                                            "run.precompile": True,
                                                            "run.warmup": True})
    summary = train(cfg, workdir, shared_evals=tmp_path / "evals")
    # The initial best-of-N is shared under its key for the other variants of a sweep.
    (shared,) = (tmp_path / "evals").iterdir()
    assert shared.read_text() == (workdir / "eval_initial.json").read_text()
    assert shared.stem != initial_eval_key(cfg)  # the warm start it evaluated is in the key

    names = {p.name for p in workdir.iterdir()}
    assert {"checkpoints", "experience.jsonl", "metrics.jsonl", "tb", "plots", "report.md",
            "eval_initial.json", "eval_final.json", "config.json", "provenance.json"} <= names
    start = json.loads((workdir / "provenance.json").read_text())["starts"][0]
    assert start["commit"] and "argv" in start
    assert {p.name for p in (workdir / "plots").iterdir()} >= {
        "reward.png", "best_score.png", "duration.png", "milestones.png", "instrumentation.png",
        "utilisation.png"}
    # The learner stepped twice, on batches of 4 finished episodes.
    metrics = _records(workdir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["grad_norm_actor"] > 0 for m in metrics)
    # The step was compiled ahead (before the clock, for the shapes forecast from the initial
    # evaluation; in the run only for a shape whose compile pays: with 2 steps, none that a
    # compiled shape holds); a step at a compiled shape waits for it, never compiles twice.
    assert max(m["learner/compiled_ahead"] for m in metrics) >= 1
    assert all(m["learner/compile_ahead_declined"] >= 0 for m in metrics)
    assert all(m["time/compile_ahead_wait_s"] >= 0 for m in metrics)
    assert summary["loop"]["step"] == 2 and summary["loop"]["episodes_trained"] == 8
    # Before the clock: the services' sampler programs, and the train step at the shapes the
    # initial evaluation's token lengths forecast (each candidate records them).
    warm = summary["warmup"]
    assert warm["sampler_programs"] >= 1 and warm["seconds"] > 0
    cands = json.loads((workdir / "eval_initial.json").read_text())["candidates"]
    assert all(c["prompt_tokens"] > 0 and c["response_tokens"] > 0 for c in cands)
    assert 1 <= len(warm["train_step_shapes"]) <= cfg.run.warmup_shapes
    # The largest shape among them: every batch fits it, so no step compiled inside the clock.
    largest = [cfg.prompt.max_prompt_tokens, cfg.prompt.max_response_tokens]
    assert largest in warm["train_step_shapes"]
    assert all(m["learner/compiled_in_step"] == 0 for m in metrics)
    assert all(m["learner/seq_len"] <= sum(largest) for m in metrics)
    assert "2" in {p.name for p in (workdir / "checkpoints").iterdir()}
    # Rewards came from the real sandbox and grader: programs ran (Δt measured) and were graded.
    logged = _records(workdir / "experience.jsonl")
    # Episodes still running at the end are logged with their censored elapsed time only.
    cancelled = [e for e in logged if e.get("cancelled")]
    assert all(not e["selected"] and e["elapsed_s"] >= 0 for e in cancelled)
    episodes = [e for e in logged if not e.get("cancelled")]
    assert len(episodes) >= 8
    ran = [e for e in episodes if e["record"]["exec_status"] is not None]
    assert ran, "no episode's program reached the sandbox"
    assert all(e["record"]["duration_s"] > 0 for e in ran)
    graded = [e for e in ran if e["record"]["grade"] is not None]
    assert graded and all(g["record"]["grade"]["task_id"] == "food-reviews" for g in graded)
    assert all(g["record"]["grade"]["split"] == "reward" for g in graded)
    for e in episodes:
        assert e["reward"] == e["record"]["reward"]
        assert {"kind", "code", "params_version", "started_at", "finished_at"} <= set(e)
    report = (workdir / "report.md").read_text()
    assert "initial policy" in report and "final policy" in report
    # Where the lane's time went: both services sampled (the policy for every episode, the
    # frozen copy for each program it instrumented), and the train steps.
    lane = summary["lane"]
    assert lane["train_steps"] == 2 and lane["train_steps_s"] > 0
    assert lane["policy"]["requests"] >= 8 and lane["policy"]["tokens"] > 0
    assert lane["policy"]["busy_s"] > 0 and "frozen" in lane
    # The static service merged the requests into calls of at most sampling.max_batch.
    calls = lane["policy"]["calls"]
    assert 1 <= calls <= lane["policy"]["requests"] <= calls * cfg.sampling.max_batch
    assert "Device lane time" in report
    assert f"{lane['policy']['requests']} requests in {calls} sampler calls" in report
    # Where the CPU went: this process, and the programs it ran (each fresh run's cpu_s).
    fresh = [e for e in ran if not e["reused_run"]]
    assert lane["host_cpu_s"] > 0 and lane["program_runs"] == len(fresh) > 0
    assert lane["programs_cpu_s"] == pytest.approx(
        sum(e["timings"]["program_cpu_s"] for e in fresh))
    assert "the sandboxed programs" in report
    assert "Warm-up before the RL clock" in report
    # The learning section: the curve and the first/last-quarter and before/after checks.
    assert "![learning curve](plots/learning_curve.png)" in report
    assert (workdir / "plots" / "learning_curve.png").stat().st_size > 0
    assert "first vs last quarter of 2 steps" in report and "best-of-2 valid rate" in report


def test_initial_eval_key_changes_with_what_the_initial_policy_sees(tmp_path):
    from rl4mle_jax.train import initial_eval_key

    key = initial_eval_key(_config(tmp_path))
    assert initial_eval_key(_config(tmp_path), {"warmstart": "/c/warmstart-1"}) != \
        initial_eval_key(_config(tmp_path), {"warmstart": "/c/warmstart-2"})
    for same in ({"learner.actor_lr": 1e-3}, {"run.batch_size": 2}, {"instrument.mode": "none"},
                 {"run.improve_prob": 0.0}, {"learner.duration_weighting": "off"}):
        assert initial_eval_key(_config(tmp_path, **same)) == key, same
    for other in ({"seed": 1}, {"task": "telco-churn"}, {"run.eval_samples": 5},
                  {"sampling.temperature": 1.0}, {"env.memory_mb": 1000},
                  {"prompt.max_response_tokens": 512}, {"run.reuse_runs": 0},
                  {"reward.rescale_min_se": 0.0}):
        assert initial_eval_key(_config(tmp_path, **other)) != key, other
    # A reward field added later, at its default, leaves the key of the evaluations made
    # before it existed (the sweeps' shared `_initial_evals`).
    old = _config(tmp_path)
    with old.unlocked():
        del old.reward["rescale_min_se"]
    assert initial_eval_key(old) == key


def test_resume_after_sigkill(warm_cache, tmp_path):
    workdir = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "experiments" / "run.py"),
           "--config", str(ROOT / "configs" / "task.py"), "--workdir", str(workdir),
           *_cli_flags(warm_cache, **{"run.max_steps": 4, "run.eval_samples": 0})]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    ckpts = workdir / "checkpoints"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if ckpts.exists() and any(p.name == "2" for p in ckpts.iterdir()):
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _records(workdir / "experience.jsonl")
    assert before

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    after = _records(workdir / "experience.jsonl")
    ids = [e["episode_id"] for e in after]
    assert len(ids) == len(set(ids)), "an episode was logged twice"
    assert after[:len(before)] == before, "episodes logged before the kill were lost"
    metrics = _records(workdir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    walls = [m["wall_s"] for m in metrics]
    assert walls == sorted(walls)
    assert "4" in {p.name for p in ckpts.iterdir()}
    assert (workdir / "report.md").exists() and (workdir / "plots" / "reward.png").exists()


def test_bad_config_fails_before_any_work(tmp_path):
    cfg = task_config.get_config()
    for key, value, message in [
        ("env.backend", "chroot", "config.env.backend"),
        ("run.slots", 0, "config.run.slots"),
        ("run.batch_size", 3, "config.run.batch_size"),  # 8 test devices on the data axis
        ("mesh.fsdp", 3, "config.mesh"),
        ("sampling.top_p", 0.9, "config.learner.top_p"),  # the learner must truncate alike
        ("learner.temperature", 1.0, "config.learner.temperature"),
        ("learner.agg_mode", "token-sum", "config.learner"),
        ("reward.normalisation", "zscore", "config.reward"),
    ]:
        bad = task_config.get_config()
        bad.update_from_flattened_dict({key: value})
        with pytest.raises(ValueError, match=message.replace(".", r"\.")):
            validate_config(bad)
    validate_config(cfg)
    # Unknown keys are refused by the command line itself, naming the key.
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
                          str(ROOT / "configs" / "task.py"), "--config.run.slotz=2",
                          "--workdir", str(tmp_path / "w")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "slotz" in out.stderr
    assert not (tmp_path / "w").exists()


def test_the_loop_runs_on_the_continuous_engine(warm_cache, tmp_path):
    """sampling.engine=continuous: the policy and the frozen copy sample through engine.py."""
    from rl4mle_jax.train import train

    cfg = _config(warm_cache, **{"run.max_steps": 1, "run.eval_samples": 0,
                                 "sampling.engine": "continuous", "sampling.engine_slots": 2})
    summary = train(cfg, tmp_path / "run")
    assert summary["loop"]["step"] == 1 and summary["loop"]["episodes_trained"] == 4
    logged = _records(tmp_path / "run" / "experience.jsonl")
    done = [e for e in logged if not e.get("cancelled")]
    assert done and all(e["response_tokens"] > 0 for e in done)
    inst = summary["instrument"]  # the frozen copy answered through its own engine
    assert inst.get("instrument/lm_accepted", 0) + inst.get("instrument/lm_rejected", 0) > 0
    # The lane report counts the engine's jitted step calls (one token step per call here).
    policy = summary["lane"]["policy"]
    assert "calls" not in policy and policy["engine_calls"] >= 1
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"{policy['requests']} requests, {policy['engine_calls']} engine calls" in report


def test_rollout_metrics_give_the_share_of_improve_prompts_that_cut_their_parent():
    import types

    from rl4mle_jax import train
    from rl4mle_jax.rollout.episode import Experience

    loop = types.SimpleNamespace(version=1, best_score=None, episodes_dropped=0,
                                 episodes_started=4, episodes_trained=4, episodes_failed=0,
                                 episodes_over_staleness=0)
    trainer = types.SimpleNamespace(loop=loop, buffers={})
    pool = types.SimpleNamespace(in_flight=0, stats=lambda: types.SimpleNamespace(
        utilisation=1.0, sync_utilisation=1.0, admission_idle_frac=0.0))
    inst = types.SimpleNamespace(metrics=lambda: {})

    def batch(rows):
        return [Experience(i, k, [1], [2], [0.0], 0, 0.5, {"status": "valid"}, "", None, True,
                           1.0, 1.0, 1.0, {}, parent_lines_omitted=n)
                for i, (k, n) in enumerate(rows)]
    out = train._Trainer._rollout_metrics(
        trainer, batch([("solve", None), ("improve", 0), ("improve", 10), ("improve", 3)]),
        pool, inst)
    assert out["episodes/improve_parent_cut_rate"] == pytest.approx(2 / 3)
    out = train._Trainer._rollout_metrics(trainer, batch([("solve", None)]), pool, inst)
    assert "episodes/improve_parent_cut_rate" not in out  # no improve prompt in the batch


@pytest.mark.parametrize("multi", [False, True])
def test_rank_bonus_reaches_the_learner_batch_only(multi):
    """run.rank_bonus changes the rewards the learner trains on (valid rows, per task), not the
    episodes' own rewards (the experience log and the metrics read those)."""
    import types

    import numpy as np

    from rl4mle_jax import train
    from rl4mle_jax.rl.learner_config import LearnerConfig
    from rl4mle_jax.rollout.episode import Experience
    from rl4mle_jax.run_config import RunConfig

    c = task_config.get_config()
    run = RunConfig(**{**c.run.to_dict(), "rank_bonus": 1.0})
    trainer = types.SimpleNamespace(
        config=types.SimpleNamespace(prompt=c.prompt, run=run),
        learner=types.SimpleNamespace(config=LearnerConfig()),
        c=types.SimpleNamespace(tokenizer=types.SimpleNamespace(pad_id=0)),
        loop=types.SimpleNamespace(version=0), multi=multi, task_ids=["a", "b"])
    rows = [(0.87, "valid", "a"), (-10.0, "failure", "a"), (0.85, "valid", "b"),
            (0.86, "valid", "a"), (0.80, "valid", "b")]
    batch = [Experience(i, "solve", [1] * 5, [2] * 7, [0.0] * 7, 0, r, {"status": s}, "", None,
                        True, 1.0, 1.0, 1.0, {}, task=t if multi else "")
             for i, (r, s, t) in enumerate(rows)]
    got = train._Trainer._host_arrays(trainer, batch)["rewards"]
    # One batch: ranks 3, -, 1, 2, 0 of four valid rows; per task: a (0.87 > 0.86), b (0.85 > 0.80).
    bonus = [0.5, 0.0, 0.5, -0.5, -0.5] if multi else [0.5, 0.0, -1 / 6, 1 / 6, -0.5]
    np.testing.assert_allclose(got, np.asarray([r for r, _, _ in rows]) + bonus, atol=1e-6)
    assert [e.reward for e in batch] == [r for r, _, _ in rows]


def test_rank_tie_se_ties_what_the_reward_split_cannot_resolve():
    """run.rank_tie_se reads each valid record's grader replicates (grade.score_boot) in the
    reward's scale: two close scores with a wide paired spread tie, a clear gap still ranks."""
    import types

    import numpy as np

    from rl4mle_jax import train
    from rl4mle_jax.rl.learner_config import LearnerConfig
    from rl4mle_jax.rollout.episode import Experience
    from rl4mle_jax.run_config import RunConfig

    c = task_config.get_config()
    k = np.linspace(-1, 1, 32)
    wobble = {0: 0.01 * np.sin(7 * k), 2: -0.01 * np.sin(7 * k), 3: 0.005 * np.cos(3 * k)}
    # A loss (lower is better): rewards are the negated scores (normalisation "flipped").
    scores = {0: 0.130, 2: 0.132, 3: 0.200}
    rows = []
    for i in range(4):
        if i == 1:
            rows.append((-10.0, {"status": "failure"}))
            continue
        boot = (scores[i] + 0.02 * k + wobble[i]).tolist()
        rows.append((-scores[i], {"status": "valid", "score": scores[i], "direction": "lower",
                                  "grade": {"score_boot": boot, "reference_scores": {}}}))
    batch = [Experience(i, "solve", [1] * 5, [2] * 7, [0.0] * 7, 0, r, rec, "", None,
                        True, 1.0, 1.0, 1.0, {}, task="")
             for i, (r, rec) in enumerate(rows)]

    def rewards(tie_se):
        run = RunConfig(**{**c.run.to_dict(), "rank_bonus": 1.0, "rank_tie_se": tie_se})
        trainer = types.SimpleNamespace(
            config=types.SimpleNamespace(prompt=c.prompt, run=run, reward=c.reward),
            learner=types.SimpleNamespace(config=LearnerConfig()),
            c=types.SimpleNamespace(tokenizer=types.SimpleNamespace(pad_id=0)),
            loop=types.SimpleNamespace(version=0), multi=False, task_ids=[""])
        return train._Trainer._host_arrays(trainer, batch)["rewards"] - [r for r, _ in rows]

    # Strict ranks: 0.130 < 0.132 < 0.200 (lower is better) -> +1/2, 0, -1/2.
    np.testing.assert_allclose(rewards(0.0), [0.5, 0.0, 0.0, -0.5], atol=1e-6)
    # Tied: the two close rows share the top two ranks, the far one stays last.
    np.testing.assert_allclose(rewards(1.0), [0.25, 0.0, 0.25, -0.5], atol=1e-6)


def test_compile_ahead_stand_ins_drop_credit_spans_and_never_stop_the_run():
    """A forecast shape shorter than a recent episode cuts its response for the stand-in batch:
    the episode's credit span (positions in the uncut response) is dropped instead of failing
    build_batch (a run on food-reviews died of this); and a stand-in batch that cannot be built
    gives a failed compile (the step compiles that shape itself), not an exception."""
    import concurrent.futures
    import types

    from rl4mle_jax import train
    from rl4mle_jax.rl.learner_config import LearnerConfig
    from rl4mle_jax.rollout.episode import Experience

    c = task_config.get_config()
    submitted = []
    trainer = types.SimpleNamespace(
        config=types.SimpleNamespace(prompt=c.prompt, run=c.run),
        learner=types.SimpleNamespace(config=LearnerConfig()),
        c=types.SimpleNamespace(tokenizer=types.SimpleNamespace(pad_id=0)),
        loop=types.SimpleNamespace(version=0), multi=False, task_ids=[""], _compiling={},
        _compiler=types.SimpleNamespace(submit=lambda fn: submitted.append(fn) or "future"))
    trainer._host_arrays = lambda *a, **k: train._Trainer._host_arrays(trainer, *a, **k)
    long = Experience(58, "solve", [1] * 300, [2] * 700, [0.0] * 700, 0, -10.0,
                      {"status": "failure"}, "", None, True, 1.0, 1.0, 1.0, {},
                      credit_span=(626, 684))
    assert train._Trainer._compile_step_ahead(trainer, 512, 512, [long]) == "future"
    assert len(submitted) == 1 and trainer._compiling[(512, 512)] == "future"
    # a stand-in batch that cannot be built (here _host_arrays raises): a failed compile, logged
    bad = Experience(59, "solve", [1] * 100, [2] * 10, [0.0] * 10, 0, 0.5, {}, "", None, True,
                     1.0, 1.0, 1.0, {})
    trainer._host_arrays = lambda *a, **k: (_ for _ in ()).throw(ValueError("too long"))
    got = train._Trainer._compile_step_ahead(trainer, 512, 256, [bad])
    assert isinstance(got, concurrent.futures.Future) and got.result() is False
    assert trainer._compiling[(512, 256)] is got and len(submitted) == 1
