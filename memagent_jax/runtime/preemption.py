"""Preemption: SIGTERM / SIGINT turned into a flag the training loop reads between steps.

Schedulers (TPU VM maintenance, GKE, Slurm) send SIGTERM and kill the job a grace period later;
Ctrl-C sends SIGINT. While a `StopSignals` is installed, either only records which signal came;
the loop finishes the step in flight, saves it and raises `Preempted`, which entry points turn
into exit code 128 + signal (143 for SIGTERM, 130 for SIGINT). On a multi-process run only some
processes may get the signal: `agreed()` shares the flag (a tiny all-gather), so every process
stops after the same step.
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """Training stopped on a signal after saving the step reached; resume by running it again."""

  def __init__(self, signum: int, step: int, directory: str):
    self.signum, self.step, self.directory = int(signum), int(step), str(directory)
    super().__init__(f"preempted at step {step}; checkpoint saved in {directory}; "
                     "run the same command to resume")

  @property
  def exit_code(self) -> int:
    """The shell's code for a process ended by the signal: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + self.signum


class StopSignals:
  """`install()` replaces the SIGTERM / SIGINT handlers by one that records the first signal;
  `restore()` puts the previous handlers back. Outside the main thread (where Python cannot set
  handlers) it installs nothing and never reports a signal of its own."""

  def __init__(self):
    self.signum = 0  # the first signal received, 0 if none
    self._previous: dict[int, object] = {}

  def _record(self, signum, frame):
    del frame
    self.signum = self.signum or signum

  def install(self) -> StopSignals:
    if threading.current_thread() is threading.main_thread():
      for sig in SIGNALS:
        self._previous[sig] = signal.signal(sig, self._record)
    return self

  def restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
    self._previous.clear()

  def agreed(self) -> int:
    """The signal any process got (the largest number if several), 0 if none. Every process must
    call it at the same point: with several processes it is a collective."""
    if jax.process_count() == 1:
      return self.signum
    return int(np.max(multihost_utils.process_allgather(np.int32(self.signum))))
