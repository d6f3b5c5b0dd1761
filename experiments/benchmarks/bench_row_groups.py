"""The sampler's CPU row groups (`AttentionSpec.cpu_sample_group_bytes`) on make reproduce's sweep batch:
seconds per batch for each budget, the rows per group it gives the memory updates, and digests of every
answer, memory and log-prob. All budgets run in one process, in turn, round after round, so the host's
drift hits them alike. Prints a table; --out writes it as markdown with a PNG beside it.

  python -m experiments.benchmarks.bench_row_groups --source=experiments/data/toy_warm_start_lookup_demo

--cpu_devices=2 splits the rows over two CPU devices (a `data` mesh): each device groups its own rows.
"""

from __future__ import annotations

import os
import statistics
import time

import jax
from absl import app, flags

from experiments.benchmarks.bench_length_sweep import cpu_devices, split_cpu, usable_cores
from experiments.benchmarks.sweep_batch import digests, set_sample_group_bytes, sweep_reader
from memagent_jax.agent.memagent import question_bucket
from memagent_jax.policy import sampling
from memagent_jax.runtime import parallel

FLAGS = flags.FLAGS
MIB = 1 << 20


def define_flags():
  """Defined when run as a script only (a test may import this module beside other scripts' flags)."""
  flags.DEFINE_integer("multiple", 8, "document length / training length (128 tokens)")
  flags.DEFINE_integer("n", 200, "documents in the batch (make reproduce's sweep batch)")
  flags.DEFINE_string("source", "experiments/data/toy_warm_start_lookup_demo", "the reader's weights (a trained "
                      "reader writes longer memories than the base, so decodes more)")
  flags.DEFINE_list("budgets_mib", ["0", "5", "6", "8", "16", "32"], "cpu_sample_group_bytes values in MiB "
                    "(0: all rows at once)")
  flags.DEFINE_integer("rounds", 3, "timed rounds over every budget, after one compiling round")
  flags.DEFINE_string("out", "", "markdown file for the table (a PNG is written beside it)")
  flags.DEFINE_integer("cpu_devices", 1, "JAX CPU devices the rows split over (0: the most logical CPUs that divide --n)")


def memory_update_slots(reader, questions) -> int:
  """Slots of the reader's memory-update KV cache for these questions: the prompt plus the memory cap."""
  width = question_bucket(max(len(reader.tokenizer.encode(q)) for q in questions))
  return reader.prompt_tokens(width)["memory update"] + reader.memory_tokens


def time_budgets(reader, call, budgets: list[int], rounds: int) -> dict[int, dict]:
  """{budget: seconds of each timed round and the last results' digests}; budgets run in turn per round."""
  rows = {b: {"seconds": []} for b in budgets}
  for r in range(rounds + 1):
    for b in budgets:
      set_sample_group_bytes(reader, b)
      start = time.perf_counter()
      results = call()
      if r:  # round 0 compiles every budget's programs
        rows[b]["seconds"].append(time.perf_counter() - start)
      rows[b]["digests"] = digests(results)
  return rows


def table(rows: dict[int, dict], group_rows: dict[int, int]) -> str:
  base = min(rows[0]["seconds"]) if 0 in rows else None
  lines = ["| cpu_sample_group_bytes | rows per group (memory updates) | best s | median s | best vs all rows "
           "| answers + memories | log-probs |", "|---|---|---|---|---|---|---|"]
  for b, row in rows.items():
    best = min(row["seconds"])
    ratio = f"{base / best:.2f}x" if base else "-"
    lines.append(f"| {'0 (all rows)' if b == 0 else f'{b / MIB:g} MiB'} | {group_rows[b]} | {best:.3f} | "
                 f"{statistics.median(row['seconds']):.3f} | {ratio} | {row['digests'][0]} | {row['digests'][1]} |")
  return "\n".join(lines)


def plot(rows: dict[int, dict], group_rows: dict[int, int], path: str):
  import matplotlib  # optional: only for --out
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 3.5))
  labels = [f"{group_rows[b]} rows" + ("\n(all)" if b == 0 else f"\n{b / MIB:g} MiB") for b in rows]
  for i, row in enumerate(rows.values()):
    ax.scatter([i] * len(row["seconds"]), row["seconds"], color="tab:blue", s=14)
  ax.plot(range(len(rows)), [min(r["seconds"]) for r in rows.values()], color="tab:blue", label="best of the rounds")
  ax.set_xticks(range(len(rows)), labels, fontsize=8)
  ax.set_ylabel("seconds per sweep batch")
  ax.set_ylim(bottom=0)
  ax.set_title("sampling in row groups (CPU): one toy sweep batch", fontsize=10)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv):
  del argv
  devices = cpu_devices(FLAGS.cpu_devices, FLAGS.n, usable_cores())
  split_cpu(devices)
  mesh = parallel.make_mesh() if jax.default_backend() == "cpu" and devices > 1 else None
  cfg, reader, questions, docs = sweep_reader(FLAGS.multiple, FLAGS.n, FLAGS.source, mesh=mesh)
  budgets = [int(float(m) * MIB) for m in FLAGS.budgets_mib]
  slots = memory_update_slots(reader, questions)
  group_rows = {}
  for b in budgets:  # on each device, of its n / devices rows
    set_sample_group_bytes(reader, b)
    group_rows[b] = sampling.row_group(reader.policy.model, FLAGS.n // devices, slots, shards=devices)
  per_row = sampling.cache_bytes_per_row(reader.policy.config, slots, reader.policy.dtype)
  call = lambda: reader.answer_batch(questions, docs, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                                     seed=1000)
  rows = time_budgets(reader, call, budgets, FLAGS.rounds)
  text = (f"{FLAGS.n} documents of {128 * FLAGS.multiple} tokens on {devices} {jax.default_backend()} device(s) "
          f"({FLAGS.n // devices} rows each), reader {FLAGS.source}; a row's memory-update "
          f"KV cache {per_row / MIB:.2f} MiB; {FLAGS.rounds} rounds after a compiling one\n\n"
          + table(rows, group_rows))
  print(text)
  if FLAGS.out:
    png = os.path.splitext(FLAGS.out)[0] + ".png"
    with open(FLAGS.out, "w") as f:
      f.write(text + f"\n\n![row groups]({os.path.basename(png)})\n")
    plot(rows, group_rows, png)


if __name__ == "__main__":
  define_flags()
  app.run(main)
