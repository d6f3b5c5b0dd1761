"""XLA:CPU's per-call buffers kept in the process instead of handed back to the kernel (and JAX's PRNG
hash unrolled on CPU: `runtime/cpu_threefry.py`).

Every call of a compiled CPU program allocates its temporaries (one block, often 50-600 MB for an
update) and frees them on return. glibc serves blocks above its mmap threshold (32 MB at most) by
mmap and unmaps them on free, so the next call faults every page in again and the kernel zeroes
it: on tiny-smollm2's update that was 550 MB and 0.27 s of system time per 0.65 s step
(docs/results/cpu_host.md). Two settings stop it:

  keep_freed_memory()     glibc's mmap and trim thresholds at 2 GB: big blocks come from the heap
                          and stay there, so freed temporaries are reused without faults;
  synchronous_dispatch()  the CPU client runs programs on the calling thread, whose allocations go
                          to glibc's main heap (other threads' heaps cap at 64 MB and mmap above it).

`tune_cpu_host` applies both once at import of memagent_jax, with `cpu_threefry.unroll_threefry_on_cpu`
(the same random numbers from fewer, fused kernels). MEMAGENT_JAX_CPU_HOST=0 in the
environment leaves the process as it was. The cost: memory the process freed stays resident (up
to its peak), and CPU programs no longer overlap the Python that dispatched them; accelerator
programs are not affected (the setting is the CPU client's only).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

import jax

from memagent_jax.runtime import cpu_threefry

ENV_VAR = "MEMAGENT_JAX_CPU_HOST"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_KEEP_BELOW = 2 ** 31 - 1  # bytes; mallopt takes an int: blocks up to 2 GB stay in the heap

_applied: dict[str, bool] = {}


def _glibc():
  """The C library when it is glibc (mallopt with these parameters is glibc's), else None."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  except OSError:
    return None
  if not hasattr(libc, "gnu_get_libc_version"):
    return None
  libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  return libc


def keep_freed_memory() -> bool:
  """Raises glibc's mmap and trim thresholds so freed blocks below 2 GB are reused, not unmapped.
  True when set (False off glibc, e.g. macOS, where nothing is changed)."""
  libc = _glibc()
  if libc is None:
    return False
  mmap_set = libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BELOW)
  trim_set = libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BELOW)
  return bool(mmap_set and trim_set)


def synchronous_dispatch() -> bool:
  """Makes the CPU client (when not yet created) run programs on the calling thread. True when set."""
  from jax._src import xla_bridge  # the one place that says whether the CPU client exists yet
  if xla_bridge.backends_are_initialized():
    if jax.config.values["jax_cpu_enable_async_dispatch"]:
      logging.getLogger(__name__).warning(
          "memagent_jax imported after JAX started: CPU programs keep asynchronous dispatch, and their "
          "temporaries are re-faulted on every call (import memagent_jax first, or set %s=0 to silence)", ENV_VAR)
    return not jax.config.values["jax_cpu_enable_async_dispatch"]
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  return True


def tune_cpu_host() -> dict[str, bool]:
  """The settings, once per process, unless MEMAGENT_JAX_CPU_HOST=0; returns what is in force."""
  if not _applied:
    if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
      _applied.update(keep_freed_memory=False, synchronous_dispatch=False, unrolled_threefry=False)
    else:
      _applied.update(keep_freed_memory=keep_freed_memory(), synchronous_dispatch=synchronous_dispatch(),
                      unrolled_threefry=cpu_threefry.unroll_threefry_on_cpu())
  return dict(_applied)
