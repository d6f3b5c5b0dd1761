"""Where the recurrence's rows live: split over the mesh's ("data", "fsdp") axes and over
processes, so a pod generates each row once. Each process passes only its own rows and reads
back only its own rows; the compiled recurrence sees global arrays.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from memagent_jax.runtime.parallel import BATCH_AXES


class RowPlacement:
  """Host rows of this process [b, ...] <-> global device arrays [B, ...] (B = b x processes)
  with rows split over ("data", "fsdp"). Without a mesh: plain single-device arrays."""

  def __init__(self, mesh: Mesh | None, local_rows: int):
    self.mesh, self.local_rows = mesh, local_rows
    self.processes = jax.process_count() if mesh is not None else 1
    self.global_rows = local_rows * self.processes
    if mesh is None:
      return
    ways = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if self.global_rows % ways:
      raise ValueError(
          f"a batch of {self.global_rows} rows ({local_rows} per process x {self.processes} processes) "
          f"does not divide over the mesh's data x fsdp = {mesh.shape['data']} x {mesh.shape['fsdp']} "
          f"= {ways} row shards; use a multiple of {ways} rows")

  def _sharding(self, ndim: int, row_axis: int) -> NamedSharding:
    spec = [None] * ndim
    spec[row_axis] = BATCH_AXES
    return NamedSharding(self.mesh, PartitionSpec(*spec))

  def put(self, x, row_axis: int = 0) -> jax.Array:
    """This process's rows -> one global array, rows over ("data", "fsdp")."""
    x = np.asarray(x)
    if self.mesh is None:
      return jax.numpy.asarray(x)
    return jax.make_array_from_process_local_data(self._sharding(x.ndim, row_axis), x)

  def abstract(self, shape, dtype, row_axis: int = 0) -> jax.ShapeDtypeStruct:
    """What `put` makes of this process's rows of `shape` [b, ...], without data: the global array's
    shape, dtype and sharding (programs lowered for another topology, `memagent compile`)."""
    shape = tuple(shape[:row_axis]) + (shape[row_axis] * self.processes,) + tuple(shape[row_axis + 1:])
    sharding = None if self.mesh is None else self._sharding(len(shape), row_axis)
    return jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype), sharding=sharding)

  def local(self, tree, row_axis: int = 0):
    """Global arrays -> numpy arrays of this process's rows (every leaf, same row order as put)."""
    if self.mesh is None or self.processes == 1:
      return jax.device_get(tree)
    return jax.tree.map(lambda x: self._local_leaf(x, row_axis), tree)

  def _local_leaf(self, x: jax.Array, row_axis: int) -> np.ndarray:
    if x.ndim <= row_axis:  # a scalar such as a step count: replicated on every device
      return np.asarray(x.addressable_data(0))
    want = self._sharding(x.ndim, row_axis)
    if not x.sharding.is_equivalent_to(want, x.ndim):
      x = jax.device_put(x, want)
    blocks = {}
    for shard in x.addressable_shards:  # replicas of a row block appear once per device
      blocks.setdefault(shard.index[row_axis].start or 0, shard.data)
    return np.concatenate([np.asarray(blocks[k]) for k in sorted(blocks)], axis=row_axis)

  def agree_max(self, value: int) -> int:
    """The largest of every process's value (static widths must be equal everywhere)."""
    if self.processes == 1:
      return int(value)
    return int(np.max(multihost_utils.process_allgather(np.int32(value))))

  def any_process(self, flag: bool) -> bool:
    """True when any process has the flag (e.g. rows left to read): all run the same blocks."""
    return bool(self.agree_max(int(flag)))
