"""HF <-> params conversion: config forms, sharded/bf16 checkpoints, errors, export, shardings,
orbax round trip through scripts/convert_hf_checkpoint.py."""

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rl4mle_jax.models import (
    CheckpointMismatchError,
    config_from_hf_dict,
    config_to_hf_dict,
    get_preset,
    load_hf_checkpoint,
    load_params_orbax,
    logits,
    param_logical_axes,
    param_shapes,
    save_hf_checkpoint,
    save_params_orbax,
)
from rl4mle_jax.models.convert import KEY_MAP, hf_to_ours_key, ours_to_hf_key

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.models import hf_utils  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
jit_logits = jax.jit(logits, static_argnums=0)
AUTO = jax.sharding.AxisType.Auto


def make_hf_model(path, **kw):
    """The shared random model, in this file's small shape."""
    return hf_utils.make_hf_model(path, **{"vocab": 80, "hidden": 32, "intermediate": 48,
                                           "theta": 5000.0, **kw})


hf_logits = hf_utils.hf_logits


TOKENS = np.array([[5, 17, 3, 60, 2, 9], [0, 0, 41, 8, 77, 1]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], np.int32)
REAL = MASK.astype(bool)


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_key_map_round_trips_every_param():
    for tied in (True, False):
        cfg = get_preset("tiny", num_hidden_layers=3, tie_word_embeddings=tied)
        paths = ["/".join(k.key for k in kp) for kp, _ in
                 jax.tree_util.tree_flatten_with_path(param_shapes(cfg))[0]]
        for path in paths:
            hf_key, _ = ours_to_hf_key(path)
            assert hf_to_ours_key(hf_key)[0] == path
    assert ours_to_hf_key("layers_11/self_attn/k_proj/bias")[0] == (
        "model.layers.11.self_attn.k_proj.bias")
    assert hf_to_ours_key("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert len(KEY_MAP) == 8


def test_config_v4_and_v5_forms():
    v5 = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 2048,
          "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
          "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
          "max_position_embeddings": 32768,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"} | {
        "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "rope_scaling": None}
    assert config_from_hf_dict(v5) == config_from_hf_dict(v4) == get_preset("qwen2.5-3b")
    assert config_from_hf_dict(v4, dtype=jnp.bfloat16).param_dtype == "bfloat16"
    with pytest.raises(ValueError, match="model_type='llama'"):
        config_from_hf_dict(v5 | {"model_type": "llama"})
    with pytest.raises(NotImplementedError, match="rope_type='yarn'"):
        config_from_hf_dict(v5 | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})


@pytest.mark.parametrize("form", ["v5", "v4"])
def test_load_checkpoint_config_forms_match_transformers(tmp_path, form):
    model = make_hf_model(tmp_path, tied=False)
    if form == "v4":  # rewrite config.json as transformers 4.x wrote it
        path = tmp_path / "config.json"
        d = json.loads(path.read_text())
        d["rope_theta"] = d.pop("rope_parameters")["rope_theta"]
        d["torch_dtype"] = d.pop("dtype", "float32")
        path.write_text(json.dumps(d))
    cfg, params = load_hf_checkpoint(tmp_path)
    assert cfg.rope_theta == 5000.0 and not cfg.tie_word_embeddings
    ours = np.asarray(jit_logits(cfg, params, TOKENS, MASK))
    assert np.abs(ours - hf_logits(model, TOKENS, MASK))[REAL].max() <= 1e-4


def test_sharded_checkpoint_loads_same_as_single(tmp_path):
    make_hf_model(tmp_path / "single")
    make_hf_model(tmp_path / "sharded", save_kw={"max_shard_size": "20KB"})
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert_trees_equal(load_hf_checkpoint(tmp_path / "single")[1],
                       load_hf_checkpoint(tmp_path / "sharded")[1])


