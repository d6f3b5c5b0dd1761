"""Where a step's wall time goes: seconds in compiled programs (dispatched, run, waited for, moved
to or from the device) against everything else, the host's own work (`perf/host_s`)."""

from __future__ import annotations

import contextlib
import time



class DeviceClock:
  """Accumulates the seconds spent in device sections; host seconds = wall seconds - these."""

  def __init__(self):
    self.seconds = 0.0

  @contextlib.contextmanager
  def section(self):
    """Times a block that dispatches device work and waits for it (end it with a transfer or a
    `jax.block_until_ready`, or the wait is counted as host time)."""
    start = time.perf_counter()
    try:
      yield
    finally:
      self.seconds += time.perf_counter() - start
