"""Joining the processes of a multi-host run: an explicit coordinator (config or JAX_* variables), or
the cluster that `jax.distributed.initialize()` detects itself (Slurm, a multi-host TPU VM, GKE).

No launcher of ours: the engine starts one process per host (per GPU under Slurm) and jax reads what
the engine sets (docs/pods.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings

import jax

_log = logging.getLogger(__name__)


CLUSTER_CHOICES = ("auto", "none")  # distributed.cluster: jax's own cluster detection on / off


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedSpec:
  """How this process joins the others; None fields come from JAX_NUM_PROCESSES,
  JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID (or, with cluster "auto", from the cluster jax detects)."""
  num_processes: int | None = None
  coordinator_address: str | None = None
  process_id: int | None = None
  cluster: str = "auto"  # CLUSTER_CHOICES

  def __post_init__(self):
    if self.cluster not in CLUSTER_CHOICES:
      raise ValueError(f"distributed.cluster={self.cluster!r}; choose one of {CLUSTER_CHOICES}")


def initialize_distributed(spec: DistributedSpec | None = None) -> bool:
  """Starts jax.distributed when more than one process is asked for; True if it runs.

  Takes `num_processes`, `coordinator_address`, `process_id` from `spec`, else from the env vars
  JAX_NUM_PROCESSES, JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID. When none of them gives the process
  count and `spec.cluster` is "auto" (the default), `jax.distributed.initialize()` is called with no
  arguments, so jax's own detection joins the cluster it finds (Slurm's SLURM_* variables, a TPU VM,
  GKE); where it finds none it raises before starting anything, and the process runs alone. Must run
  before any other JAX call; calling it again is a no-op.
  """
  if jax.distributed.is_initialized():
    return True
  spec = spec or DistributedSpec()
  either = lambda value, env: value if value is not None else os.environ.get(env)
  num = either(spec.num_processes, "JAX_NUM_PROCESSES")
  if num is None and spec.cluster == "auto":
    return _join_detected_cluster()
  num = int(1 if num is None else num)
  if num <= 1:
    return False
  address = either(spec.coordinator_address, "JAX_COORDINATOR_ADDRESS")
  pid = either(spec.process_id, "JAX_PROCESS_ID")
  if address is None or pid is None:
    raise ValueError(f"num_processes={num} needs coordinator_address (got {address!r}) and "
                     f"process_id (got {pid!r}), in the config or JAX_COORDINATOR_ADDRESS / "
                     "JAX_PROCESS_ID")
  pid = int(pid)
  if not 0 <= pid < num:
    raise ValueError(f"process_id={pid} must be in [0, num_processes={num})")
  return _start(f"coordinator {address}", dict(coordinator_address=str(address), num_processes=num,
                                               process_id=pid))


def _join_detected_cluster() -> bool:
  """`jax.distributed.initialize()` with jax's own cluster detection; False (one process, nothing started)
  where jax detects no cluster, which it reports by a ValueError naming the missing coordinator."""
  try:
    with warnings.catch_warnings():  # e.g. "Kubernetes detected but the kubernetes package is missing"
      warnings.simplefilter("ignore")
      jax.distributed.initialize()
  except ValueError as e:  # no cluster: jax could not fill the coordinator, the count or the id
    _log.info("no cluster detected by jax (%s): one process", e)
    return False
  except RuntimeError as e:
    if "must be called before" not in str(e):
      raise RuntimeError(f"jax.distributed.initialize (the cluster jax detected) failed ({e}); "
                         "distributed.cluster='none' runs one process without looking") from e
    # JAX already ran in this process (a notebook, a test), so no cluster can be joined any more
    _log.info("JAX started before the run looked for a cluster, so it runs as one process; a multi-host "
              "launch must build the run before any other JAX call (or set distributed.num_processes)")
    return False
  _log.info("joined the cluster jax detected")
  return True


def _start(where: str, kwargs: dict) -> bool:
  """jax.distributed.initialize(**kwargs) (no kwargs: jax detects the cluster), with an error naming `where`."""
  try:
    jax.distributed.initialize(**kwargs)
  except RuntimeError as e:
    raise RuntimeError(f"jax.distributed.initialize ({where}) failed ({e}); it must run before any "
                       "other JAX computation in the process") from e
  return True