def test_bfloat16_checkpoint(tmp_path):
    model = make_hf_model(tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    raw = load_file(str(tmp_path / "model.safetensors"))
    assert raw["model.norm.weight"].dtype == ml_dtypes.bfloat16
    cfg, params = load_hf_checkpoint(tmp_path)  # upcast to float32
    assert params["norm"]["scale"].dtype == jnp.float32
    np.testing.assert_array_equal(params["embed_tokens"]["embedding"],
                                  raw["model.embed_tokens.weight"].astype(np.float32))
    ours = np.asarray(jit_logits(cfg, params, TOKENS, MASK))
    # Same bf16-rounded weights in float32 (fresh load: `model.float()` would keep RoPE's
    # inv_freq buffer rounded to bf16).
    del model
    ref_model = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ref = hf_logits(ref_model.eval(), TOKENS, MASK)
    assert np.abs(ours - ref)[REAL].max() <= 1e-4
    _, params16 = load_hf_checkpoint(tmp_path, dtype=jnp.bfloat16)
    leaf = params16["layers_1"]["self_attn"]["q_proj"]["kernel"]
    assert leaf.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(leaf, np.float32),
                                  np.asarray(params["layers_1"]["self_attn"]["q_proj"]["kernel"]))


@pytest.mark.parametrize("tied,shard", [(True, None), (False, 30_000)])
def test_export_loads_in_transformers_with_same_logits(tmp_path, tied, shard):
    make_hf_model(tmp_path / "src", tied=tied)
    cfg, params = load_hf_checkpoint(tmp_path / "src")
    out = save_hf_checkpoint(cfg, params, tmp_path / "out", max_shard_bytes=shard)
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "qwen2" and written["architectures"] == ["Qwen2ForCausalLM"]
    if shard:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
        assert not (out / "model.safetensors").exists()
        assert "lm_head.weight" in index["weight_map"]
    else:
        assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
    reloaded = transformers.Qwen2ForCausalLM.from_pretrained(out).eval()
    assert reloaded.config.tie_word_embeddings == tied
    ours = np.asarray(jit_logits(cfg, params, TOKENS, MASK))
    assert np.abs(ours - hf_logits(reloaded, TOKENS, MASK))[REAL].max() <= 1e-4
    # And back through our loader, bit for bit.
    assert_trees_equal(load_hf_checkpoint(out)[1], params)


def test_export_bfloat16(tmp_path):
    make_hf_model(tmp_path / "src")
    cfg, params = load_hf_checkpoint(tmp_path / "src")
    out = save_hf_checkpoint(cfg, params, tmp_path / "out", dtype=jnp.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = transformers.Qwen2ForCausalLM.from_pretrained(out)
    assert reloaded.dtype == torch.bfloat16
    np.testing.assert_array_equal(
        reloaded.model.norm.weight.detach().float().numpy(),
        np.asarray(params["norm"]["scale"]).astype(ml_dtypes.bfloat16).astype(np.float32))


def _edit_checkpoint(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_wrong_shape_error_names_tensor_and_shapes(tmp_path):
    make_hf_model(tmp_path)
    key = "model.layers.1.self_attn.k_proj.weight"
    _edit_checkpoint(tmp_path, lambda t: t.update({key: np.zeros((24, 32), np.float32)}))
    with pytest.raises(CheckpointMismatchError) as err:
        load_hf_checkpoint(tmp_path)
    msg = str(err.value)
    assert "wrong shapes:" in msg and key in msg and "layers_1/self_attn/k_proj/kernel" in msg
    assert "expected shape (16, 32), found (24, 32)" in msg
    assert "missing" not in msg and "unexpected" not in msg


def test_missing_and_unexpected_tensors_are_listed(tmp_path):
    make_hf_model(tmp_path, tied=False)

    def edit(t):
        del t["model.layers.0.mlp.up_proj.weight"]
        del t["lm_head.weight"]
        t["model.layers.0.self_attn.q_norm.weight"] = np.ones(8, np.float32)
        t["model.layers.2.input_layernorm.weight"] = np.ones(32, np.float32)  # a third layer
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)  # ignored

    _edit_checkpoint(tmp_path, edit)
    with pytest.raises(CheckpointMismatchError) as err:
        load_hf_checkpoint(tmp_path)
    msg = str(err.value)
    missing = msg.split("missing tensors:")[1].split("unexpected tensors:")[0]
    unexpected = msg.split("unexpected tensors:")[1]
    assert "model.layers.0.mlp.up_proj.weight (-> layers_0/mlp/up_proj/kernel)" in missing
    assert "lm_head.weight (-> lm_head/kernel)" in missing
    assert "model.layers.0.self_attn.q_norm.weight" in unexpected
    assert "model.layers.2.input_layernorm.weight" in unexpected
    assert "inv_freq" not in msg


def test_tied_checkpoint_with_a_stored_lm_head_loads(tmp_path):
    """Some tied checkpoints store lm_head.weight anyway; it equals the embedding and is dropped."""
    make_hf_model(tmp_path, tied=True)
    _edit_checkpoint(tmp_path, lambda t: t.update(
        {"lm_head.weight": t["model.embed_tokens.weight"].copy()}))
    cfg, params = load_hf_checkpoint(tmp_path)
    assert cfg.tie_word_embeddings and "lm_head" not in params


def test_missing_files_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
         "num_hidden_layers": 1, "num_attention_heads": 2}))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_hf_checkpoint(tmp_path)


