"""One place each: the solve/improve prompts (env.prompts) and a score's sign (oriented_score).

The RL loop's episode, the best-of-N evaluation and the warm start render their prompts with
`env.prompts.solve_prompt` / `improve_prompt` (same text for the same inputs), and nothing in
the package decides a score's sign except `env.metrics.oriented_score`.
"""

import re
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest

from rl4mle_jax import best_of_n as best_of_n_lib
from rl4mle_jax.env import prompts
from rl4mle_jax.env.metrics import oriented_score
from rl4mle_jax.env.reward import RewardConfig, normalise_score
from rl4mle_jax.rollout.episode import EpisodeConfig, EpisodeRunner
from rl4mle_jax.warmstart.config import WarmStartConfig
from rl4mle_jax.warmstart.demo_runs import Demo
from rl4mle_jax.warmstart.pairs import plain_solve_prompt, training_pairs

PACKAGE = Path(__file__).resolve().parents[1] / "rl4mle_jax"
CFG = prompts.PromptConfig(max_prompt_tokens=4096, system_prompt=None)
CODE = "import pandas as pd\nprint(pd.read_csv('./input/train.csv').shape)\n"


def _record(score=0.8125, direction="higher"):
    return {"status": "valid", "score": score, "direction": direction, "failure_reason": None}


class _Tok:
    is_chat = False
    stop_token_ids, pad_id = (0,), 0

    def encode(self, text):
        return [ord(c) % 250 + 1 for c in text]


def _count(text):
    return len(_Tok().encode(text))


@pytest.fixture
def task(tmp_path):
    for split in ("reward", "test"):
        d = tmp_path / split
        d.mkdir()
        (d / "train.csv").write_text("id,x,y\n1,0.5,1\n2,0.25,0\n")
        (d / "test.csv").write_text("id,x\n3,0.75\n")
        (d / "sample_submission.csv").write_text("id,y\n3,0.5\n")
    return SimpleNamespace(id="t", description="Predict y from x.", timeout_s=60.0,
                           metric="auc", direction="higher",
                           input_dir=lambda split: tmp_path / split)


def _ctx(task, split="reward"):
    return prompts.task_context(task, ("numpy", "pandas"), split, CFG)


def test_episode_renders_the_shared_solve_and_improve_prompts(task):
    ctx = _ctx(task)
    runner = EpisodeRunner(task, _Tok(), None, None, None, None, ctx, EpisodeConfig(),
                           RewardConfig(), CFG)
    kw = dict(cfg=CFG, chat_template=None, count_tokens=_count)
    assert runner.render_prompt({"parent": None}) == prompts.solve_prompt(ctx, **kw).text
    parent = {"code": CODE, "record": _record()}
    got = runner.render_prompt({"parent": parent})
    assert got == prompts.improve_prompt(ctx, CODE, _record(), **kw).text
    assert runner.prompt_for({"parent": parent}).trimmed == \
        prompts.improve_prompt(ctx, CODE, _record(), **kw).trimmed
    assert got == prompts.build_prompt(ctx, earlier_code=CODE, cfg=CFG, count_tokens=_count,
                                       outcome=prompts.format_outcome(_record())).text


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_evaluation_improve_outcome_is_format_outcome_of_the_seed(direction):
    """The text best-of-N built by hand before equals format_outcome of the seed's record."""
    for score in (0.8125, 12345.678901, 1e-7, -3.0):
        by_hand = (f"No error detected, you achieved a score of {score:.6g} "
                   f"({direction} is better).")
        assert prompts.format_outcome(_record(score, direction)) == by_hand


def test_evaluation_samples_the_shared_prompts(task, monkeypatch):
    ctx = _ctx(task)
    seen = []

    def sample(comps, params, texts, rng, kind, temperature, max_new_tokens, truncation=None):
        seen.append((kind, texts))
        return [best_of_n_lib.Candidate(kind, CODE + f"# {kind} {i}\n", None)
                for i in range(len(texts))]

    async def run(cands, *args):
        for i, c in enumerate(cands):
            c.reward_split = _record(0.5 + 0.1 * i)
            c.test_split = _record(0.4)

    monkeypatch.setattr(best_of_n_lib, "_sample_codes", sample)
    monkeypatch.setattr(best_of_n_lib, "_run_candidates", run)
    comps = SimpleNamespace(task=task, tokenizer=_Tok(), context=ctx, prompt_cfg=CFG,
                            episode_cfg=EpisodeConfig(), sandbox=None)
    best_of_n_lib.best_of_n(comps, None, 4, rng=jax.random.PRNGKey(0))
    kw = dict(cfg=CFG, chat_template=None, count_tokens=_count)
    seed = CODE + "# solve 1\n"  # the better of the two solve candidates
    assert seen == [("solve", [prompts.solve_prompt(ctx, **kw).text] * 2),
                    ("improve", [prompts.improve_prompt(ctx, seed, _record(0.6), **kw).text] * 2)]


