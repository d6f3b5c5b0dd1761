"""Does row compaction turn a gated memory's kept turns into wall time? One gated policy reads the same
documents with agent.decode_buckets = 1 (every row through every memory turn) and = 3 (the rows still
working, compacted; policy/compaction.py), side by side in one process: seconds per document (compilation
excluded by a warm-up read), decoded tokens, keep share, and whether the answers are the same.

  python -m experiments.benchmarks.bench_compaction --export=runs/toy_gated_demo/gated_seed0/rl/export

Writes docs/results/bench_compaction.{md,json} (--out).
"""

from __future__ import annotations

import json
import os
import platform
import time

from absl import app, flags, logging

from configs import toy_memagent
from experiments import toy_report
from memagent_jax.data import toy
from memagent_jax.evaluation.evaluate import Sampling, run_eval
from memagent_jax.experiment.assembly import build_reader, load_policy_of, sample_pool
from memagent_jax.runtime.atomic_io import atomic_write

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("export", "runs/toy_gated_demo/gated_seed0/rl/export", "an exported gated toy policy")
  flags.DEFINE_list("multiples", ["1", "4", "16", "64"], "document lengths, as multiples of the training length")
  flags.DEFINE_integer("n", 200, "documents per length (one batch)")
  flags.DEFINE_integer("repeats", 3, "timed reads per setting (the fastest is reported)")
  flags.DEFINE_string("out", "docs/results/bench_compaction", "table + JSON path stem")


def read(reader, samples, n):
  """(seconds, summary) of one batched read of the samples."""
  t0 = time.perf_counter()
  summary = run_eval(reader, toy.TASK, samples, None, batch_size=n, sampling=Sampling(0.7, 0.95, 1000), progress=False)
  return time.perf_counter() - t0, summary


def main(argv):
  del argv
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  cfg = toy_memagent.get_config("rl,demo,lookup,gated")
  policy = load_policy_of(cfg, FLAGS.export)
  readers = {}
  for buckets in (1, 3):
    cfg.agent.decode_buckets = buckets
    readers[buckets] = build_reader(cfg.agent, policy, training=False)
  rows = []
  for multiple in map(int, FLAGS.multiples):
    length = toy.TRAIN_TOKENS * multiple
    samples = sample_pool(cfg.data, chunk_tokens=cfg.agent.chunk_tokens, size=FLAGS.n, seed=1000 + length,
                          length=length, tokenizer=policy.tokenizer)
    row = dict(length=length, multiple=multiple, n=FLAGS.n)
    for buckets, reader in readers.items():
      read(reader, samples[: min(8, FLAGS.n)], FLAGS.n)  # compile these shapes
      times, summary = [], None
      for _ in range(FLAGS.repeats):
        seconds, summary = read(reader, samples, FLAGS.n)
        times.append(seconds)
      row[f"buckets{buckets}"] = dict(seconds_per_doc=min(times) / FLAGS.n, accuracy=summary["score"],
                                      decoded_tokens_per_doc=summary["decoded_tokens_per_doc"],
                                      keep_frac=summary.get("keep_frac"))
    row["speedup"] = row["buckets1"]["seconds_per_doc"] / row["buckets3"]["seconds_per_doc"]
    row["same_scores"] = row["buckets1"]["accuracy"] == row["buckets3"]["accuracy"]
    rows.append(row)
    print(f"{multiple}x: {row['buckets1']['seconds_per_doc']:.4f} -> {row['buckets3']['seconds_per_doc']:.4f} s/doc "
          f"({row['speedup']:.2f}x), keep {100 * row['buckets3']['keep_frac']:.0f}%", flush=True)
  command = "python -m experiments.benchmarks.bench_compaction " + " ".join(
      f"--{k}={v}" for k, v in (("export", FLAGS.export), ("multiples", ",".join(FLAGS.multiples)), ("n", FLAGS.n)))
  lines = ["# Row compaction on the CPU: a gated toy policy, decode_buckets 1 against 3", "",
           f"Command: `{command}` (commit {toy_report.current_commit()}, {os.cpu_count()} CPU cores, "
           f"{platform.machine()}). One batch of n documents per length, sampled at temperature 0.7 / top-p 0.95 "
           f"(seed 1000); seconds per document: the fastest of {FLAGS.repeats} reads after a warm-up read "
           "(compilation excluded). The same policy and documents with every row through every memory turn "
           "(1 bucket) and with the rows still working compacted into 3 sizes (agent.decode_buckets = 3).", "",
           "| length | x training | s / doc, 1 bucket | s / doc, 3 buckets | speed-up | decoded tokens / doc | "
           "keep share | accuracy (1 / 3 buckets) |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    a, b = r["buckets1"], r["buckets3"]
    lines.append(f"| {r['length']} | {r['multiple']}x | {a['seconds_per_doc']:.4f} | {b['seconds_per_doc']:.4f} | "
                 f"{r['speedup']:.2f}x | {b['decoded_tokens_per_doc']:.1f} | {100 * b['keep_frac']:.0f}% | "
                 f"{100 * a['accuracy']:.1f} / {100 * b['accuracy']:.1f} |")
  os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
  with atomic_write(FLAGS.out + ".md") as f:
    f.write("\n".join(lines) + "\n")
  with atomic_write(FLAGS.out + ".json") as f:
    json.dump({"command": command, "commit": toy_report.current_commit(), "rows": rows}, f, indent=1)
  print("\n".join(lines))


if __name__ == "__main__":
  define_flags()
  app.run(main)
