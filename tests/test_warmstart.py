"""Warm start: SFT pieces against NumPy references, and a tiny end-to-end build with cache."""

import json
import shutil
import time

import jax
import numpy as np
import pytest

from rl4mle_jax import warmstart as ws
from rl4mle_jax.models import get_preset, init_params, load_hf_checkpoint, logits
from rl4mle_jax.models.tokenizer import load_tokenizer

TINY_MODEL = (("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 1),
              ("num_attention_heads", 2), ("num_key_value_heads", 1), ("head_dim", 16))


def _examples():
    return [ws.SFTExample((5, 6, 7), (8, 9, 1), "solve"), ws.SFTExample((5,), (4, 1), "improve")]


def test_make_batch_pads_prompt_left_and_response_right():
    b = ws.make_batch(_examples(), 4, 4, pad_id=0)
    np.testing.assert_array_equal(b["prompt"], [[0, 5, 6, 7], [0, 0, 0, 5]])
    np.testing.assert_array_equal(b["prompt_mask"], [[0, 1, 1, 1], [0, 0, 0, 1]])
    np.testing.assert_array_equal(b["response"], [[8, 9, 1, 0], [4, 1, 0, 0]])
    np.testing.assert_array_equal(b["response_mask"], [[1, 1, 1, 0], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match="example 0 has 3 prompt / 3 response tokens"):
        ws.make_batch(_examples(), 2, 4, pad_id=0)


def test_sft_loss_matches_numpy_reference_on_the_full_sequence():
    """The cached-prompt loss equals the plain next-token NLL of prompt+response."""
    config = get_preset("tiny", vocab_size=16, **dict(TINY_MODEL))
    params = init_params(config, jax.random.PRNGKey(0))
    batch = ws.make_batch(_examples(), 4, 4, pad_id=0)
    got = float(jax.jit(ws.sft_loss, static_argnums=0)(config, params, batch))
    tokens = np.concatenate([batch["prompt"], batch["response"]], 1)
    mask = np.concatenate([batch["prompt_mask"], batch["response_mask"]], 1).astype(np.int32)
    lg = np.asarray(logits(config, params, tokens, mask), np.float64)
    top = lg.max(-1, keepdims=True)
    logp = lg - top - np.log(np.exp(lg - top).sum(-1, keepdims=True))
    nll, n = 0.0, 0
    for i in range(2):
        for t in range(4, 8):  # response slots; token t is predicted at position t - 1
            if batch["response_mask"][i, t - 4]:
                nll -= logp[i, t - 1, tokens[i, t]]
                n += 1
    assert n == 5
    np.testing.assert_allclose(got, nll / n, rtol=1e-5)


def test_sft_gradient_flows_and_loss_drops():
    config = get_preset("tiny", vocab_size=16, **dict(TINY_MODEL))
    params = init_params(config, jax.random.PRNGKey(0))
    batch = ws.make_batch(_examples(), 4, 4, pad_id=0)
    grads = jax.grad(lambda p: ws.sft_loss(config, p, batch))(params)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert float(np.abs(grads["layers_0"]["mlp"]["up_proj"]["kernel"]).sum()) > 0
    cfg = ws.WarmStartConfig(steps=30, batch_size=2, learning_rate=1e-2, warmup_steps=2)
    _, stats = ws.train_sft(config, params, _examples(), 0, cfg)
    assert stats["loss_last10_mean"] < 0.5 * stats["loss_first10_mean"]
    assert stats["buckets"] == {"128+64": 2}


def test_shared_prompt_batch_gives_the_same_loss():
    config = get_preset("tiny", vocab_size=16, **dict(TINY_MODEL))
    params = init_params(config, jax.random.PRNGKey(1))
    exs = [ws.SFTExample((5, 6, 7), (8, 9, 1), "solve"), ws.SFTExample((5, 6, 7), (4, 1), "solve")]
    loss = jax.jit(ws.sft_loss, static_argnums=0)
    shared = ws.make_batch(exs, 4, 4, pad_id=0, shared_prompt=True)
    assert shared["prompt"].shape == (1, 4) and shared["response"].shape == (2, 4)
    np.testing.assert_allclose(float(loss(config, params, shared)),
                               float(loss(config, params, ws.make_batch(exs, 4, 4, pad_id=0))),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="different prompts"):
        ws.make_batch(_examples(), 4, 4, pad_id=0, shared_prompt=True)


def test_encode_pairs_drops_and_counts_overlong():
    tok = _FakeTok()
    pairs = [("a" * 3, "b" * 2, "solve"), ("a" * 9, "b", "solve"), ("a", "b" * 9, "improve"),
             ("a" * 5, "b" * 5, "instrument")]
    ex, dropped = ws.encode_pairs(tok, pairs, max_prompt=4, max_response=4, max_total=8)
    assert [(len(e.prompt_ids), len(e.response_ids), e.kind) for e in ex] == [(3, 3, "solve")]
    assert ex[0].response_ids[-1] == tok.eos_id
    assert dropped == {"prompt_too_long": 1, "response_too_long": 1, "total_too_long": 1}


class _FakeTok:
    eos_id = 1

    def encode(self, text):
        return [2] * len(text)


def test_config_from_mapping_names_unknown_keys():
    cfg = ws.WarmStartConfig.from_mapping({"steps": 3, "model_overrides": {"hidden_size": 64}})
    assert cfg.steps == 3 and cfg.model_overrides == (("hidden_size", 64),)
    with pytest.raises(ValueError, match=r"unknown warm-start config keys \['stepz'\]"):
        ws.WarmStartConfig.from_mapping({"stepz": 3})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("warm")
    data = tmp_path_factory.mktemp("data")
    cfg = ws.WarmStartConfig(
        model_overrides=TINY_MODEL, vocab_size=1024, code_corpus_bytes=100_000, demos_per_task=3,
        improve_pairs_per_task=2, instrument_pairs_per_task=1, max_prompt_tokens=512,
        steps=12, batch_size=2, learning_rate=1e-2, warmup_steps=2, eval_samples=2,
        eval_max_new_tokens=64, demo_timeout_s=120)
    sandbox = ws.make_sandbox(cfg)
    t0 = time.time()
    first = ws.build_warmstart(["food-reviews"], out, cfg, data_root=data, sandbox=sandbox,
                               log=lambda s: None)
    build_s = time.time() - t0
    t0 = time.time()
    second = ws.build_warmstart(["food-reviews"], out, cfg, data_root=data, sandbox=sandbox,
                                log=lambda s: None)
    yield first, second, time.time() - t0, build_s, cfg
    sandbox.close()
    shutil.rmtree(out, ignore_errors=True)


def test_build_writes_a_loadable_hf_directory(built):
    first, _, _, _, cfg = built
    assert not first.cached
    config, params = load_hf_checkpoint(first.hf_dir)
    assert config == first.model_config
    assert config.hidden_size == 32 and config.vocab_size % 128 == 0
    jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(first.params))
    tok = load_tokenizer(first.tokenizer_dir)
    assert not tok.is_chat and tok.vocab_size <= config.vocab_size
    prompts = json.loads((first.hf_dir.parent / "prompts.json").read_text())["food-reviews"]
    ids = tok.encode(prompts["reward"])
    assert len(ids) <= cfg.max_prompt_tokens and tok.decode(ids) == prompts["reward"]


def test_hf_directory_loads_in_transformers(built):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    first = built[0]
    model = transformers.Qwen2ForCausalLM.from_pretrained(first.hf_dir).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(first.hf_dir)
    text = "import pandas as pd\ntrain = pd.read_csv(\"./input/train.csv\")\n"
    ids = hf_tok(text)["input_ids"]
    assert ids == load_tokenizer(first.hf_dir).encode(text)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits.numpy()
    ours = np.asarray(logits(first.model_config, first.params, np.asarray([ids], np.int32)))
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=2e-4)


