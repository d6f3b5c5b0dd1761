"""Metric sinks: TensorBoard event files (tensorboard's own writer, no TensorFlow) and a JSONL log.

Only process 0 writes; every scalar goes to both sinks so runs can be plotted or grepped.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time

import jax
from tensorboard.compat.proto import event_pb2, summary_pb2  # the event records alone (23 ms; the writer is lazy)


class MetricWriter:
  """`write(step, {name: number})` appends to `<dir>/metrics.jsonl` and TensorBoard events."""

  def __init__(self, log_dir: str, enabled: bool = True, tensorboard: bool = True):
    self.log_dir, self.enabled, self.tensorboard = log_dir, enabled, tensorboard
    self._tb = self._jsonl = None
    if enabled:
      self._open()

  def _open(self):
    """Opens both sinks for appending (again after close(): a Trainer's train() may run twice)."""
    os.makedirs(self.log_dir, exist_ok=True)
    self._jsonl = open(os.path.join(self.log_dir, "metrics.jsonl"), "a")

  def _event_writer(self):
    """The TensorBoard event file, opened at the first scalar (a run that never writes leaves no file).
    tensorboard's own writer, not tensorboardX: that one imports torch where it is installed (~2 s a process)."""
    if self._tb is None:
      from tensorboard.summary.writer.event_file_writer import EventFileWriter  # optional sink, only writing runs
      self._tb = EventFileWriter(os.path.join(self.log_dir, "tensorboard"), flush_secs=10)
    return self._tb

  def write(self, step: int, scalars: dict[str, float], prefix: str = ""):
    if not self.enabled:
      return
    if self._jsonl is None or self._jsonl.closed:
      self._open()
    clean = {prefix + k: float(v) for k, v in scalars.items() if v is not None}
    try:
      self._jsonl.write(json.dumps({"step": int(step), **{k: (v if math.isfinite(v) else str(v))
                                                           for k, v in clean.items()}}) + "\n")
      self._jsonl.flush()
    except OSError as e:  # a full disk: say which file, not only "[Errno 28]"
      raise OSError(e.errno, f"metrics of step {step} not written: {(e.strerror or str(e)).lower()} writing "
                             f"{self._jsonl.name}") from e
    if self.tensorboard and clean:
      values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in clean.items()]
      self._event_writer().add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                                     summary=summary_pb2.Summary(value=values)))

  def close(self):
    if self._jsonl:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
      self._tb = None  # a later write opens a new one


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def host_rss_bytes() -> int:
  """This process's resident host memory in bytes (Linux: current, from /proc; elsewhere: the peak)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def device_memory() -> tuple[int, int]:
  """(bytes, count) of the jax arrays alive in this process (all devices): flat over a run unless
  something keeps old arrays (a leak the allocator's own statistics would hide on the CPU)."""
  arrays = jax.live_arrays()
  return int(sum(a.nbytes for a in arrays)), len(arrays)