def test_save_rejects_params_that_do_not_fit_config(tmp_path):
    cfg = get_preset("tiny", vocab_size=32, num_hidden_layers=1)
    params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), param_shapes(cfg))
    params["norm"]["scale"] = np.zeros(7, np.float32)
    with pytest.raises(CheckpointMismatchError, match=r"norm/scale: expected shape \(128,\)"):
        save_hf_checkpoint(cfg, params, tmp_path)


def shardings_for(cfg, mesh):
    """A small logical->mesh rules table, as the learner's sharding module would have."""
    rules = {"vocab": "model", "mlp": "model", "heads": "model", "embed": "data"}
    axes = param_logical_axes(cfg)
    to_sharding = lambda names: jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(*(rules.get(n) for n in names)))
    return jax.tree.map(to_sharding, axes, is_leaf=lambda x: isinstance(x, tuple))


def test_load_onto_mesh_shardings(tmp_path):
    assert jax.device_count() == 8
    make_hf_model(tmp_path, tied=False)
    cfg0, ref = load_hf_checkpoint(tmp_path)
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AUTO, AUTO))
    shardings = shardings_for(cfg0, mesh)
    cfg, params = load_hf_checkpoint(tmp_path, shardings=shardings)
    jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(str(s)),
                 params, shardings)
    kernel = params["layers_0"]["mlp"]["gate_proj"]["kernel"]  # [32, 48] over (data, model)
    assert {tuple(s.data.shape) for s in kernel.addressable_shards} == {(16, 12)}
    assert_trees_equal(params, ref)
    out = jit_logits(cfg, params, TOKENS, MASK)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jit_logits(cfg0, ref, TOKENS, MASK)),
                               atol=1e-5)