def test_warm_start_pairs_use_the_shared_prompts(task):
    demo = lambda code, valid, reward, outcome: Demo(  # noqa: E731
        "t", "Plan.", code, "logistic", {}, 1.0, "ok", reward if valid else None, valid,
        None, reward, [], outcome)
    demos = [demo(CODE, True, 0.7, prompts.format_outcome(_record(0.7))),
             demo(CODE + "x = 1\n", False, -10.0, "The script failed (runtime_error)."),
             demo(CODE + "y = 2\n", True, 0.9, prompts.format_outcome(_record(0.9)))]
    cfg = WarmStartConfig(improve_pairs_per_task=4, instrument_pairs_per_task=0)
    pairs = training_pairs(task, demos, ("numpy", "pandas"), CFG, _count, cfg)
    kw = dict(cfg=CFG, chat_template=None, count_tokens=_count)
    solve = {prompts.solve_prompt(_ctx(task, s), **kw).text for s in ("reward", "test")}
    assert {p for p, _, k in pairs if k == "solve"} == solve
    assert plain_solve_prompt(task, ("numpy", "pandas"), CFG, _count) == \
        prompts.solve_prompt(_ctx(task), **kw).text
    improve = {prompts.improve_prompt(_ctx(task), d.code, d.outcome, **kw).text for d in demos}
    got = [p for p, _, k in pairs if k == "improve"]
    assert len(got) == 4 and set(got) <= improve


def _package_lines():
    for path in sorted(PACKAGE.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            yield path.relative_to(PACKAGE).as_posix(), i, line


def test_only_env_prompts_builds_prompts():
    calls = [(p, i) for p, i, line in _package_lines()
             if re.search(r"\bbuild_prompt\(", line) and p != "env/prompts.py"]
    assert calls == []


def test_oriented_score_is_the_only_sign_decision():
    """No comparison of a direction with "higher"/"lower" outside oriented_score, except the
    outcome text's phrase ("(higher is better)"), which decides words, not a sign."""
    pattern = re.compile(r"""[!=]=\s*['"](higher|lower)['"]|['"](higher|lower)['"]\s*[!=]=""")
    hits = [(p, line.strip()) for p, _, line in _package_lines() if pattern.search(line)]
    assert hits == [
        ("env/metrics.py", 'return score if direction == "higher" else -score'),
        ("env/prompts.py", "hint = f\" ({'higher' if d == 'higher' else 'lower'} is better)\" "
                           "if d else \"\""),
    ]
    minmax = [(p, line.strip()) for p, _, line in _package_lines()
              if re.search(r"\bmin\(scores|else min\(", line)]
    assert minmax == []


def test_oriented_score_and_the_reward_sign_agree():
    assert oriented_score(0.25, "higher") == 0.25 and oriented_score(0.25, "lower") == -0.25
    assert oriented_score(None, "higher") == oriented_score(None, "lower") == float("-inf")
    cfg = RewardConfig(normalisation="flipped")
    for direction in ("higher", "lower"):
        assert normalise_score(0.25, direction, {}, cfg)[0] == oriented_score(0.25, direction)
    with pytest.raises(ValueError, match=r"direction must be one of \('higher', 'lower'\), "
                                         r"got 'up'"):
        oriented_score(1.0, "up")


def test_only_env_execute_runs_and_grades_a_program():
    """No second copy of run-and-grade: outside env/execute.py (and the sandbox package
    itself) nothing calls a sandbox's run/arun on a program or grades a run directory."""
    allowed = {"env/execute.py", "env/prompts.py"}  # prompts: the installed-library probe
    pattern = re.compile(r"\bsandbox\.a?run\(|\bgrade_run(_bytes)?\(|\bgrade_bytes\("
                         r"|\bread_run_submission\(")
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("env/sandbox/") or rel in allowed or rel in ("env/grading.py",
                                                                       "env/submission.py"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, offenders