def test_stats_report_demos_loss_and_samples(built):
    first, _, _, _, cfg = built
    s = first.stats
    assert s["sft"]["loss_last10_mean"] < s["sft"]["loss_first10_mean"]
    assert len(s["sft"]["loss_curve"]) >= 2
    assert s["data"]["examples"]["solve"] >= 2 and s["data"]["examples"]["instrument"] == 1
    assert len(s["demos"]) == 3 and sum(d["valid"] for d in s["demos"]) >= 2
    ev = s["eval"]["food-reviews"]
    assert ev["n"] == cfg.eval_samples and 0.0 <= ev["valid_rate"] <= ev["parse_ok"] <= 1.0
    assert sum(ev["failures"].values()) + round(ev["valid_rate"] * ev["n"]) == ev["n"]
    assert set(s["timings"]) >= {"demos_s", "tokenizer_s", "sft_s", "eval_s", "total_s"}
    assert len(first.demos) == 3 and all(d.task_id == "food-reviews" for d in first.demos)


def test_second_call_is_a_cache_hit(built):
    first, second, second_s, build_s, _ = built
    assert second.cached and second.hf_dir == first.hf_dir
    assert second_s < min(15.0, build_s / 2)
    assert second.stats == json.loads(json.dumps(first.stats, default=str))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(second.params),
                 jax.device_get(first.params))


def test_cli_rejects_unknown_settings_before_any_work():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "build_warmstart.py"
    spec = importlib.util.spec_from_file_location("build_warmstart_cli", path)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli._parse_sets(["steps=3", "sandbox_backend=subprocess", "lr=1e-3"]) == {
        "steps": 3, "sandbox_backend": "subprocess", "lr": 1e-3}
    with pytest.raises(SystemExit, match="unknown warm-start config keys"):
        cli.main(["--task", "food-reviews", "--set", "stepz=3"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        cli.main(["--task", "food-reviews", "--set", "steps"])