def _script():
    spec = importlib.util.spec_from_file_location(
        "convert_hf_checkpoint", ROOT / "scripts" / "convert_hf_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_orbax_round_trip_through_script(tmp_path):
    model = make_hf_model(tmp_path / "hf", tied=False)
    (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")
    script = _script()
    script.main(["--hf_dir", str(tmp_path / "hf"), "--out", str(tmp_path / "orbax")])
    cfg, params = load_hf_checkpoint(tmp_path / "hf")
    cfg2, params2 = load_params_orbax(tmp_path / "orbax")
    assert cfg2 == cfg
    assert_trees_equal(params2, params)
    summary = script.main(["--to_hf", "--ckpt_dir", str(tmp_path / "orbax"), "--out",
                           str(tmp_path / "back"), "--tokenizer_dir", str(tmp_path / "hf")])
    assert set(summary["copied"]) == {"tokenizer_config.json", "generation_config.json"}
    reloaded = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "back").eval()
    np.testing.assert_array_equal(hf_logits(reloaded, TOKENS, MASK),
                                  hf_logits(model, TOKENS, MASK))
    # Restore onto a mesh and in bfloat16.
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AUTO, AUTO))
    shardings = shardings_for(cfg, mesh)
    cfg3, params3 = load_params_orbax(tmp_path / "orbax", dtype=jnp.bfloat16, shardings=shardings)
    emb = params3["embed_tokens"]["embedding"]
    assert cfg3.param_dtype == "bfloat16" and emb.dtype == jnp.bfloat16
    assert emb.sharding.is_equivalent_to(shardings["embed_tokens"]["embedding"], 2)


def test_orbax_reads_policy_out_of_a_train_state(tmp_path):
    """A learner-style checkpoint (items `state` + `meta`, optimizer moments and a critic trunk
    shaped like the params) exports the policy, not a look-alike."""
    import flax
    import optax
    import orbax.checkpoint as ocp

    @flax.struct.dataclass
    class State:
        step: jax.Array
        policy_params: dict
        critic_params: dict
        actor_opt_state: object

    cfg = get_preset("tiny", vocab_size=32, num_hidden_layers=1)
    params = jax.tree.map(lambda s: jnp.full(s.shape, 0.5, s.dtype), param_shapes(cfg))
    state = State(jnp.int32(7), params, {"trunk": jax.tree.map(lambda x: x * 2, params)},
                  optax.adam(1e-3).init(params))
    mngr = ocp.CheckpointManager(tmp_path.absolute(),
                                 options=ocp.CheckpointManagerOptions(create=True))
    mngr.save(3, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        meta=ocp.args.JsonSave({"run": "x", "model": {"config": cfg.__dict__}})))
    mngr.wait_until_finished()
    mngr.close()
    cfg2, params2 = load_params_orbax(tmp_path)
    assert cfg2 == cfg
    assert_trees_equal(params2, params)
    _, trunk = load_params_orbax(tmp_path, params_path="critic_params/trunk", config=cfg)
    assert float(trunk["norm"]["scale"][0]) == 1.0
    with pytest.raises(FileNotFoundError, match="no orbax checkpoint steps"):
        load_params_orbax(tmp_path / "nothing")
    # A checkpoint without a model config in its metadata needs config=.
    save_params_orbax(params, cfg, tmp_path / "p")
    assert load_params_orbax(tmp_path / "p")[0] == cfg
    mngr = ocp.CheckpointManager((tmp_path / "q").absolute(),
                                 options=ocp.CheckpointManagerOptions(create=True))
    mngr.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave({"policy": params}),
                                         meta=ocp.args.JsonSave({"run": "y"})))
    mngr.wait_until_finished()
    mngr.close()
    with pytest.raises(ValueError, match="holds no model config"):
        load_params_orbax(tmp_path / "q")
    assert_trees_equal(load_params_orbax(tmp_path / "q", config=cfg)[1], params)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(config_to_hf_dict(cfg)))
    _script().main(["--to_hf", "--ckpt_dir", str(tmp_path / "q"), "--out", str(tmp_path / "hf"),
                    "--hf_config", str(tmp_path / "cfg")])
    assert_trees_equal(load_hf_checkpoint(tmp_path / "hf")[1], params)


def test_script_command_line_usage_errors():
    """The script runs as a file from the checkout (imports resolve) and rejects bad flags."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_hf_checkpoint.py"),
                          "--to_hf", "--out", "x"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--to_hf needs --ckpt_dir" in run.stderr
