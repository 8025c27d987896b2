"""Configs: generated from the dataclasses that own their fields, every field settable from the
command line, today's values unchanged, no JAX on import, errors that name the key."""

import dataclasses
import inspect
import json
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import ablations, qwen2_5_3b  # noqa: E402
from configs import task as task_config  # noqa: E402
from rl4mle_jax import run_config  # noqa: E402
from rl4mle_jax.env.instrument_lm import INSTRUMENT_MODES  # noqa: E402
from rl4mle_jax.env.reward import MILESTONE_EVIDENCE, NORMALISATIONS  # noqa: E402
from rl4mle_jax.env.sandbox import BACKENDS, Sandbox  # noqa: E402
from rl4mle_jax.env.trim import TRIM_FIRST  # noqa: E402
from rl4mle_jax.rl import learner_config as lc  # noqa: E402
from rl4mle_jax.rollout.collate import DURATION_SOURCES, build_batch  # noqa: E402
from rl4mle_jax.rollout.task_mix import TASK_SAMPLING  # noqa: E402
from rl4mle_jax.warmstart.config import WarmStartConfig  # noqa: E402

# configs/*.py of commit 8174df5 (before the sections were generated), flattened, and the values
# changed on purpose since (each with its reason).
FROZEN = json.loads((Path(__file__).with_name("config_frozen.json")).read_text())
CHANGED = {
    # issue 11: best-of-32 resolves a valid-rate change of 0.25; best-of-8 does not
    "task": {"run.eval_samples": 32,
             # 8 slots + run reuse: 25 learner steps in 300 s instead of 14 (README); 12 slots
             # 23-28 against 22 (docs/sweep_slots)
             "run.slots": 12,
             # a leave-one-out batch baseline, no critic: the separate critic learned nothing
             # in 300 s (docs/sweep_critic, docs/sweep_rloo)
             "learner.critic": "none", "learner.advantage_estimator": "rloo",
             # entropy minimisation: the trained batches' failure floor (docs/sweep_entropy),
             # at the confident positions only since docs/sweep_gate
             "learner.entropy_coef": -2.0, "learner.entropy_gate": 0.9, "run.rank_bonus": 1.0,
             # flipped paid hotel-rates' valid programs (RMSE ~23) less than a failure; "auto"
             # is flipped on every task whose baseline scores within 1 of 0 (README)
             "reward.normalisation": "auto"},
    "ablations": {"base.run.slots": 12, "base.learner.critic": "none",
                  "base.learner.advantage_estimator": "rloo", "base.learner.entropy_coef": -2.0,
                  "base.learner.entropy_gate": 0.9, "base.run.rank_bonus": 1.0,
                  "base.reward.normalisation": "auto"},
}
for _name, _values in CHANGED.items():
    FROZEN[_name].update(_values)

# Allowed values of the string fields that have them (the owners' lists).
CHOICES = {
    ("env", "backend"): BACKENDS,
    ("env", "ray_inner"): tuple(b for b in BACKENDS if b != "ray"),
    ("instrument", "mode"): INSTRUMENT_MODES,
    ("run", "duration_source"): DURATION_SOURCES,
    ("reward", "normalisation"): NORMALISATIONS,
    ("reward", "milestone_evidence"): MILESTONE_EVIDENCE,
    ("learner", "critic"): lc.CRITIC_MODES,
    ("learner", "kl_mode"): lc.KL_MODES,
    ("learner", "advantage_estimator"): lc.ADVANTAGE_ESTIMATORS,
    ("learner", "agg_mode"): lc.AGG_MODES,
    ("learner", "kl_estimator"): lc.KL_ESTIMATORS,
    ("learner", "entropy_schedule"): lc.ENTROPY_SCHEDULES,
    ("learner", "lr_schedule"): lc.LR_SCHEDULES,
    ("learner", "duration_weighting"): lc.DURATION_MODES,
    ("learner", "off_policy"): lc.OFF_POLICY_MODES,
    ("learner", "failure_credit"): lc.FAILURE_CREDIT_MODES,
    ("run", "admission"): run_config.ADMISSION_MODES,
    ("run", "eval_pick"): run_config.PICK_RULES,
    ("run", "task_sampling"): TASK_SAMPLING,
    ("sampling", "engine"): run_config.ENGINES,
    ("model", "dtype"): ("float32", "bfloat16"),
    ("prompt", "trim_first"): TRIM_FIRST,
    ("warmstart.settings", "sandbox_backend"): ("auto", "bwrap", "subprocess"),
}
# Values the walk must not pick (they would make the combined config invalid).
NOT = {("learner", "advantage_estimator"): ("gae",), ("learner", "critic"): ("none",)}
# Fields whose generic other value (a float 1.0 doubled, 0.9 + 0.5) would be out of range.
OTHER = {("sampling", "top_p"): 0.9, ("learner", "top_p"): 0.9, ("learner", "entropy_gate"): 0.5,
         ("learner", "entropy_disagree"): -0.5, ("env", "preimport"): "numpy,pandas"}


