"""Accuracy, time and peak memory of a reader as documents grow: the extrapolation curve.

Each length is evaluated on its own seeded samples (the same documents for every reader), after
one warm-up batch of the same shapes, so the time per document excludes compilation. Peak memory
is the process's resident set, sampled every 5 ms while that length runs. Given an output folder
and the reader's identity, each finished length is kept and a rerun resumes after it.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time

from memagent_jax.data import tasks
from memagent_jax.evaluation.evaluate import run_eval
from memagent_jax.runtime.atomic_io import atomic_write


def _rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
  """Context manager: the peak resident memory of this process while the block runs."""

  def __init__(self, interval_s: float = 0.005):
    self.interval_s, self.peak = interval_s, 0
    self._stop = threading.Event()

  def _watch(self):
    while not self._stop.is_set():
      self.peak = max(self.peak, _rss_bytes())
      self._stop.wait(self.interval_s)

  def __enter__(self):
    self.peak = _rss_bytes()
    self._thread = threading.Thread(target=self._watch, daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, _rss_bytes())


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
  """95% Wilson score interval of a binomial proportion (sound at 0% and 100%)."""
  if n == 0:
    return 0.0, 1.0
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def _finished_row(path: str, key: dict) -> dict | None:
  """The row a previous sweep wrote for the same reader and settings, else None."""
  try:
    with open(path) as f:
      kept = json.load(f)
  except (OSError, ValueError):
    return None
  return kept["row"] if kept.get("key") == key else None


def sweep_lengths(reader, name: str, task: str, lengths: list[int], *, n: int, seed: int, batch_size: int,
                  temperature: float, top_p: float, chunk_tokens: int, out_dir: str | None = None,
                  warmup_each_length: bool = True, progress: bool = True, reader_id: str | None = None,
                  on_row=None, extra: dict | None = None, warmup_length: int | None = None) -> list[dict]:
  """One row per length: accuracy (+ Wilson 95% interval), seconds per document, peak RSS.

  warmup_each_length=False warms up once, on documents of the shortest length: for readers whose
  compiled shapes do not depend on the length (MemAgent), so no long document is read twice. reader_id (e.g. a
  digest of the weights) with out_dir: a length already swept with the same reader and settings
  is read back from <out_dir>/<name>_<length>.row.json instead of run again. on_row(row) is called as each
  length finishes (e.g. a log line where progress bars would mix); extra is merged into each row this call
  measures (not into rows read back), e.g. how many sweeps shared the machine. warmup_length: the length
  of that one warm-up (default the shortest of `lengths`), for a sweep given only long lengths."""
  rows, warmed = [], False
  for length in lengths:
    key = {"reader": reader_id, "task": task, "length": length, "n": n, "seed": seed, "batch_size": batch_size,
           "temperature": temperature, "top_p": top_p, "chunk_tokens": chunk_tokens}
    kept_path = os.path.join(out_dir, f"{name}_{length}.row.json") if out_dir and reader_id else None
    if kept_path and (row := _finished_row(kept_path, key)) is not None:
      rows.append(row)
      if on_row:
        on_row(row)
      continue
    samples = tasks.make_samples(task, length, n, seed + length, reader.tokenizer, chunk_tokens=chunk_tokens)
    if not warmed or warmup_each_length:
      # a reader whose shapes do not depend on the length warms up on the shortest documents: a resumed
      # sweep would otherwise read one batch of its first unfinished (longest so far) length twice
      warm_length = length if warmup_each_length else (warmup_length or min(lengths))
      warm = samples[:batch_size] if warm_length == length else tasks.make_samples(
          task, warm_length, min(n, batch_size), seed + warm_length, reader.tokenizer, chunk_tokens=chunk_tokens)
      reader.answer_batch([s["question"] for s in warm], [s["context"] for s in warm],
                          temperature=temperature, top_p=top_p, seed=seed)  # compile these shapes
      warmed = True
    out = os.path.join(out_dir, f"{name}_{length}.jsonl") if out_dir else None
    with PeakRSS() as mem:
      summary = run_eval(reader, task, samples, out, batch_size=batch_size, temperature=temperature,
                         top_p=top_p, seed=seed, progress=progress)
    acc = summary["score"]
    lo, hi = wilson_interval(acc * n, n)
    rows.append({"method": name, "length": length, "n": n, "accuracy": acc, "ci_low": lo, "ci_high": hi,
                 "seconds_per_doc": summary["seconds"] / n, "peak_rss_mib": mem.peak / 2 ** 20,
                 "doc_tokens": summary["mean_document_tokens"], **(extra or {})})
    if kept_path:
      with atomic_write(kept_path) as f:
        json.dump({"key": key, "row": rows[-1]}, f)
    if on_row:
      on_row(rows[-1])
  return rows
