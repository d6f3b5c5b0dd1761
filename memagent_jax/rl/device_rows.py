"""Training rows gathered on device from conversation slots: the host plans which slot goes to
which row of which mini-batch (small integer arrays), one compiled gather builds the update's
`UpdateBatch` split over the mesh, and no token crosses the host (`SlotRows`).

A slot is one conversation of an agent call (a memory update or a final answer) as fixed-width
arrays (`agent.results.ConversationSlots`). A row is the prompt left-padded to P columns, then the
response right-padded to N, so the response always starts at column P and one compiled update
serves every step. Rows are grouped into mini-batches by question and padded with empty rows to a
bucketed count (`bucket_rows`), so the row count takes only a few distinct values.

tests/reference_rows.py builds the same rows on the host: the plain reference this gather is tested against.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.agent.results import ConversationSlots
from memagent_jax.rl.update import UpdateBatch
from memagent_jax.runtime.parallel import BATCH_AXES


@dataclasses.dataclass(frozen=True, kw_only=True)
class MiniBatchPlan:
  """Host plan of one mini-batch: which slot fills each row (-1: an empty padding row)."""
  slot: np.ndarray  # [R] int32
  advantages: np.ndarray  # [R] float32
  question: np.ndarray  # [R] int32 (-1 for padding)
  real_tokens: int = 0  # real tokens of its rows (a padding row holds one), when the planner was told
  prompt_width: int | None = None  # prompt columns kept (the last ones of the slots'); None: all


def bucket_rows(rows: int, multiple: int) -> int:
  """Smallest `multiple * u` >= rows with u in 1, 2, 3, 4, 6, 8, 12, 16, ... (2^k or 1.5 * 2^k):
  two shapes per octave, so few compilations and at most 1/3 of the rows are padding."""
  if rows < 1:
    raise ValueError("no rows to bucket")
  units = -(-rows // multiple)
  power = 1 << (units - 1).bit_length()  # smallest 2^k >= units
  return multiple * (3 * power // 4 if power >= 4 and units <= 3 * power // 4 else power)


def mini_batch_split(question, *, num_questions: int, questions_per_mini_batch: int,
                     multiple: int) -> list[tuple[np.ndarray, int]]:
  """Rows by question [R] -> per mini-batch of `questions_per_mini_batch` questions (the last one
  smaller when dynamic sampling proceeded with fewer groups): (its row indices, its bucketed row
  count, divisible by `multiple`)."""
  out = []
  for start in range(0, num_questions, questions_per_mini_batch):
    idx = np.flatnonzero((question >= start) & (question < start + questions_per_mini_batch))
    out.append((idx, bucket_rows(len(idx), multiple)))
  return out


WIDTH_STEPS = 8  # a row group's prompt width is k/8 of the slots' (k = 1..8): few shapes, few compiles
MIN_SAVING = 0.15  # a mini-batch splits into two width groups when that drops this share of its slots


def group_width(longest: int, full: int) -> int:
  """The prompt width of rows whose longest prompt is `longest`: the smallest k/WIDTH_STEPS of the
  full width (a multiple of 8 columns) that holds it."""
  for k in range(1, WIDTH_STEPS + 1):
    w = min(full, -(-full * k // (WIDTH_STEPS * 8)) * 8)  # k/8 of full, rounded up to 8 columns
    if w >= longest:
      return w
  return full


def split_by_width(plan: MiniBatchPlan, prompt_len, *, full_width: int, response_width: int, multiple: int,
                   tokens=None, max_groups: int = 2) -> tuple[MiniBatchPlan, ...]:
  """A mini-batch's rows (padding dropped) in up to max_groups (1 or 2) groups of their own prompt
  width, each padded to a bucketed row count: short prompts (final answers) stop costing the long
  ones' columns. prompt_len [R] and tokens [R] are per row of `plan` (ignored for padding rows)."""
  used = np.flatnonzero(plan.slot >= 0)
  order = used[np.argsort(np.asarray(prompt_len)[used], kind="stable")]
  lengths = np.asarray(prompt_len)[order]
  tokens = np.zeros(len(plan.slot), np.int64) if tokens is None else np.asarray(tokens, np.int64)
  area = lambda n, longest: bucket_rows(n, multiple) * (group_width(longest, full_width) + response_width)
  best, split = area(len(order), lengths[-1]), None
  for s in range(1, len(order) if max_groups > 1 else 0):
    if lengths[s] != lengths[s - 1]:
      cost = area(s, lengths[s - 1]) + area(len(order) - s, lengths[-1])
      if cost <= (1 - MIN_SAVING) * best and (split is None or cost < split[1]):
        split = (s, cost)
  parts = [order] if split is None else [order[:split[0]], order[split[0]:]]
  out = []
  for idx in parts:
    count = bucket_rows(len(idx), multiple)
    pad = lambda x, value: np.concatenate([x[idx], np.full(count - len(idx), value, x.dtype)])
    out.append(MiniBatchPlan(slot=pad(plan.slot, -1), advantages=pad(plan.advantages, 0),
                             question=pad(plan.question, -1), real_tokens=int(tokens[idx].sum()) + count - len(idx),
                             prompt_width=group_width(int(np.asarray(prompt_len)[idx].max()), full_width)))
  return tuple(out)


