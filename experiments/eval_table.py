"""Accuracy vs document length for MemAgent and direct reading, one model, one table + PNG.

  python -m experiments.eval_table --task=niah_single_1 --lengths=2048,6144 --n=16

Writes docs/results/eval_<model>_<task>.{md,png} and the per-sample JSONL beside them.
"""

from __future__ import annotations

import os
import time

from absl import app, flags

import memagent_jax as mj
from memagent_jax import evaluation
from memagent_jax.data import tasks
from memagent_jax.runtime.atomic_io import atomic_write, save_figure

flags.DEFINE_string("model", "smollm2-135m-instruct", "what load_policy takes: a preset, HF directory or .gguf")
flags.DEFINE_string("task", "niah_single_1", "a task name (memagent eval --task)")
flags.DEFINE_string("lengths", "2048,6144", "document lengths in tokens, comma-separated")
flags.DEFINE_integer("n", 16, "documents per length")
flags.DEFINE_integer("chunk_tokens", 1024, "MemAgent's chunk size")
flags.DEFINE_integer("memory_tokens", 64, "MemAgent's memory size")
flags.DEFINE_integer("answer_tokens", 32, "the final answer's token cap")
flags.DEFINE_integer("batch_size", 8, "documents per call")
flags.DEFINE_integer("seed", 0, "documents and sampling")
flags.DEFINE_string("out", "docs/results", "directory of the table, plot and per-sample JSONL")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  policy = mj.load_policy(args.model)
  readers = {"memagent": mj.MemAgent(policy, chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                                     answer_tokens=args.answer_tokens),
             "direct": mj.DirectReader(policy, answer_tokens=args.answer_tokens)}
  name = f"eval_{args.model}_{args.task}"
  os.makedirs(args.out, exist_ok=True)
  rows = []
  for length in [int(x) for x in args.lengths.split(",")]:
    samples = tasks.make_samples(args.task, length, args.n, args.seed, policy.tokenizer,
                                 chunk_tokens=args.chunk_tokens)
    for method, reader in readers.items():
      out = os.path.join(args.out, f"{name}_{length}_{method}.jsonl")
      t = time.perf_counter()
      try:
        s = evaluation.run_eval(reader, args.task, samples, out, batch_size=args.batch_size,
                                sampling=evaluation.Sampling(seed=args.seed))  # greedy
        rows.append((length, method, f"{s['score']:.3f}", s["mean_document_tokens"],
                     f"{time.perf_counter() - t:.0f}"))
      except ValueError as e:  # the direct reader past the context window
        rows.append((length, method, "does not fit", "-", "-"))
        print(f"{method} @ {length}: {e}")
  lines = [f"# {args.task}: MemAgent vs direct reading, {args.model} (greedy)", "",
           f"Command: `.venv/bin/python -m experiments.eval_table --model={args.model} --task={args.task} "
           f"--lengths={args.lengths} --n={args.n} --chunk_tokens={args.chunk_tokens} --memory_tokens="
           f"{args.memory_tokens} --answer_tokens={args.answer_tokens} --seed={args.seed}`", "",
           "Score: string_match_all (RULER, paper Eq. 7) / sub_em, the paper's accuracy (QA), on what the answer "
           "claims (its boxed text, or what follows \"the answer is\"; RULER: the whole response when it claims "
           "nothing). Seconds include compilation.", "",
           "| context tokens | method | accuracy | mean document tokens | seconds |", "|---|---|---|---|---|"]
  lines += [f"| {' | '.join(str(c) for c in r)} |" for r in rows]
  table = "\n".join(lines) + "\n"
  print(table)
  with atomic_write(os.path.join(args.out, f"{name}.md")) as f:
    f.write(table + f"\n![accuracy]({name}.png)\n")
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for method in readers:
    pts = [(r[0], float(r[2])) for r in rows if r[1] == method and r[2] != "does not fit"]
    if pts:
      ax.plot(*zip(*pts), "o-", label=method)
  ax.set(xscale="log", xlabel="context tokens", ylabel="accuracy", ylim=(-0.02, 1.02), title=args.task)
  ax.legend()
  fig.tight_layout()
  save_figure(fig, os.path.join(args.out, f"{name}.png"), dpi=110)


if __name__ == "__main__":
  app.run(main)
