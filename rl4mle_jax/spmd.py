"""The training loop on several JAX processes: process 0 leads, the others mirror its steps.

Every jitted step over the learner's mesh (which spans every process's devices) must be called
by every process, in the same order, with the same global inputs. The loop itself (episodes,
sandboxes, grading, the samplers, checkpoints' metadata, logs, evaluations) runs on process 0
only, so process 0 sends each of its learner-mesh operations, with the host arrays it built, as
a command through `distributed.Channel`; every other process runs `follow`, which performs the
same operation on the same arrays, in the same order:

    init     load the initial policy (the path process 0 built or was given), make the learner,
             initialise or restore the state (the checkpoint directory must be shared storage)
    compile  compile the train step for a batch shape (process 0's warm-up and compile-ahead)
    train    the device passes the step needs, the train step, and the new policy's copy for
             process 0's sampler (communication only where no process holds a whole replica)
    save     write the checkpoint (orbax: each process its own shards, process 0 the metadata)
    stop     close the checkpoints and return

Why the rollout pool lives on process 0 rather than one per host: the reward, the admission
bound, the duration weights' arrival model, the improve prompts' buffer and the logs are one
run's state, so one process owns them; programs run in sandboxes that can live anywhere
(`env.backend="ray"` spreads them over a cluster's CPUs), and the samplers are process 0's own
(its first local device, tensor-parallel sampling across hosts is not built). Process 0's
devices serve both its samplers and its share of the learner's mesh, taking turns on one lane,
as in the one-process default. Not supported on several processes (refused at start): the
devices split by `mesh.sampler_devices`, and the SFT rescue.

`device_inputs` is the device half of a train step's batch, shared by the leader and the
followers so that both issue the same operations.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax import checkpoint as ckpt_lib
from rl4mle_jax import distributed, models, sharding
from rl4mle_jax.rl.batch import old_values_in_step
from rl4mle_jax.rl.learner import make_learner

log = logging.getLogger("rl4mle_jax.spmd")
INIT_BARRIER = "rl4mle/init"


def multiprocess() -> bool:
    return jax.process_count() > 1


def check_config(config: Any) -> None:
    """What the loop cannot do on several processes, named before any work."""
    if not multiprocess():
        return
    if config.mesh.sampler_devices:
        raise ValueError("config.mesh.sampler_devices: with several JAX processes the samplers "
                         "run on process 0's first local device and its devices also learn; "
                         "set it to 0")
    if config.rescue.enabled:
        raise ValueError("config.rescue.enabled: the SFT rescue is not built for several JAX "
                         "processes; set it to False")


def sampler_mesh() -> jax.sharding.Mesh:
    """Process 0's samplers: a one-device mesh on its first local device."""
    return sharding.make_mesh(1, 1, 1, jax.local_devices()[:1])


def device_inputs(learner: Any, state: Any, reference: Any, arrays: dict[str, Any],
                  forward: bool = True) -> tuple[dict[str, Any], Any]:
    """The batch's device-computed keys: old values and proximal log-probs (several updates per
    batch), reference log-probs (a KL reference); `forward=False`: zeros placed as those passes
    place them (for compiling the step ahead). Returns (arrays, the learner's log-probs of the
    old-values pass or None)."""
    arrays = dict(arrays)
    tokens, mask = arrays["tokens"], arrays["attention_mask"]

    def zeros() -> jax.Array:
        return jax.device_put(np.zeros(tokens.shape, np.float32), learner.batch_sharding)

    logprobs = None
    if learner.config.uses_critic and not old_values_in_step(learner.config):
        # Several updates per batch: the advantages need values fixed before the first.
        if forward:
            out = learner.compute_logprobs_and_values(state.policy_params, state.critic_params,
                                                      tokens, mask)
            arrays["values_old"], logprobs = out["values"], out["logprobs"]
        else:
            arrays["values_old"] = logprobs = zeros()
        arrays["prox_logprobs"] = logprobs  # the proximal policy (learner.off_policy)
    if learner.config.uses_ref:
        arrays["ref_logprobs"] = (learner.compute_logprobs(reference, tokens, mask) if forward
                                  else zeros())
    return arrays, logprobs


