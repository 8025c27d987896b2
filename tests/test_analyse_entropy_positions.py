"""scripts/analyse_entropy_positions.py: the distributions it reads are the learner's."""

import importlib.util
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from rl4mle_jax import models
from rl4mle_jax.models import qwen2
from rl4mle_jax.rl.learner import token_logprobs_and_entropy

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "analyse_entropy_positions.py"
_SPEC = importlib.util.spec_from_file_location("analyse_entropy_positions", _PATH)
script = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(script)

CONFIG = models.Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8)


@pytest.mark.parametrize("trunc", [{"top_k": 0, "top_p": 1.0, "min_p": 0.0},
                                   {"top_k": 0, "top_p": 1.0, "min_p": 0.9}])
def test_response_positions_match_the_learner(trunc):
    params = models.init_params(CONFIG, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    seqs = [(rng.integers(1, 48, n).tolist(), p) for n, p in ((20, 7), (33, 12))]
    got = script.distributions(CONFIG, 0, params, seqs, 0.7, trunc, batch=2)
    for (ids, p), (rows, held) in zip(seqs, got):
        assert rows.shape == (len(ids) - p, 48) and held.shape == (len(ids) - p,)
        tokens = np.asarray(ids)[None]
        logits = qwen2.logits(CONFIG, params, tokens) / 0.7
        lp, ent = token_logprobs_and_entropy(logits, tokens, 0, **trunc)
        np.testing.assert_allclose(held, np.asarray(lp)[0, p:], atol=2e-5)
        np.testing.assert_allclose(script.entropy(rows), np.asarray(ent)[0, p:], atol=2e-5)
        if trunc["min_p"]:  # cut tokens are impossible, the held ones never
            assert np.isneginf(rows).any() and np.isfinite(held).all()


def test_split_against_hand_computed_numbers():
    sure = np.log([0.95, 0.05])  # top token 0.95: confident at gate 0.9
    unsure = np.log([0.5, 0.5])
    dists = [(np.stack([sure, unsure]), None), (np.stack([sure]), None)]
    confident = [np.array([True, False]), np.array([True])]
    h_sure = -(0.95 * math.log(0.95) + 0.05 * math.log(0.05))
    s = script.split(dists, confident)
    assert s["entropy_confident"] == pytest.approx(h_sure)
    assert s["entropy_uncertain"] == pytest.approx(math.log(2))
    assert s["tail_confident"] == pytest.approx(0.05)
    assert s["confident_share"] == pytest.approx(2 * h_sure / (2 * h_sure + math.log(2)))


def test_failure_starts_and_held_at_against_hand_computed_numbers():
    # program 0: its least likely held token is at position 1 (0.2), where the top token is
    # another one; program 1: at position 0 (0.6), and the held token is the top one there.
    d0 = np.log([[0.9, 0.1], [0.8, 0.2], [0.5, 0.5]])
    d1 = np.log([[0.4, 0.6], [0.99, 0.01]])
    dists = [(d0, np.log([0.9, 0.2, 0.5])), (d1, np.log([0.6, 0.99]))]
    starts = script.failure_starts(dists)
    assert [i for i, _ in starts] == [1, 0]
    assert [p for _, p in starts] == pytest.approx([0.2, 0.6])
    p, top = script.held_at(dists, [1, 0])
    np.testing.assert_allclose(p, [0.2, 0.6])
    assert top.tolist() == [False, True]


def test_improve_episodes_carry_their_parent_and_orphans_are_left_out(tmp_path):
    rows = [
        {"episode_id": 1, "kind": "solve", "code": "a = 1", "record": {"status": "valid"}},
        {"episode_id": 2, "kind": "improve", "parent_episode": 1, "code": "a = 2",
         "record": {"status": "failure"}},
        {"episode_id": 3, "kind": "improve", "parent_episode": 99, "code": "a = 3",
         "record": {"status": "valid"}},
        {"episode_id": 4, "kind": "improve", "parent_episode": 1, "code": None,
         "record": {"status": "failure"}},
    ]
    (tmp_path / "experience.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    solve = script._episodes([tmp_path], "solve")
    improve = script._episodes([tmp_path], "improve")
    assert [e["episode_id"] for e in solve] == [1] and "_parent" not in solve[0]
    assert [e["episode_id"] for e in improve] == [2]
    assert improve[0]["_parent"]["code"] == "a = 1"


class _CharTokenizer:
    """One token per character (ids are code points): `fork_sequences` checks the fork token
    is one token after the prefix, which a character tokenizer makes exact."""
    is_chat = False
    pad_id = 0

    def encode(self, text):
        return [ord(c) for c in text]


def test_fork_sequences_end_with_the_mistaken_token_after_the_prefix():
    from types import SimpleNamespace

    from rl4mle_jax.env import prompts as prompts_lib

    comps = SimpleNamespace(
        tokenizer=_CharTokenizer(),
        prompt_cfg=prompts_lib.PromptConfig(max_prompt_tokens=100_000),
        context=prompts_lib.TaskContext("Predict y.", "train.csv", ("numpy",), 60.0, "auc"))
    parent = {"code": "import numpy\n", "record": {"status": "valid", "score": 0.8}}
    broken = "m = f(g(x=1)\nprint(m)\n"
    failed = [{"plan": "p", "code": broken, "_parent": parent},
              {"plan": "q", "code": "m = f(g(x=1000), 3)\n", "_parent": parent},  # no fork
              {"plan": "r", "code": broken, "_parent": None}]
    seqs = script.fork_sequences(comps, failed, "f(g(x=1", ")")
    assert len(seqs) == 2
    for (ids, plen), e in zip(seqs, (failed[0], failed[2])):
        full = script._encode(comps, [e])[0]
        assert plen == full[1] and ids[:plen] == full[0][:plen]  # the episode's own prompt
        response = "".join(map(chr, ids[plen:]))
        assert response == f"{e['plan']}\n\n```python\nm = f(g(x=1)"
    assert seqs[0][0][:seqs[0][1]] != seqs[1][0][:seqs[1][1]]  # improve vs solve prompt
    with pytest.raises(SystemExit, match="not one token"):
        script.fork_sequences(comps, failed, "f(g(x=1", ")\n")


def test_fork_sequences_cut_at_the_occurrence_the_token_follows():
    """The prefix also in the plan and earlier in the code, there followed by other text: the
    sequence is cut where the code goes on with the mistaken token."""
    from types import SimpleNamespace

    from rl4mle_jax.env import prompts as prompts_lib

    comps = SimpleNamespace(
        tokenizer=_CharTokenizer(),
        prompt_cfg=prompts_lib.PromptConfig(max_prompt_tokens=100_000),
        context=prompts_lib.TaskContext("Predict y.", "train.csv", ("numpy",), 60.0, "auc"))
    code = "m = f(g(x=1000), 3)\nn = f(g(x=1)\n"
    (ids, plen), = script.fork_sequences(comps, [{"plan": "use f(g(x=1", "code": code}],
                                         "f(g(x=1", ")")
    assert "".join(map(chr, ids[plen:])) == (
        "use f(g(x=1\n\n```python\nm = f(g(x=1000), 3)\nn = f(g(x=1)")