def _flatten(config) -> dict:
    out = {}

    def walk(d, prefix):
        for k, v in d.items():
            if hasattr(v, "items"):
                walk(v, f"{prefix}{k}.")
            else:
                out[prefix + k] = v
    walk(config.to_dict(), "")
    return json.loads(json.dumps(out))  # tuples as lists, as in the frozen copy


def _parse(argv: list[str]):
    """The real command line: ml_collections' config flag on fresh absl FlagValues."""
    fv = flags.FlagValues()
    argv = ["prog", *argv]
    config_flags.DEFINE_config_file("config", None, "config file", flag_values=fv,
                                    lock_config=True, sys_argv=argv)
    fv(argv)
    return fv.config


def _sections():
    """(section path, dataclass, field names) of every generated section."""
    out = [(name, cls, [f.name for f in dataclasses.fields(cls)])
           for name, cls in run_config.SECTIONS.items()]
    out.append(("warmstart", run_config.WarmStartSection,
                [f.name for f in dataclasses.fields(run_config.WarmStartSection)]))
    out.append(("warmstart.settings", WarmStartConfig,
                [f.name for f in dataclasses.fields(WarmStartConfig)
                 if f.name not in run_config.WARMSTART_FROM_PROMPT]))
    return out


def _other_value(section: str, name: str, default, hint):
    """A value of the field's type that differs from its default (valid where we know how)."""
    if (section, name) in OTHER:
        return OTHER[section, name]
    if (section, name) in CHOICES:
        skip = (default, *NOT.get((section, name), ()))
        return next(v for v in CHOICES[section, name] if v not in skip)
    if default is None:
        kind = run_config._placeholder_type(hint)
        return {float: 0.25, int: 7, bool: True, str: "ray://head:10001"}[kind]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default + 0.5 if default < 1 else default * 2
    if isinstance(default, str):
        return f"x-{name}"
    if isinstance(default, tuple):
        if name == "model_overrides":
            return (("num_hidden_layers", 2),)
        if name == "milestones":
            return default[:-1]
        return (*default, max(default) * 2)
    raise AssertionError(f"no test value for {section}.{name}={default!r}")


def _cli(value) -> str:
    return repr(value) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize("module", ["configs.task", "configs.qwen2_5_3b", "configs.ablations",
                                    "rl4mle_jax.run_config", "rl4mle_jax.rl.learner_config"])
