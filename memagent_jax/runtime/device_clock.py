"""Where a step's wall time goes: seconds dispatching compiled programs and transfers and waiting for
them, against everything else, the host's own work (`perf/host_s`). No section adds a wait of its own:
work still running when a section ends is counted where the host next waits for it."""

from __future__ import annotations

import contextlib
import time


class DeviceClock:
  """Accumulates the seconds spent in device sections; host seconds = wall seconds - these."""

  def __init__(self):
    self.seconds = 0.0

  @contextlib.contextmanager
  def section(self):
    """Times a block that dispatches device work or waits for it (a transfer to the host)."""
    start = time.perf_counter()
    try:
      yield
    finally:
      self.seconds += time.perf_counter() - start
