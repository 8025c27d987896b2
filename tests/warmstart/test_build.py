"""Warm start: a tiny end-to-end build with cache, its HF directory, and the CLI."""

import json
import shutil
import time

import jax
import numpy as np
import pytest

from rl4mle_jax import warmstart as ws
from rl4mle_jax.models import load_hf_checkpoint, logits
from rl4mle_jax.models.tokenizer import load_tokenizer

TINY_MODEL = (("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 1),
              ("num_attention_heads", 2), ("num_key_value_heads", 1), ("head_dim", 16))


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


def test_steps_are_per_task(built, tmp_path):
    """Two tasks train twice the steps of one (each task as often as in its own warm start)."""
    import dataclasses

    cfg = dataclasses.replace(built[4], steps=3, demos_per_task=2, improve_pairs_per_task=1,
                              eval_samples=1, eval_instrument=0)
    two = ws.build_warmstart(["food-reviews", "digits"], tmp_path / "out", cfg,
                             data_root=tmp_path / "data", log=lambda s: None)
    assert two.stats["sft"]["steps"] == 6
    assert len(two.stats["sft"]["loss_curve"]) >= 2


def test_cli_rejects_unknown_settings_before_any_work():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "build_warmstart.py"
    spec = importlib.util.spec_from_file_location("build_warmstart_cli", path)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli._parse_sets(["steps=3", "sandbox_backend=subprocess", "lr=1e-3"]) == {
        "steps": 3, "sandbox_backend": "subprocess", "lr": 1e-3}
    with pytest.raises(SystemExit, match="unknown warm-start config keys"):
        cli.main(["--task", "food-reviews", "--set", "stepz=3"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        cli.main(["--task", "food-reviews", "--set", "steps"])
