"""Host arrays of every process, concatenated in process order: how the rows, rewards and
counters that each process computed for its own trajectories come together. One process: a no-op."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def gather_rows(x) -> np.ndarray:
  """Every process's x [n_p, ...] (n_p may differ; other dims equal) -> [sum n_p, ...]."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x
  counts = np.asarray(multihost_utils.process_allgather(np.int32(x.shape[0])))  # [P]
  padded = np.zeros((int(counts.max()),) + x.shape[1:], x.dtype)
  padded[:x.shape[0]] = x
  every = np.asarray(multihost_utils.process_allgather(padded))  # [P, max n, ...]
  return np.concatenate([every[p, :counts[p]] for p in range(len(counts))])


def sum_over_processes(values: dict[str, float]) -> dict[str, float]:
  """{name: local sum} -> {name: sum over processes} (same keys on every process)."""
  if jax.process_count() == 1:
    return dict(values)
  names = sorted(values)
  totals = gather_rows(np.asarray([[values[k] for k in names]], np.float64)).sum(axis=0)
  return dict(zip(names, totals.tolist()))


def this_process_share(num_items: int, what: str) -> slice:
  """The contiguous block of num_items (e.g. a step's questions) this process generates."""
  procs, me = jax.process_count(), jax.process_index()
  if num_items % procs:
    raise ValueError(f"{what}: {num_items} do not split evenly over {procs} processes; use a multiple "
                     f"of {procs}")
  share = num_items // procs
  return slice(me * share, (me + 1) * share)