def test_config_import_needs_no_jax(module):
    code = (f"import sys, {module} as m; getattr(m, 'get_config', lambda: 0)(); "
            "bad = sorted(k for k in ('jax', 'optax', 'flax') if k in sys.modules); "
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_every_field_is_set_from_the_command_line():
    base = task_config.get_config()
    argv, want = [f"--config={ROOT / 'configs' / 'task.py'}"], {}
    for section, cls, names in _sections():
        hints = typing.get_type_hints(cls)
        current = base
        for part in section.split("."):
            current = current[part]
        keys = set(current.keys()) - ({"settings"} if section == "warmstart" else set())
        assert sorted(keys) == sorted(names), section  # the section is the dataclass
        for name in names:
            value = _other_value(section, name, current[name], hints[name])
            assert value != current[name], f"{section}.{name}"
            argv.append(f"--config.{section}.{name}={_cli(value)}")
            want[f"{section}.{name}"] = value
    for key, value in (("seed", 3), ("task", "pizza"), ("data_root", "/tmp/tasks")):
        argv.append(f"--config.{key}={value}")
        want[key] = value
    assert {"learner.gamma", "learner.lam", "learner.dual_clip_c", "learner.value_clip_eps",
            "learner.kl_estimator", "learner.remat", "reward.require_training",
            "learner.duration_max_weight", "run.duration_floor_s"} <= set(want)

    config = _parse(argv)
    for key, value in want.items():
        got = config
        for part in key.split("."):
            got = got[part]
        assert got == value and type(got) is type(value), (key, got, value)
    # ...and each dataclass accepts what arrived.
    for section, cls, names in _sections():
        current = config
        for part in section.split("."):
            current = current[part]
        values = {k: v for k, v in current.items() if k in names}
        if cls is WarmStartConfig:
            built = WarmStartConfig.from_mapping(values)
        else:
            built = run_config.from_section(cls, values)
        for name in names:
            assert getattr(built, name) == want[f"{section}.{name}"], (section, name)


@pytest.mark.parametrize("name,module", [("task", task_config), ("qwen2_5_3b", qwen2_5_3b),
                                         ("ablations", ablations)])
def test_todays_values_are_unchanged(name, module):
    now, before = _flatten(module.get_config()), FROZEN[name]
    assert set(before) <= set(now), sorted(set(before) - set(now))
    for key, value in before.items():
        assert now[key] == value and type(now[key]) is type(value), (key, now[key], value)


def test_sandbox_section_has_the_sandboxs_defaults():
    params = inspect.signature(Sandbox).parameters
    for f in dataclasses.fields(run_config.SandboxConfig):
        if f.name != "timeout_s":  # 0 in a config: the task's own limit
            assert f.default == params[f.name].default, f.name
    kwargs = run_config.SandboxConfig(timeout_s=0.0).sandbox_kwargs(task_timeout_s=42.0)
    assert kwargs["timeout_s"] == 42.0 and set(kwargs) <= set(params)


def test_allowed_values_live_once():
    from rl4mle_jax.rl import advantages, duration, ppo, state

    assert ppo.AGG_MODES is lc.AGG_MODES and ppo.KL_ESTIMATORS is lc.KL_ESTIMATORS
    assert ppo.ENTROPY_SCHEDULES is lc.ENTROPY_SCHEDULES
    assert duration.DURATION_MODES is lc.DURATION_MODES
    assert state.LR_SCHEDULES is lc.LR_SCHEDULES
    assert set(advantages.ADVANTAGE_ESTIMATORS) == set(lc.ADVANTAGE_ESTIMATORS)
    assert run_config.BACKENDS is BACKENDS and run_config.INSTRUMENT_MODES is INSTRUMENT_MODES
    assert run_config.DURATION_SOURCES is DURATION_SOURCES


def test_qwen_batch_8_fails_in_validation_naming_the_keys():
    from rl4mle_jax.components import validate_config

    config = _parse([f"--config={ROOT / 'configs' / 'qwen2_5_3b.py'}:/models/qwen",
                     "--config.run.batch_size=8"])
    with pytest.raises(ValueError) as e:
        validate_config(config)
    msg = str(e.value)
    for key in ("config.run.batch_size", "learner.num_minibatches=4",
                "learner.micro_batch_size=8"):
        assert key in msg, msg
    config.run.batch_size = 32
    validate_config(config)


@pytest.mark.parametrize("key,value,message", [
    ("env.memory_mb", 8, "config.env.memory_mb"),
    ("env.timeout_s", -1.0, "config.env.timeout_s"),
    ("run.duration_source", "wall", "config.run.duration_source"),
    ("run.duration_floor_s", -0.1, "config.run.duration_floor_s"),
    ("run.rank_bonus", -0.5, "config.run.rank_bonus"),
    ("instrument.mode", "regex", "config.instrument.mode"),
    ("sampling.top_k", -1, "config.sampling.top_k"),
    ("sampling.min_p", 1.0, "config.sampling.min_p"),
    ("sampling.min_p", 0.1, "config.learner.min_p"),  # the learner must truncate alike
    ("learner.top_k", 40, "config.learner.top_k"),
    ("learner.kl_estimator", "k4", "config.learner"),
    ("learner.duration_weighting", "linear", "config.learner"),
    ("learner.duration_max_weight", 0.0, "config.learner"),
    ("reward.milestone_evidence", "text", "config.reward"),
    ("reward.rescale_min_se", -1.0, "config.reward"),
    ("run.eval_pick", "mode", "config.run.eval_pick"),
    ("run.eval_select_folds", -1, "config.run.eval_select_folds"),
    ("run.eval_finalists", 0, "config.run.eval_finalists"),
    ("run.eval_finalist_se", -1.0, "config.run.eval_finalist_se"),
    ("run.precompile_payback", -1.0, "config.run.precompile_payback"),
    ("learner.num_minibatches", 3, "config.run.batch_size"),
    ("prompt.trim_first", "head", "config.prompt.trim_first"),
])
def test_bad_values_name_the_key(key, value, message):
    from rl4mle_jax.components import validate_config

    config = task_config.get_config()
    config.mesh.data = 1
    config.update_from_flattened_dict({key: value})
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        validate_config(config)


def test_prompt_trim_first_reaches_the_loops_prompt_config():
    # The loop's improve prompts and its warm start's pairs (whose cache key holds the whole
    # prompt config) are rendered with components._prompt_config: the flag must arrive there.
    from rl4mle_jax.components import _prompt_config

    config = _parse([f"--config={ROOT / 'configs' / 'task.py'}",
                     "--config.prompt.trim_first=choices"])
    assert _prompt_config(config, chat=False).trim_first == "choices"
    assert _prompt_config(task_config.get_config(), chat=True).trim_first == "imports"


def test_duration_floor_reaches_the_batch():
    exps = [types.SimpleNamespace(episode_id=i, prompt_ids=[1], response_ids=[2], logprobs=[0.0],
                                  reward=0.0, duration_s=d, started_at=0.0, finished_at=1.0)
            for i, d in enumerate((0.0, 2.0))]
    default = build_batch(exps, 2, 2, 0, "execution")["dt_s"]
    assert default.tolist() == pytest.approx([0.05, 2.0])
    floored = build_batch(exps, 2, 2, 0, "execution", duration_floor_s=0.5)["dt_s"]
    assert floored.tolist() == pytest.approx([0.5, 2.0])


def test_paper_config_runs_every_program():
    """Run reuse (run.reuse_runs) is the CPU default's; the paper's setting runs every program."""
    assert qwen2_5_3b.get_config().run.reuse_runs == 0
    assert task_config.get_config().run.reuse_runs > 0


def test_paper_config_keeps_the_papers_ppo():
    """What configs/task.py changed for the tiny model on CPU does not reach the paper's
    setting: GAE with a separate critic and whitened advantages, T = 0.7, no entropy term,
    the paper's reward alone."""
    c = qwen2_5_3b.get_config()
    learner = lc.LearnerConfig.from_dict(c.learner)
    assert (learner.critic, learner.advantage_estimator, learner.group_size) == \
        ("separate", "gae", 1)
    assert learner.whiten_advantages in (None, True) and learner.entropy_coef == 0.0
    assert learner.entropy_gate == 0.0
    cpu_default = lc.LearnerConfig.from_dict(task_config.get_config().learner)
    assert learner.pg_coef == 1.0 == cpu_default.pg_coef  # both train on the reward
    assert learner.temperature == c.sampling.temperature == 0.7
    assert c.run.rank_bonus == 0.0 and c.reward.normalisation == "flipped"


SWEEPS = sorted(p.stem for p in (ROOT / "configs").glob("*.py")
                if p.stem != "sweep_base" and "sweep_config(" in p.read_text())


def test_every_sweep_config_is_checked():
    assert {"learning_check", "sweep_rloo", "sweep_lr_rloo", "sweep_tiny"} <= set(SWEEPS)


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_configs_give_valid_runs(name):
    """Every variant x seed of each sweep over configs/task.py makes a config that validates
    (what experiments/sweep.py trains), and a task argument reaches the base."""
    import copy
    import importlib

    from rl4mle_jax.components import validate_config

    sweep = importlib.import_module(f"configs.{name}").get_config("digits")
    assert sweep.base.task == "digits" and sweep.base.run.progress is False
    for variant, overrides in sweep.variants.items():
        assert "." not in variant  # ConfigDict refuses dotted keys
        for seed in sweep.get("variant_seeds", {}).get(variant, sweep.seeds):
            cfg = copy.deepcopy(sweep.base)
            cfg.update_from_flattened_dict(dict(overrides))
            cfg.seed = int(seed)
            cfg.mesh.data = 1  # the sweeps run on one device; the tests have 8
            validate_config(cfg)


def test_a_reward_that_pays_valid_programs_less_than_failures_is_named(caplog):
    """Flipped, hotel-rates' baseline RMSE (~23) is paid -23, below a failure with every
    milestone (-9.4): build_components warns and names the fix; auto and rescaled do not."""
    import logging
    import types

    from rl4mle_jax import components
    from rl4mle_jax.env.reward import RewardConfig

    task = types.SimpleNamespace(id="hotel-rates", metric="rmse", direction="lower",
                                 reference_scores={"reward": {"baseline": 22.77,
                                                              "strong": 14.30}},
                                 reference_se={})
    with caplog.at_level(logging.WARNING, logger=components.log.name):
        components._check_valid_beats_failure(task, RewardConfig())
    assert "hotel-rates" in caplog.text and "learn to fail" in caplog.text, caplog.text
    for norm in ("auto", "rescaled"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=components.log.name):
            components._check_valid_beats_failure(task, RewardConfig(normalisation=norm))
        assert not caplog.text, (norm, caplog.text)
    auc = types.SimpleNamespace(id="t", metric="auc", direction="higher",
                                reference_scores={"reward": {"baseline": 0.86}}, reference_se={})
    with caplog.at_level(logging.WARNING, logger=components.log.name):
        components._check_valid_beats_failure(auc, RewardConfig())
    assert not caplog.text


def test_the_rescaled_unit_is_logged_where_the_reward_rescales(caplog):
    """build_components measures a split's standard error only for a task whose reward
    rescales ("rescaled"; "auto" with a baseline over 1 in size), and logs the unit, saying
    when the split's noise, not the references' gap, set it."""
    import logging
    import types

    from rl4mle_jax import components
    from rl4mle_jax.env.reward import RewardConfig

    def task(base, strong, se=None):
        return types.SimpleNamespace(id="t", metric="mae", direction="lower",
                                     reference_scores={"reward": {"baseline": base,
                                                                  "strong": strong}},
                                     reference_se={} if se is None else {"reward": se})
    from rl4mle_jax.env.reward import rescales
    auto, rescaled = RewardConfig(normalisation="auto"), RewardConfig(normalisation="rescaled")
    assert rescales(task(12271.7, 11652.0).reference_scores["reward"], auto)
    assert not rescales(task(0.86, 0.87).reference_scores["reward"], auto)
    assert rescales(task(0.86, 0.87).reference_scores["reward"], rescaled)
    assert not rescales({}, rescaled)
    assert not rescales(task(12271.7, 11652.0).reference_scores["reward"], RewardConfig())
    with caplog.at_level(logging.INFO, logger=components.log.name):
        components._log_rescale_unit(task(12271.7, 11652.0, 1200.0), auto)
    assert "difference of 2400" in caplog.text and "below what the split resolves" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=components.log.name):
        components._log_rescale_unit(task(22.77, 14.30, 1.0), auto)
    assert "difference of 8.47" in caplog.text and "resolves" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=components.log.name):
        components._log_rescale_unit(task(22.77, 14.30), auto)
    assert "difference of 8.47" in caplog.text and "standard error" not in caplog.text
    caplog.clear()  # reward.rescale_min_se=0: the gap alone
    with caplog.at_level(logging.INFO, logger=components.log.name):
        components._log_rescale_unit(task(12271.7, 11652.0, 1200.0),
                                     RewardConfig(normalisation="auto", rescale_min_se=0.0))
    assert "difference of 619.7" in caplog.text and "standard error" not in caplog.text
