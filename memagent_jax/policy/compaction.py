"""Row compaction: run a computation on the selected rows of a batch only, in a smaller batch.

A gated memory turn leaves many rows with nothing to decode (halted rows, ended documents, rows whose
reply was the one-token keep form). Instead of carrying them through every prefill and decode step,
the rows still working are gathered into the smallest of a few batch sizes fixed at compile time
(`bucket_sizes`), the computation runs there (one `lax.switch` branch per size), and its row outputs
are scattered back. On a mesh the batch's rows are split over ("data", "fsdp"); rows are gathered
within each device's contiguous group, so no row moves between devices and every device runs the
same bucket (the one that holds its busiest group).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from memagent_jax.models.attention import row_axes


class Compaction(NamedTuple):
  """A decode loop's second phase: after `after` new tokens the rows still decoding continue in the
  smallest of `buckets` batch sizes that holds them (no compaction with after 0 or one bucket)."""
  after: int
  buckets: int


def row_groups(rows: int) -> int:
  """The row shards of a [rows, ...] batch on the mesh in context (1 without one): the groups rows
  are compacted within."""
  axes = row_axes(rows)
  if axes is None:
    return 1
  mesh = jax.sharding.get_abstract_mesh()
  return math.prod(mesh.shape[a] for a in axes)


def bucket_sizes(group_rows: int, buckets: int) -> tuple[int, ...]:
  """`buckets` batch sizes per group, ascending, each half the next (rounded up), the largest the
  whole group: 8 rows, 3 buckets -> (2, 4, 8). Fewer when halving reaches 1."""
  if buckets < 1:
    raise ValueError(f"decode_buckets={buckets} must be >= 1 (1: no compaction)")
  sizes = [group_rows]
  while len(sizes) < buckets and sizes[-1] > 1:
    sizes.append(-(-sizes[-1] // 2))
  return tuple(sorted(set(sizes)))


def _per_group(fn, groups: int):
  """fn over one group's rows (every argument and output [b, ...] or [s, ...]), run on each device's own
  rows (shard_map over the mesh's row axes, the other axes left to XLA) when the rows are split: a
  gather across the whole batch would move rows between devices."""
  if groups == 1:
    return fn

  def run(*args):
    axes = row_axes(args[0].shape[0])
    spec = jax.sharding.PartitionSpec(axes)  # rows (the leading axis) split, the rest whole
    return jax.shard_map(fn, in_specs=(spec,) * len(args), out_specs=spec, axis_names=set(axes),
                         check_vma=False)(*args)
  return run


def run_compacted(fn: Callable, select, rows, fallback, *, buckets: int):
  """fn(rows') on the selected rows only, the rest taking `fallback`'s values.

  select [B] bool; rows: a pytree of [B, ...] arrays (fn's input); fallback: a pytree shaped like fn's
  output, [B, ...] leaves (a scalar leaf is taken from fn's output as it is). fn gets a bucket of S
  rows: the selected rows of each group first (in row order), then unselected rows as padding (fn
  must leave them idle: e.g. their `inactive` flag is part of `rows`). buckets: how many sizes (1:
  fn runs on every row, no gather)."""
  b_total = select.shape[0]
  groups = row_groups(b_total)
  group_rows = b_total // groups
  sizes = bucket_sizes(group_rows, buckets)
  if len(sizes) == 1:
    return fn(rows)
  need = jnp.max(jnp.sum(select.reshape(groups, group_rows), axis=1))  # the busiest group's selected rows
  row_leaves, row_tree = jax.tree.flatten(rows)
  shared = [x.ndim == 0 for x in row_leaves]  # scalars (a cache's cursor): every row's, not gathered

  def branch(size: int):
    def gather(sel, *leaves):  # one group: sel [b], leaves [b, ...] -> index [s], leaves [s, ...]
      index = jnp.argsort(~sel, stable=True)[:size]  # the selected rows first, in row order
      return (index, *[jnp.take(x, index, axis=0) for x in leaves])

    def scatter(sel, index, base, out):  # one group: base [b, ...], out [s, ...] -> [b, ...]
      picked = sel[index].reshape(size, *([1] * (out.ndim - 1)))
      return base.at[index].set(jnp.where(picked, out, base[index]))

    def run(operands):
      row_values, fallback = operands
      moved = [x for x, s in zip(row_values, shared) if not s]
      index, *taken = _per_group(gather, groups)(select, *moved)
      taken = iter(taken)
      out = fn(jax.tree.unflatten(row_tree, [x if s else next(taken) for x, s in zip(row_values, shared)]))
      put = _per_group(scatter, groups)
      return jax.tree.map(lambda base, o: o if o.ndim == 0 else put(select, index, base, o), fallback, out)

    return run

  choice = jnp.searchsorted(jnp.asarray(sizes), need)  # the smallest bucket that holds every group's rows
  return jax.lax.switch(jnp.minimum(choice, len(sizes) - 1), [branch(s) for s in sizes], (row_leaves, fallback))
