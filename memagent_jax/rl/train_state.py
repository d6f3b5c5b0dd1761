"""What a training run carries from step to step, and its checkpoint round trip.

TrainState = params, optimizer state, reference params (only when KL is on), step, PRNG key;
the data position and the model's description travel beside it as JSON metadata.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax import checkpointing, parallel
from memagent_jax.models import loading


@dataclasses.dataclass
class TrainState:
  params: nnx.State  # float32 master weights, sharded over fsdp x tensor
  opt_state: object
  ref_params: nnx.State | None
  step: int
  rng: jax.Array  # raw uint32 key [2]


def _model_meta(trainer) -> dict:
  source = trainer.cfg.model.source
  return dict(model_config=dataclasses.asdict(trainer.policy.config), model_source=source,
              tokenizer_source=loading.tokenizer_source(source))


def _tree(st: TrainState) -> dict:
  """The checkpointed pytree (the checkpointer stores nnx.State nodes as plain dicts)."""
  tree = {"params": st.params, "opt_state": st.opt_state, "step": jnp.asarray(st.step, jnp.int32),
          "rng": st.rng}
  if st.ref_params is not None:
    tree["ref_params"] = st.ref_params
  return tree


def restore_or_init(trainer):
  """Fresh state (params sharded by the mesh rules), or the latest complete checkpoint's."""
  cfg = trainer.cfg
  master = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), trainer.policy.state)  # fp32 master
  shardings = parallel.param_shardings(master, trainer.mesh, trainer.rules)
  params = parallel.shard_params(master, trainer.mesh, trainer.rules)
  opt_state = trainer.tx.init(params)
  opt_state = parallel.shard_opt_state(opt_state, params, shardings, trainer.mesh)
  ref_params = jax.tree_util.tree_map(jnp.copy, params) if cfg.rl.kl_coef else None
  rng = jax.random.PRNGKey(cfg.train.seed)
  ckpt = checkpointing.Checkpointer(os.path.join(trainer.workdir, "checkpoints"), keep=cfg.train.keep_checkpoints,
                                    async_save=cfg.train.async_checkpoint)
  state = TrainState(params, opt_state, ref_params, 0, rng)
  if ckpt.latest_step() is None:
    return state, ckpt
  live = _tree(state)
  restored, meta = ckpt.restore(target=live, expect_model_config=_model_meta(trainer)["model_config"])
  # the checkpoint holds plain dicts where the live tree has nnx.State nodes; the leaves come back
  # in the target's order (and shardings), so they refill the live structure exactly
  tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(live), jax.tree_util.tree_leaves(restored))
  state = TrainState(tree["params"], tree["opt_state"], tree.get("ref_params"), int(tree["step"]), tree["rng"])
  trainer.batches.set_state(meta["data_state"])
  _truncate_metrics(trainer, state.step)
  logging.info("resumed from step %d in %s", state.step, ckpt.directory)
  return state, ckpt


def save_state(trainer):
  """Asynchronous save of everything a bit-exact resume needs."""
  st = trainer.state
  meta = dict(_model_meta(trainer), data_state=trainer.batches.get_state(), step=st.step,
              config=trainer.cfg.to_json_best_effort())
  trainer.checkpointer.save(st.step, _tree(st), meta)


def _truncate_metrics(trainer, step: int):
  """Drops logged lines of steps after the checkpoint: they will be run again."""
  path = os.path.join(trainer.workdir, "logs", "metrics.jsonl")
  if not trainer.is_chief or not os.path.exists(path):
    return
  import json
  with open(path) as f:
    keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
  with open(path, "w") as f:
    f.writelines(keep)
