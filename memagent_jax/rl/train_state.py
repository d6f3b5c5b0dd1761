"""What a training run carries from step to step, and its checkpoint round trip.

TrainState = params, optimizer state, reference params (only when KL is on), step, PRNG key;
the data position and the model's description travel beside it as JSON metadata. Step and key
are saved as arrays replicated over the mesh (orbax refuses host-local arrays with several
processes); only finite states are saved, and a damaged newest step falls back to the previous.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.runtime import checkpointing
from memagent_jax.runtime import parallel
from memagent_jax.policy import loading


@dataclasses.dataclass
class TrainState:
  params: nnx.State  # float32 master weights, sharded over fsdp x tensor
  opt_state: object
  ref_params: nnx.State | None
  step: int
  rng: jax.Array  # raw uint32 key [2]


def model_meta(source: str, policy) -> dict:
  """The model's description a checkpoint carries: its config, source, and tokenizer source (export)."""
  return dict(model_config=dataclasses.asdict(policy.config), model_source=source,
              tokenizer_source=loading.tokenizer_source(source))


class NonFiniteStateError(FloatingPointError):
  """Params or optimizer state hold NaN/inf: the run stops and no checkpoint of it is written."""


def _replicated(x, mesh) -> jax.Array:
  """A host value (identical on every process) as a global array replicated over `mesh`."""
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, NamedSharding(mesh, PartitionSpec()), lambda i: host[i])


def _local(x) -> np.ndarray:
  """This process's copy of a replicated (possibly multi-process) array."""
  return np.asarray(x.addressable_data(0))


def _tree(st: TrainState, mesh) -> dict:
  """The checkpointed pytree (the checkpointer stores nnx.State nodes as plain dicts)."""
  tree = {"params": st.params, "opt_state": st.opt_state, "step": _replicated(np.int32(st.step), mesh),
          "rng": _replicated(st.rng, mesh)}
  if st.ref_params is not None:
    tree["ref_params"] = st.ref_params
  return tree


@functools.lru_cache(maxsize=8)
def _finite_flags(mesh):
  """Jitted tuple of arrays -> [n] bool (each leaf all finite), replicated so every process reads it."""
  return jax.jit(lambda xs: jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]),
                 out_shardings=NamedSharding(mesh, PartitionSpec()))


def nonfinite_leaves(tree, mesh) -> list[str]:
  """Names ('params/layers/0/attn/q') of the float leaves of `tree` holding a NaN or inf."""
  flat = [(checkpointing.leaf_name(path), x) for path, x in
          jax.tree_util.tree_flatten_with_path(checkpointing._to_pure(tree))[0]
          if jnp.issubdtype(getattr(x, "dtype", np.int32), jnp.inexact)]
  if not flat:
    return []
  flags = _local(_finite_flags(mesh)(tuple(x for _, x in flat)))
  return [name for (name, _), ok in zip(flat, flags) if not ok]


def check_finite(st: TrainState, mesh, step: int):
  """Raises NonFiniteStateError naming `step` and the first non-finite params / optimizer leaves."""
  bad = nonfinite_leaves({"params": st.params, "opt_state": st.opt_state}, mesh)
  bad.sort(key=lambda name: not name.startswith("params/"))  # params first: they are what broke
  if bad:
    names = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
    raise NonFiniteStateError(f"step {step}: {len(bad)} leaves of the params / optimizer state are not finite "
                              f"({names}); stopping without saving this step. A NaN/inf learning rate or "
                              "optimizer setting, or an overflowing update (lower optim.lr)?")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StateSpec:
  """How a run's state starts and is kept: a fresh run's seed, reference params (KL on), the
  checkpoints kept and how they are written, the model a resumed checkpoint must hold."""
  seed: int
  with_reference: bool  # keep frozen reference params (the KL term's)
  keep: int  # newest checkpoints kept
  async_save: bool
  model_source: str  # recorded in checkpoints; a resume checks it loads the same model


def restore_or_init(spec: StateSpec, *, workdir: str, policy, mesh, rules, tx, batches):
  """Fresh state (params sharded by the mesh rules, the PRNG key of spec.seed, reference params when
  spec.with_reference), or the latest complete checkpoint's (which also moves `batches` to its data
  position and, on process 0, drops later lines of metrics.jsonl). -> (TrainState, Checkpointer)."""
  master = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), policy.state)  # fp32 master
  shardings = parallel.param_shardings(master, mesh, rules)
  params = parallel.shard_params(master, mesh, rules)
  opt_state = tx.init(params)
  opt_state = parallel.shard_opt_state(opt_state, params, shardings, mesh)
  ref_params = jax.tree_util.tree_map(jnp.copy, params) if spec.with_reference else None
  rng = jax.random.PRNGKey(spec.seed)
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), keep=spec.keep, async_save=spec.async_save)
  state = TrainState(params, opt_state, ref_params, 0, rng)
  if ckpt.latest_step() is None:
    return state, ckpt
  live = _tree(state, mesh)
  expect = model_meta(spec.model_source, policy)["model_config"]
  _, restored, meta = ckpt.restore_newest_readable(target=live, expect_model_config=expect)
  # the checkpoint holds plain dicts where the live tree has nnx.State nodes; the leaves come back
  # in the target's order (and shardings), so they refill the live structure exactly
  tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(live), jax.tree_util.tree_leaves(restored))
  state = TrainState(tree["params"], tree["opt_state"], tree.get("ref_params"), int(_local(tree["step"])),
                     jnp.asarray(_local(tree["rng"])))  # the key goes back to a host-local array
  batches.set_state(meta["data_state"])
  if jax.process_index() == 0:
    _truncate_metrics(os.path.join(workdir, "logs", "metrics.jsonl"), state.step)
  logging.info("resumed from step %d in %s", state.step, ckpt.directory)
  return state, ckpt


def save_state(checkpointer, st: TrainState, *, mesh, meta: dict):
  """Asynchronous save of everything a bit-exact resume needs; never of a non-finite state."""
  check_finite(st, mesh, st.step)
  checkpointer.save(st.step, _tree(st, mesh), meta)


def _truncate_metrics(path: str, step: int):
  """Drops logged lines of steps after the checkpoint: they will be run again."""
  if not os.path.exists(path):
    return
  end = 0  # byte offset after the last line to keep (lines are in step order)
  with open(path, "rb") as f:
    for line in f:
      try:
        if line.strip() and json.loads(line)["step"] > step:
          break
      except json.JSONDecodeError:  # a line torn by a kill: dropped with what follows
        break
      end += len(line)
  os.truncate(path, end)  # in place: the metric writer holds this file open for appending
