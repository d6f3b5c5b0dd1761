"""Training rows gathered on device from conversation slots: the host plans which slot goes to
which row of which mini-batch (small integer arrays), one compiled gather builds the update's
`UpdateBatch` split over the mesh, and no token crosses the host.

A slot is one conversation of an agent call (a memory update or a final answer) as fixed-width
arrays (`agent.results.ConversationSlots`). The row layout is the one `rl.batching` builds on the
host: the prompt left-padded to P columns, then the response right-padded to N.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.agent.results import ConversationSlots
from memagent_jax.rl.batching import mini_batch_split
from memagent_jax.rl.update import UpdateBatch
from memagent_jax.runtime.parallel import BATCH_AXES


@dataclasses.dataclass(frozen=True, kw_only=True)
class MiniBatchPlan:
  """Host plan of one mini-batch: which slot fills each row (-1: an empty padding row)."""
  slot: np.ndarray  # [R] int32
  advantages: np.ndarray  # [R] float32
  question: np.ndarray  # [R] int32 (-1 for padding)


def plan_mini_batches(slot, question, advantages, *, questions_per_mini_batch: int, multiple: int,
                      num_questions: int) -> list[MiniBatchPlan]:
  """Kept rows (slot [K], question [K], advantage [K], in row order) -> mini-batches split as
  `batching.mini_batches` splits host rows, padding rows last."""
  slot, question = np.asarray(slot, np.int32), np.asarray(question, np.int32)
  advantages = np.asarray(advantages, np.float32)
  pad = lambda x, n, value: np.concatenate([x, np.full(n, value, x.dtype)])
  return [MiniBatchPlan(slot=pad(slot[idx], count - len(idx), -1), advantages=pad(advantages[idx], count - len(idx), 0),
                        question=pad(question[idx], count - len(idx), -1))
          for idx, count in mini_batch_split(question, num_questions=num_questions,
                                             questions_per_mini_batch=questions_per_mini_batch, multiple=multiple)]


@functools.partial(jax.jit, static_argnames=("micro_batches", "mask_truncated", "pad_id", "out_sharding"))
def _gather(slots: ConversationSlots, slot, advantages, *, micro_batches: int, mask_truncated: bool,
            pad_id: int, out_sharding):
  p, n = slots.prompt.shape[1], slots.response.shape[1]
  empty = slot < 0  # [R]
  take = lambda x: jnp.take(x, jnp.maximum(slot, 0), axis=0)
  prompt_len = jnp.where(empty, 0, take(slots.prompt_len))
  response_len = jnp.where(empty, 0, take(slots.response_len))
  prompt_valid = jnp.arange(p)[None, :] >= (p - prompt_len)[:, None]  # [R, P]
  prompt_valid = prompt_valid | (empty[:, None] & (jnp.arange(p) == p - 1)[None, :])  # one real token per row
  response_valid = jnp.arange(n)[None, :] < response_len[:, None]  # [R, N]
  loss_mask = response_valid & ~(mask_truncated & take(slots.truncated))[:, None]
  tokens = jnp.concatenate([take(slots.prompt), take(slots.response)], axis=1)  # [R, P + N]
  rows = dict(tokens=jnp.where(empty[:, None], pad_id, tokens),
              valid=jnp.concatenate([prompt_valid, response_valid], axis=1), loss_mask=loss_mask,
              old_logp=jnp.where(response_valid, take(slots.logprobs), 0.0),
              ref_logp=jnp.zeros(loss_mask.shape, jnp.float32), advantages=jnp.asarray(advantages, jnp.float32))
  split = lambda x: x.reshape((micro_batches, x.shape[0] // micro_batches) + x.shape[1:])
  batch = UpdateBatch(**{k: split(v) for k, v in rows.items()})
  if out_sharding is None:
    return batch
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, out_sharding(x.ndim)), batch)


def gather_update_batch(slots: ConversationSlots, plan: MiniBatchPlan, *, micro_batches: int,
                        mask_truncated: bool, pad_id: int, mesh=None) -> UpdateBatch:
  """One mini-batch's UpdateBatch [M, R / M, ...] gathered from the slots on device; with a mesh,
  rows are split over ("data", "fsdp") as `parallel.shard_micro_batches` splits them. A row's
  tokens and old log-probs are its slot's; padding rows hold one real token and no loss."""
  if len(plan.slot) % micro_batches:
    raise ValueError(f"{len(plan.slot)} rows do not split into {micro_batches} micro-batches")
  sharding = None if mesh is None else _RowSharding(mesh)
  return _gather(slots, jnp.asarray(plan.slot), jnp.asarray(plan.advantages), micro_batches=micro_batches,
                 mask_truncated=mask_truncated, pad_id=pad_id, out_sharding=sharding)


@dataclasses.dataclass(frozen=True)
class _RowSharding:
  """[M, r, ...] arrays with r over the batch axes (hashable: a static argument of the gather)."""
  mesh: object

  def __call__(self, ndim: int) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec(None, BATCH_AXES, *([None] * (ndim - 2))))
