"""A whole MemAgent length sweep, timed as make reproduce's RL sweep runs it: 200 documents per length
from 1x to --max_multiple x the training length, one batch of 200, one warm-up on the shortest
length (`evaluation.length_sweep.sweep_lengths`), by the shipped toy base reader or `--source` (a trained
reader writes longer memories, so decodes more). Prints seconds per length and where the whole sweep's
wall time went (reading, making the documents, compiling).

  python -m experiments.benchmarks.bench_length_sweep --max_multiple=256

By default a CPU process splits into one JAX device per logical CPU it may use (`--cpu_devices`; the
rows of each batch split over a `data` mesh of them, each device sampling its own rows), as a single
sweep on a CPU host should; --cpu_devices=1 is one device, as before (an accelerator host sweeps on one
accelerator, as before). Besides jax it imports only `configs` and `memagent_jax` (APIs unchanged since
the speed issue began), so an older tree is timed by running this file from that tree's root:
  cd ../old && PYTHONPATH=. python ../main/experiments/benchmarks/bench_length_sweep.py
"""

from __future__ import annotations

import os
import time

from absl import app, flags

_START = time.perf_counter()

import jax  # noqa: E402

from configs import toy_memagent  # noqa: E402
from memagent_jax.data import tasks, toy  # noqa: E402
from memagent_jax.evaluation import length_sweep  # noqa: E402
from memagent_jax.experiment.assembly import load_reader  # noqa: E402
from memagent_jax.runtime import parallel  # noqa: E402

FLAGS = flags.FLAGS
EVAL_SEED = 1000  # make reproduce's --eval_seed: the documents of length L come from seed 1000 + L


def define_flags():
  """Defined when run as a script only (a test imports this module beside other scripts' flags)."""
  flags.DEFINE_integer("max_multiple", 256, "longest document / training length (a power of 2)")
  flags.DEFINE_integer("n", 200, "documents per length, read in one batch (make reproduce's)")
  flags.DEFINE_string("source", "experiments/data/toy_base_lookup", "the reader's weights")
  flags.DEFINE_integer("cpu_devices", 0, "JAX CPU devices the rows split over (0: the most logical CPUs this "
                       "process may use that divide --n; 1: one device)")


def usable_cores() -> int:
  """Logical CPUs this process may run on (its affinity where the OS tells it)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_devices(requested: int, rows: int, cores: int) -> int:
  """Devices for batches of `rows` rows: `requested`, or with 0 the most of `cores` that divide `rows`
  (a batch's rows split evenly over the devices)."""
  if requested < 0:
    raise ValueError(f"cpu_devices={requested} must be >= 0 (0: one per logical CPU)")
  devices = requested or max(d for d in range(1, max(1, cores) + 1) if rows % d == 0)
  if rows % devices:
    raise ValueError(f"cpu_devices={devices} does not divide the batch of {rows} documents (--n)")
  return devices


def split_cpu(devices: int):
  """JAX starts with `devices` CPU devices (before anything touches a backend); an accelerator host keeps
  its accelerators as the default devices."""
  jax.config.update("jax_num_cpu_devices", devices)
  if len(jax.devices("cpu")) != devices:
    raise RuntimeError(f"asked for {devices} CPU devices, JAX has {len(jax.devices('cpu'))} (XLA_FLAGS may fix "
                       "another count)")


def lengths_to(max_multiple: int) -> list[int]:
  """1x, 2x, 4x .. max_multiple x the training length, in tokens (toy_reproduction.eval_lengths, which
  cannot be imported beside these flags: its module defines --n and --max_multiple too; this one refuses
  a multiple the doubling would not reach)."""
  if max_multiple < 1 or max_multiple & (max_multiple - 1):
    raise ValueError(f"max_multiple={max_multiple} must be a power of 2 (the sweep doubles the length)")
  return [toy.TRAIN_TOKENS * 2 ** i for i in range(max_multiple.bit_length())]


def timed_sweep(source: str, lengths: list[int], n: int) -> tuple[list[dict], dict]:
  """(sweep rows, seconds by part) of one RL-style sweep of the reader at `source`; the rows split over a
  `data` mesh of every device when there are several."""
  cfg = toy_memagent.get_config("rl,full,lookup")
  mesh = parallel.make_mesh() if jax.default_backend() == "cpu" and jax.device_count() > 1 else None
  reader = load_reader(cfg, source, training=False, mesh=mesh)
  making = [0.0]
  make_samples = tasks.make_samples

  def timed_make_samples(*args, **kwargs):  # the documents, counted apart from the reading
    start = time.perf_counter()
    try:
      return make_samples(*args, **kwargs)
    finally:
      making[0] += time.perf_counter() - start

  tasks.make_samples = timed_make_samples
  try:
    start = time.perf_counter()
    spec = length_sweep.SweepSpec(task=cfg.data.task, lengths=tuple(lengths), n=n, seed=EVAL_SEED, batch_size=n,
                                  temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                                  chunk_tokens=cfg.agent.chunk_tokens, warmup_each_length=False)
    rows = length_sweep.sweep_lengths(reader, "rl", spec, progress=False)
    whole = time.perf_counter() - start
  finally:
    tasks.make_samples = make_samples
  reading = sum(r.seconds_per_doc * r.n for r in rows)
  return rows, dict(whole=whole, reading=reading, documents=making[0], other=whole - reading - making[0])


def table(rows: list[length_sweep.SweepRow], parts: dict, process: float) -> str:
  lines = ["| length | documents | reading, s | s / document | accuracy |", "|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r.length // toy.TRAIN_TOKENS}x ({r.length} tokens) | {r.n} | "
                 f"{r.seconds_per_doc * r.n:.2f} | {r.seconds_per_doc:.4f} | {100 * r.accuracy:.1f}% |")
  lines.append(f"\nwhole sweep {parts['whole']:.1f} s: reading {parts['reading']:.1f} s, making the documents "
               f"{parts['documents']:.1f} s, warm-up (compiling) and the rest {parts['other']:.1f} s; "
               f"the process {process:.1f} s from its first import")
  return "\n".join(lines)


def main(argv):
  del argv
  split_cpu(cpu_devices(FLAGS.cpu_devices, FLAGS.n, usable_cores()))
  print(f"{jax.device_count()} {jax.default_backend()} device(s)", flush=True)
  rows, parts = timed_sweep(FLAGS.source, lengths_to(FLAGS.max_multiple), FLAGS.n)
  print(table(rows, parts, time.perf_counter() - _START))


if __name__ == "__main__":
  define_flags()
  app.run(main)
