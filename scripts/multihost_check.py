"""One learner over several JAX processes: two PPO steps, a checkpoint written and restored.

  # one process, 8 CPU devices (the reference)
  python scripts/multihost_check.py --num_processes 1 --devices 8 --out /tmp/one
  # the same on two processes of 4 CPU devices each (start both; localhost coordinator)
  python scripts/multihost_check.py --num_processes 2 --process_id 0 --devices 4 \
      --coordinator localhost:12421 --out /tmp/two &
  python scripts/multihost_check.py --num_processes 2 --process_id 1 --devices 4 \
      --coordinator localhost:12421 --out /tmp/two

On a real cluster give --coordinator HOST:PORT and --process_id (or RL4MLE_COORDINATOR /
RL4MLE_PROCESS_ID, or nothing on a TPU pod slice / under SLURM, where JAX finds them). The
mesh is data=2 × fsdp=2 × tensor=2 over all devices of all processes; every process builds the
same batch (seeded), the learner makes it global with each process supplying its own devices'
shards. Process 0 writes `<out>/result.npz` (the policy parameters after two steps, gathered)
and `<out>/result.json` (metrics, and whether the restored checkpoint equals the trained
state).
"""

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num_processes", type=int, default=1)
    ap.add_argument("--process_id", type=int, default=None,
                    help="default: from RL4MLE_PROCESS_ID or the cluster (TPU, SLURM)")
    ap.add_argument("--coordinator", default=None, help="HOST:PORT of process 0 (default: "
                    "RL4MLE_COORDINATOR or the cluster's own)")
    ap.add_argument("--devices", type=int, default=0, help="CPU devices of this process")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.devices:  # before JAX starts
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import jax
    import numpy as np

    from rl4mle_jax import checkpoint as ckpt_lib
    from rl4mle_jax import distributed, models, sharding
    from rl4mle_jax.rl.learner import make_learner
    from rl4mle_jax.rl.learner_config import LearnerConfig

    if args.num_processes > 1:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    config = models.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8)
    learner = make_learner(config, LearnerConfig(actor_lr=1e-3, critic_lr=2e-3, adam_eps=1e-6,
                                                 num_minibatches=2, kl_mode="loss", kl_coef=0.1,
                                                 entropy_coef=0.01),
                           sharding.make_mesh(data=2, fsdp=2, tensor=2))
    params = models.init_params(config, jax.random.PRNGKey(0))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    metrics = []
    for step in range(2):
        rng = np.random.default_rng(step)
        b, t = 8, 12
        response = np.zeros((b, t), np.int32)
        response[:, 6:] = 1
        batch = dict(tokens=rng.integers(0, config.vocab_size, (b, t)).astype(np.int32),
                     attention_mask=np.ones((b, t), np.int32), response_mask=response,
                     rewards=rng.normal(size=b).astype(np.float32),
                     dt_s=rng.uniform(0.5, 20.0, b).astype(np.float32),
                     old_logprobs=rng.normal(-4.2, 0.2, (b, t)).astype(np.float32),
                     ref_logprobs=rng.normal(-4.2, 0.2, (b, t)).astype(np.float32),
                     values_old=rng.normal(0.0, 0.3, (b, t)).astype(np.float32))
        state, m = learner.train_step(state, batch)
        metrics.append({k: float(v) for k, v in distributed.gather(m).items()})
    trained = distributed.gather(state)
    with ckpt_lib.CheckpointManager(args.out / "checkpoints") as mngr:
        mngr.save(2, state, {"note": "multihost check"}, force=True)
        mngr.wait_until_finished()
        restored, meta = mngr.restore(learner.abstract_state(), 2)
    again = distributed.gather(restored)
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
               zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(again)))
    if jax.process_index() == 0:
        leaves = jax.tree_util.tree_flatten_with_path(trained.policy_params)[0]
        np.savez(args.out / "result.npz",
                 **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves})
        (args.out / "result.json").write_text(json.dumps({
            "processes": jax.process_count(), "devices": len(jax.devices()),
            "local_devices": len(jax.local_devices()), "metrics": metrics,
            "restored_equals_trained": bool(same), "meta_step": meta["step"]}, indent=1))


if __name__ == "__main__":
    main()
