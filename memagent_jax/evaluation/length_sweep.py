"""Accuracy, time and peak memory of a reader as documents grow: the extrapolation curve.

Each length is evaluated on its own seeded samples (the same documents for every reader), after
one warm-up batch of the same shapes, so the time per document excludes compilation. Peak memory
is the process's resident set, sampled every 5 ms while that length runs. Given an output folder
and the reader's identity, each finished length is kept and a rerun resumes after it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading

from memagent_jax.data import tasks
from memagent_jax.evaluation.evaluate import METRICS, Sampling, run_eval
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSpec:
  """What a sweep reads (task, lengths, n documents each, their seed, their chunking) and how (batch,
  sampling, warm-up). warmup_each_length=False warms up once, on documents of warmup_length (default
  the shortest of `lengths`): for readers whose compiled shapes do not depend on the length (MemAgent),
  so no long document is read twice, also when a sweep is given only long lengths."""
  task: str
  lengths: tuple[int, ...]
  n: int  # documents per length
  seed: int  # length L reads documents of seed + L; answers sample with seed
  batch_size: int
  temperature: float
  top_p: float
  chunk_tokens: int  # the documents' layout (the same documents for every reader)
  warmup_each_length: bool = True
  warmup_length: int | None = None
  data_dir: str | None = None  # a corpus file or a built set (ruler_hotpotqa: lengths are its document counts)

  def key(self, reader_id: str | None, length: int) -> dict:
    """What a kept row must have been measured with to be reused."""
    key = {"reader": reader_id, "task": self.task, "length": length, "n": self.n, "seed": self.seed,
           "batch_size": self.batch_size, "temperature": self.temperature, "top_p": self.top_p,
           "chunk_tokens": self.chunk_tokens}
    return key if self.data_dir is None else {**key, "data_dir": os.path.abspath(self.data_dir)}

  def samples(self, length: int, n: int, tokenizer) -> list[dict]:
    """The documents of one length (seed + length: each length its own draw)."""
    return tasks.make_samples(self.task, length, n, self.seed + length, tokenizer, self.data_dir,
                              chunk_tokens=self.chunk_tokens)


READING_KEYS = ("decoded_tokens_per_doc", "chunks_per_doc", "keep_frac", "stop_frac", "invalid_frac")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepRow:
  """One reader at one length: accuracy with its 95% Wilson interval, time and peak memory."""
  method: str
  length: int  # document tokens (ruler_hotpotqa: documents)
  n: int
  accuracy: float  # in [0, 1]
  ci_low: float
  ci_high: float
  seconds_per_doc: float  # wall time of the batched evaluation / n (compilation excluded)
  peak_rss_mib: float
  doc_tokens: float  # mean tokens of the documents read
  concurrent_sweeps: int = 1  # sweeps that shared the machine while this row ran
  others: dict[str, float] = dataclasses.field(default_factory=dict)  # the task's other scores (QA: em, f1, verifier)
  # what reading cost per document (decoded_tokens_per_doc, chunks_per_doc) and a gated reader's turn
  # shares (keep_frac, stop_frac, invalid_frac), where the reader reports them
  reading: dict[str, float] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, row: dict) -> "SweepRow":
    return cls(**row)


def scorer_keys(task: str) -> list[str]:
  """The scores a row keeps beside its accuracy (the task's headline score)."""
  return [k for k in METRICS.get(task, {}) if k != "score"]


def _finished_row(path: str, key: dict) -> SweepRow | None:
  """The row a previous sweep wrote for the same reader and settings, else None."""
  try:
    with open(path) as f:
      kept = json.load(f)
    return SweepRow.from_json(kept["row"]) if kept.get("key") == key else None
  except (OSError, ValueError, KeyError, TypeError):  # unreadable, or written by another version
    return None


def sweep_lengths(reader, name: str, spec: SweepSpec, *, out_dir: str | None = None, reader_id: str | None = None,
                  progress: bool = True, on_row=None, concurrent_sweeps: int = 1) -> list[SweepRow]:
  """One row per length of spec.lengths, as reader `name`.

  reader_id (e.g. a digest of the weights) with out_dir: a length already swept with the same reader
  and settings is read back from <out_dir>/<name>_<length>.row.json instead of run again. on_row(row)
  is called as each length finishes (e.g. a log line where progress bars would mix); concurrent_sweeps
  is recorded in each row this call measures."""
  rows, warmed = [], False
  for length in spec.lengths:
    key = spec.key(reader_id, length)
    kept_path = os.path.join(out_dir, f"{name}_{length}.row.json") if out_dir and reader_id else None
    if kept_path and (row := _finished_row(kept_path, key)) is not None:
      rows.append(row)
      if on_row:
        on_row(row)
      continue
    samples = spec.samples(length, spec.n, reader.tokenizer)
    if not warmed or spec.warmup_each_length:
      # a reader whose shapes do not depend on the length warms up on the shortest documents: a resumed
      # sweep would otherwise read one batch of its first unfinished (longest so far) length twice
      warm_length = length if spec.warmup_each_length else (spec.warmup_length or min(spec.lengths))
      warm = samples[:spec.batch_size] if warm_length == length else spec.samples(
          warm_length, min(spec.n, spec.batch_size), reader.tokenizer)
      reader.answer_batch([s["question"] for s in warm], [s["context"] for s in warm],
                          temperature=spec.temperature, top_p=spec.top_p, seed=spec.seed)  # compile these shapes
      warmed = True
    out = os.path.join(out_dir, f"{name}_{length}.jsonl") if out_dir else None
    with PeakRSS() as mem:
      summary = run_eval(reader, spec.task, samples, out, batch_size=spec.batch_size,
                         sampling=Sampling(spec.temperature, spec.top_p, spec.seed), progress=progress)
    acc = summary["score"]
    lo, hi = wilson_interval(acc * spec.n, spec.n)
    rows.append(SweepRow(method=name, length=length, n=spec.n, accuracy=acc, ci_low=lo, ci_high=hi,
                         seconds_per_doc=summary["seconds"] / spec.n, peak_rss_mib=mem.peak / 2 ** 20,
                         doc_tokens=summary["mean_document_tokens"], concurrent_sweeps=concurrent_sweeps,
                         others={k: summary[k] for k in scorer_keys(spec.task) if k in summary},
                         reading={k: summary[k] for k in READING_KEYS if k in summary}))
    if kept_path:
      with atomic_write(kept_path) as f:
        json.dump({"key": key, "row": rows[-1].to_json()}, f)
    if on_row:
      on_row(rows[-1])
  return rows