class Leader:
    """Process 0's side: sends its learner-mesh operations (no-ops with one process)."""

    def __init__(self) -> None:
        self.channel = distributed.Channel() if multiprocess() else None
        self.stopped = False

    def init(self, source: dict[str, Any], dtype: str) -> None:
        """The others load the initial policy (`Components.source`: its Hugging Face directory
        or warm-start cache entry, which they must see at the same path) and build the learner;
        returns once they have loaded it (the first step over every process's devices is
        next)."""
        if self.channel is not None:
            self.send("init", hf_dir=source.get("hf_dir") or source["warmstart"], dtype=dtype)
            distributed.barrier(INIT_BARRIER)

    def send(self, kind: str, arrays: dict[str, Any] | None = None, **info: Any) -> int:
        """Sends a command; its number (-1 with one process)."""
        if self.channel is None or self.stopped:
            return -1
        return self.channel.send(kind, arrays, **info)

    def forget(self, upto: int) -> None:
        """Every process has read commands up to `upto` (call after an operation they all took
        part in): their keys are deleted from the coordination service."""
        if self.channel is not None and upto >= 0:
            self.channel.forget(upto + 1)

    def stop(self, why: str) -> None:
        """The others return from `follow` (once; later calls do nothing)."""
        if not self.stopped:
            self.send("stop", why=why)
            self.stopped = True


def _mirror_publish(params: Any) -> None:
    """Process 0's WeightPublisher.place brings the new policy to its sampler: the gather it
    makes when no process holds a whole replica needs every process (the values are dropped
    here); with replicas it communicates nothing and there is nothing to mirror. (With FSDP
    every process receives the whole policy each step: multihost_utils has no gather to one
    process.)"""
    if distributed.needs_gather(params):
        distributed.gather(params)


def follow(config: Any, workdir: str | Path) -> dict[str, Any]:
    """The loop on a process other than 0: mirrors process 0's learner operations until it
    stops; returns counts of what was done."""
    check_config(config)
    channel = distributed.Channel()
    learner = state = reference = ckpt = None
    done = {"train": 0, "compile": 0, "save": 0}
    while True:
        kind, info, arrays = channel.receive()
        if kind == "init":
            model_config, params = models.load_hf_checkpoint(
                Path(info["hf_dir"]), dtype=jnp.dtype(info["dtype"]))
            distributed.barrier(INIT_BARRIER)  # process 0 waits for the load here
            meshes = sharding.make_meshes(**config.mesh)
            learner = make_learner(model_config, dict(config.learner), meshes.learner)
            ckpt = ckpt_lib.CheckpointManager(Path(workdir) / "checkpoints",
                                              max_to_keep=config.run.keep_checkpoints)
            initial = learner.shard_params(params)
            reference = initial if learner.config.uses_ref else None
            latest = ckpt.latest_step()
            if latest is None:
                state = learner.init_state(initial, jax.random.PRNGKey(config.seed))
            else:
                state, _ = ckpt.restore(learner.abstract_state(), latest)
            _mirror_publish(state.policy_params)
            log.info("process %d follows process 0 (%s)", jax.process_index(),
                     f"resumed at step {latest}" if latest is not None else "new run")
        elif kind == "compile":
            batch, _ = device_inputs(learner, state, reference, arrays, forward=False)
            learner.compile_train_step(batch)
            done["compile"] += 1
        elif kind == "train":
            batch, _ = device_inputs(learner, state, reference, arrays)
            state, _ = learner.train_step(state, batch)
            _mirror_publish(state.policy_params)
            done["train"] += 1
        elif kind == "save":
            ckpt.save(info["step"], state, {}, force=info["force"])
            done["save"] += 1
        elif kind == "stop":
            if ckpt is not None:
                ckpt.close()
            log.info("process %d: process 0 stopped (%s); %s", jax.process_index(),
                     info.get("why", "done"), done)
            return done
        else:
            raise ValueError(f"unknown command {kind!r} from process 0")
