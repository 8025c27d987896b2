"""report.md: the learning section (curve, quarter and before/after checks, the pick against the
references) and a task without reference scores."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from rl4mle_jax.report import write_report


def _workdir(tmp_path, direction):
    wd = tmp_path / "run"
    wd.mkdir()
    rewards = [-10.0, -6.0, -2.0, 0.5, 0.6, 0.7, 0.8, 0.9]
    (wd / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "wall_s": 30.0 * (i + 1), "reward/mean": r,
                    "score/best": 0.5 + 0.01 * i}) + "\n" for i, r in enumerate(rewards)))
    ini = {"n": 32, "direction": direction, "valid_rate": 0.5, "pick": {"test_score": 0.40}}
    fin = {"n": 32, "direction": direction, "valid_rate": 0.875, "pick": {"test_score": 0.30}}
    for name, ev in (("eval_initial.json", ini), ("eval_final.json", fin)):
        (wd / name).write_text(json.dumps(ev))
    return wd, ini, fin


@pytest.mark.parametrize("refs", [{"reward": {"baseline": 0.45, "strong": 0.35},
                                   "test": {"baseline": 0.42, "strong": 0.25}}, {}])
def test_report_learning_section_and_references(tmp_path, refs):
    wd, ini, fin = _workdir(tmp_path, "lower")
    task = SimpleNamespace(id="t", metric="rmse", direction="lower", reference_scores=refs)
    comps = SimpleNamespace(task=task, source={"warmstart": "ws"})
    config = SimpleNamespace(run=SimpleNamespace(eval_samples=32, eval_pick="max"))
    summary = {"loop": {"step": 8, "episodes_trained": 64, "episodes_dropped": 0, "wall_s": 240}}
    text = write_report(wd, config, comps, ini, fin, summary, None).read_text()
    assert "## Best-of-N (N = 32; pick made on the reward split)" in text
    assert "reward split's maximum" not in text  # the pick is the maximum
    assert "![learning curve](plots/learning_curve.png)" in text
    assert (wd / "plots" / "learning_curve.png").stat().st_size > 0
    # quarters of 8 steps are 2 steps: mean(-10, -6) = -8 -> mean(0.8, 0.9) = 0.85
    se = np.sqrt((np.var([-10, -6], ddof=1) + np.var([0.8, 0.9], ddof=1)) / 2)
    assert ("| batch mean reward: first vs last quarter of 8 steps | -8.0000 | 0.8500 | "
            f"+8.850 ± {se:.3f} (batch noise) |") in text, text
    assert "| best-of-32 valid rate (same draws) | 0.5000 | 0.8750 | +0.375 |" in text
    assert "## Arrival bias" in text and "No episode finished." in text  # no experience log
    assert "left out lines of their parent" not in text  # no improve episode logged
    assert "| 0.4000 | 0.3000 | +0.1000 |" in text  # lower is better: the pick improved
    if refs:
        assert "+0.1200 over baseline (0.4200), -0.0500 over strong (0.2500)" in text
        assert "| test | 0.4200 | 0.2500 |" in text
    else:
        assert "no reference scores" in text and "| split |" not in text
        assert "0.3000 (no reference scores)" in text


def test_report_arrival_bias_table(tmp_path):
    """Started vs trained, their ratio and p̂ per Δt bucket (the replayed ArrivalModel), with the
    plot; Δt is the loop's (episode wall-clock here), not the sandbox's duration_s."""
    wd, ini, fin = _workdir(tmp_path, "lower")
    (wd / "config.json").write_text(json.dumps({"run": {"duration_source": "episode",
                                                        "duration_floor_s": 0.05}}))
    eps = [{"episode_id": i, "started_at": float(i), "finished_at": i + dt, "duration_s": 0.1,
            "selected": i % 4 != 0 or dt < 2}  # a quarter of the slow ones dropped
           for i, dt in enumerate([1.0] * 8 + [4.0] * 8)]
    eps.append({"episode_id": 16, "cancelled": True, "started_at": 20.0, "elapsed_s": 4.5,
                "selected": False})
    (wd / "experience.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    task = SimpleNamespace(id="t", metric="rmse", direction="lower", reference_scores={})
    comps = SimpleNamespace(task=task, source={"warmstart": "ws"})
    config = SimpleNamespace(run=SimpleNamespace(eval_samples=32, eval_pick="max"))
    text = write_report(wd, config, comps, ini, fin, {}, None).read_text()
    assert "![arrival bias](plots/arrival_bias.png)" in text
    assert "left out lines of their parent" not in text  # no improve episode
    assert (wd / "plots" / "arrival_bias.png").stat().st_size > 0
    assert ("17 episodes started: 14 trained, 2 dropped (stale or failed), 1 still running at "
            "the end") in text, text
    q_bar = 14 / 16  # p̂ = (trained_b + 2 q̄) / (finished_b + 2)
    assert (f"| 0.707-1.41 | 1 | 8 | 8 | 0 | 0 | 1.0000 | {(8 + 2 * q_bar) / 10:.4f} |"
            in text), text
    assert (f"| 2.83-5.66 | 4 | 8 | 6 | 2 | 1 | 0.7500 | {(6 + 2 * q_bar) / 10:.4f} |"
            in text), text
    assert "| 1.41-2.83 | — | 0 | 0 | 0 | 0 | — |" in text  # an empty bucket between them


def test_report_says_how_many_improve_prompts_cut_their_parent(tmp_path):
    wd, ini, fin = _workdir(tmp_path, "higher")
    eps = [{"episode_id": i, "kind": "improve", "selected": True, "started_at": float(i),
            "finished_at": i + 1.0, "duration_s": 0.5, "parent_lines_omitted": n,
            "record": {"status": "valid" if v else "failure"}}
           for i, (n, v) in enumerate([(10, False), (10, True), (0, True), (0, True)])]
    for e, parent, score in zip(eps, [None, 0, 1, 1], [None, 0.5, 0.75, 0.25]):
        e["parent_episode"] = parent
        if score is not None:
            e["record"]["normalised_score"] = score
    (wd / "experience.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    task = SimpleNamespace(id="t", metric="auc", direction="higher", reference_scores={})
    comps = SimpleNamespace(task=task, source={"warmstart": "ws"})
    config = SimpleNamespace(run=SimpleNamespace(eval_samples=32, eval_pick="max"))
    text = write_report(wd, config, comps, ini, fin, {}, None).read_text()
    assert ("Improve prompts that left out lines of their parent program to fit "
            "`prompt.max_prompt_tokens`: 2 of 4 trained improve episodes (valid rate 0.5000 "
            "with the parent cut, 1.0000 with it whole)") in text, text
    assert ("Trained improve episodes against their parent: 3 with the parent in this log, "
            "valid rate 1.0000; of the 2 where both are valid the child scored better in 50%, "
            "the same in 0% and worse in 50% (mean change +0.0000 in the reward's score scale, "
            "higher is better).") in text, text


def test_report_shows_the_reward_splits_maximum_beside_a_cv_pick(tmp_path):
    wd = tmp_path / "run"
    wd.mkdir()
    row = {"step": 1, "wall_s": 30.0, "reward/mean": 0.1}
    (wd / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    for name, cv, top in (("eval_initial.json", 0.40, 0.40), ("eval_final.json", 0.35, 0.45)):
        (wd / name).write_text(json.dumps({
            "n": 32, "direction": "lower", "valid_rate": 0.5,
            "pick": {"rule": "cv", "test_score": cv},
            "pick_max": {"rule": "max", "test_score": top}}))
    task = SimpleNamespace(id="t", metric="rmse", direction="lower", reference_scores={})
    comps = SimpleNamespace(task=task, source={"warmstart": "ws"})
    config = SimpleNamespace(run=SimpleNamespace(eval_samples=32, eval_pick="cv"))
    ini, fin = (json.loads((wd / n).read_text()) for n in ("eval_initial.json",
                                                             "eval_final.json"))
    text = write_report(wd, config, comps, ini, fin, {"loop": {}}, None).read_text()
    assert "## Best-of-N (N = 32; pick made on the reward and selection splits)" in text
    assert ("| test score of the pick (made on the reward and selection splits, "
            "`run.eval_pick=cv`) | 0.4000 | 0.3500 | +0.0500 | >= +0 |") in text, text
    assert ("| test score of the reward split's maximum (the \"max\" rule, for comparison) | "
            "0.4000 | 0.4500 | -0.0500 | — |") in text


def test_instrument_lines_count_answers_realigned_and_rejected_by_reason():
    from rl4mle_jax.report import instrument_lines

    assert instrument_lines({}) == []  # static mode: no LM answers
    inst = {"instrument/lm_accepted": 20.0, "instrument/lm_rejected": 63.0,
            "instrument/lm_rejected_ast_mismatch": 61.0,
            "instrument/lm_rejected_syntax_error": 2.0, "instrument/lm_accept_rate": 20 / 83}
    (line,) = [x for x in instrument_lines(inst) if x]
    assert line == ("LM instrumentation acceptance: 0.24 (20 of 83 answers; the other 63 ran "
                    "with the static instrumenter's markers: ast_mismatch 61, syntax_error 2).")
    inst = {"instrument/lm_accepted": 40.0, "instrument/lm_rejected": 0.0,
            "instrument/lm_realigned": 37.0, "instrument/lm_accept_rate": 1.0}
    assert instrument_lines(inst)[-1] == ("LM instrumentation acceptance: 1.00 (40 of 40 answers, "
                                          "37 of them realigned (`instrument.realign`)).")