def plan_mini_batches(slot, question, advantages, *, questions_per_mini_batch: int, multiple: int,
                      num_questions: int, tokens=None) -> list[MiniBatchPlan]:
  """Kept rows (slot [K], question [K], advantage [K], in row order; real tokens [K] optional) ->
  mini-batches split by `mini_batch_split` (multiple = micro-batches x batch shards), padding rows last."""
  slot, question = np.asarray(slot, np.int32), np.asarray(question, np.int32)
  advantages = np.asarray(advantages, np.float32)
  tokens = np.zeros(len(slot), np.int64) if tokens is None else np.asarray(tokens, np.int64)
  pad = lambda x, n, value: np.concatenate([x, np.full(n, value, x.dtype)])
  return [MiniBatchPlan(slot=pad(slot[idx], count - len(idx), -1), advantages=pad(advantages[idx], count - len(idx), 0),
                        question=pad(question[idx], count - len(idx), -1),
                        real_tokens=int(tokens[idx].sum()) + count - len(idx))
          for idx, count in mini_batch_split(question, num_questions=num_questions,
                                             questions_per_mini_batch=questions_per_mini_batch, multiple=multiple)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _GatherSpec:
  """Static settings of one mini-batch's gather (hashable: a jit static argument)."""
  micro_batches: int
  mask_truncated: bool  # no loss on conversations that hit their token cap
  loss_on_prompt: bool  # next-token loss on whole conversations (from column 1)
  pad_id: int
  prompt_width: int | None  # the group's prompt columns (None: the slots' full width)
  out_sharding: Any = None  # rows over ("data", "fsdp") (`_RowSharding`), or None


@functools.partial(jax.jit, static_argnames=("spec",))
def _gather(slots: ConversationSlots, slot, advantages, prefix=None, *, spec: _GatherSpec):
  p, n = spec.prompt_width or slots.prompt.shape[1], slots.response.shape[1]
  empty = slot < 0  # [R]
  take = lambda x: jnp.take(x, jnp.maximum(slot, 0), axis=0)
  prompt_len = jnp.where(empty, 0, take(slots.prompt_len))
  response_len = jnp.where(empty, 0, take(slots.response_len))
  prompt_valid = jnp.arange(p)[None, :] >= (p - prompt_len)[:, None]  # [R, P]
  prompt_valid = prompt_valid | (empty[:, None] & (jnp.arange(p) == p - 1)[None, :])  # one real token per row
  response_valid = jnp.arange(n)[None, :] < response_len[:, None]  # [R, N]
  loss_mask = response_valid & ~(spec.mask_truncated & take(slots.truncated))[:, None]
  prompt = take(slots.prompt)[:, slots.prompt.shape[1] - p:]  # [R, p]: left-padded, the last p columns hold it
  tokens = jnp.concatenate([prompt, take(slots.response)], axis=1)  # [R, p + N]
  rows = UpdateBatch(tokens=jnp.where(empty[:, None], spec.pad_id, tokens),
                     valid=jnp.concatenate([prompt_valid, response_valid], axis=1), loss_mask=loss_mask,
                     old_logp=jnp.where(response_valid, take(slots.logprobs), 0.0),
                     ref_logp=jnp.zeros(loss_mask.shape, jnp.float32),
                     advantages=jnp.asarray(advantages, jnp.float32))  # [R, ...] before the micro-batch split
  if spec.loss_on_prompt:  # every real token after the first is a target
    loss_mask = rows.valid[:, 1:] & rows.valid[:, :-1]  # [R, P + N - 1]
    zeros = jnp.zeros(loss_mask.shape, jnp.float32)
    rows = rows.replace(loss_mask=loss_mask, old_logp=zeros, ref_logp=zeros)
  fits = jnp.bool_(False) if prefix is None else _prefix_fits(rows.tokens, rows.valid, prefix,
                                                                1 if spec.loss_on_prompt else p)
  m = spec.micro_batches
  batch = jax.tree.map(lambda x: x.reshape((m, x.shape[0] // m) + x.shape[1:]), rows)  # [M, R / M, ...]
  if spec.out_sharding is not None:
    batch = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, spec.out_sharding(x.ndim)), batch)
  return batch, fits


def _prefix_fits(tokens, valid, prefix, prompt_width: int):
  """Whether a shared prefix [L] can stand in for the first L slots of every row [R, W]: every row
  starts with it from its first real slot, or has at least L slots of padding first; and the loss
  starts after the prefix."""
  l = prefix.shape[0]
  if prompt_width <= l:
    return jnp.bool_(False)
  first = jnp.argmax(valid, axis=1)[:, None]  # [R, 1]
  col = jnp.arange(l)[None, :]  # [1, L]
  want = jnp.take(prefix, jnp.clip(col - first, 0, l - 1))  # [R, L]: the prefix token column j should hold
  return jnp.all((col < first) | (tokens[:, :l] == want))


def gather_update_batch(slots: ConversationSlots, plan: MiniBatchPlan, *, micro_batches: int, mask_truncated: bool,
                        pad_id: int, mesh=None, prefix=None, loss_on_prompt: bool = False) -> tuple[UpdateBatch, jax.Array]:
  """One mini-batch's UpdateBatch [M, R / M, ...] gathered from the slots on device; with a mesh,
  rows are split over ("data", "fsdp") as `parallel.shard_micro_batches` splits them. A row's
  tokens and old log-probs are its slot's; padding rows hold one real token and no loss.
  Also returns whether the shared prefix [L] fits every row (`_prefix_fits`; False without one).
  loss_on_prompt: next-token loss on whole conversations (the loss starts at column 1)."""
  if len(plan.slot) % micro_batches:
    raise ValueError(f"{len(plan.slot)} rows do not split into {micro_batches} micro-batches")
  sharding = None if mesh is None else _RowSharding(mesh)
  # host numpy plans: replicated inputs on every process of a multi-host run
  spec = _GatherSpec(micro_batches=micro_batches, mask_truncated=mask_truncated, loss_on_prompt=loss_on_prompt,
                     pad_id=pad_id, prompt_width=plan.prompt_width, out_sharding=sharding)
  return _gather(slots, np.asarray(plan.slot, np.int32), np.asarray(plan.advantages, np.float32), prefix, spec=spec)


def abstract_update_batch(rows: "SlotRows", plan: MiniBatchPlan, *, micro_batches: int, mesh=None) -> UpdateBatch:
  """The UpdateBatch `rows.to_device(plan)` gathers, as abstract arrays (shapes, dtypes, shardings) traced
  through the same gather: what `memagent compile` lowers the log-prob pass and the update with."""
  spec = _GatherSpec(micro_batches=micro_batches, mask_truncated=rows.mask_truncated,
                     loss_on_prompt=rows.loss_on_prompt, pad_id=rows.pad_id, prompt_width=plan.prompt_width)
  batch, _ = jax.eval_shape(functools.partial(_gather, spec=spec), rows.slots, np.asarray(plan.slot, np.int32),
                            np.asarray(plan.advantages, np.float32))
  sharding = None if mesh is None else _RowSharding(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding and sharding(x.ndim)), batch)


@dataclasses.dataclass(kw_only=True)
class SlotRows:
  """A step's kept rows as indices into its conversation slots (on device), in row order: grouped
  by question, within a group as generated."""
  slots: ConversationSlots  # [S, ...] device arrays
  slot: np.ndarray  # [K] int32
  question: np.ndarray  # [K] int32 group index within the step
  advantages: np.ndarray  # [K] float32
  tokens: np.ndarray  # [K] int: real tokens of each row (prompt + response)
  prompt_len: np.ndarray  # [K] int: prompt tokens of each row
  pad_id: int
  mask_truncated: bool = False  # conversations that hit their cap take no loss
  loss_on_prompt: bool = False  # next-token loss on whole conversations (supervised warm starts)

  @property
  def prompt_width(self) -> int:
    """The first token column the loss reads."""
    return 1 if self.loss_on_prompt else self.slots.prompt.shape[1]

  def __len__(self) -> int:
    return len(self.slot)

  def mini_batches(self, *, num_questions: int, questions_per_mini_batch: int, multiple: int,
                   max_groups: int = 2) -> list[tuple[MiniBatchPlan, ...]]:
    """Each mini-batch as up to max_groups width groups (`split_by_width`; 0: one group of the slots'
    full width, rows in question order). Rows trained on whole conversations keep the full width: their
    loss covers the prompt, so every group must keep the same columns."""
    max_groups = 0 if self.loss_on_prompt else max_groups
    plans = plan_mini_batches(np.arange(len(self.slot)), self.question, self.advantages, num_questions=num_questions,
                              questions_per_mini_batch=questions_per_mini_batch, multiple=multiple, tokens=self.tokens)
    out = []
    for plan in plans:  # plan.slot indexes rows here; -1 pads
      rows = np.maximum(plan.slot, 0)
      if max_groups:
        groups = split_by_width(plan, self.prompt_len[rows], full_width=self.slots.prompt.shape[1],
                                response_width=self.slots.response.shape[1], multiple=multiple,
                                tokens=self.tokens[rows], max_groups=max_groups)
      else:
        groups = (plan,)
      out.append(tuple(dataclasses.replace(g, slot=np.where(g.slot >= 0, self.slot[np.maximum(g.slot, 0)], -1))
                       for g in groups))
    return out

  def to_device(self, plan: MiniBatchPlan, *, micro_batches: int, mesh=None, prefix=None) -> tuple[UpdateBatch, bool]:
    """(the mini-batch as an UpdateBatch on device, whether the shared prefix fits its rows)."""
    batch, fits = gather_update_batch(self.slots, plan, micro_batches=micro_batches, mask_truncated=self.mask_truncated,
                                      pad_id=self.pad_id, mesh=mesh, prefix=prefix, loss_on_prompt=self.loss_on_prompt)
    return batch, prefix is not None and bool(fits)


@dataclasses.dataclass(frozen=True)
class _RowSharding:
  """[M, r, ...] arrays with r over the batch axes (hashable: a static argument of the gather)."""
  mesh: object

  def __call__(self, ndim: int) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec(None, BATCH_AXES, *([None] * (ndim - 2))))
