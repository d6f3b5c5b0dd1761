"""Accuracy vs document length for MemAgent and direct reading, one model, one table + PNG.

Run: `.venv/bin/python experiments/eval_table.py --task niah_single_1 --lengths 2048,6144 --n 16`
Writes docs/results/eval_<model>_<task>.{md,png} and the per-sample JSONL beside them.
"""

from __future__ import annotations

import argparse
import os
import time

import memagent_jax as mj
from memagent_jax.runtime.atomic_io import atomic_write, save_figure
from memagent_jax import evaluation
from memagent_jax.data import tasks


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--model", default="smollm2-135m-instruct")
  p.add_argument("--task", default="niah_single_1")
  p.add_argument("--lengths", default="2048,6144")
  p.add_argument("--n", type=int, default=16)
  p.add_argument("--chunk-tokens", type=int, default=1024)
  p.add_argument("--memory-tokens", type=int, default=64)
  p.add_argument("--answer-tokens", type=int, default=32)
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="docs/results")
  args = p.parse_args()
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
                                temperature=0.0, top_p=1.0, seed=args.seed)  # greedy
        rows.append((length, method, f"{s['score']:.3f}", s["mean_document_tokens"],
                     f"{time.perf_counter() - t:.0f}"))
      except ValueError as e:  # the direct reader past the context window
        rows.append((length, method, "does not fit", "-", "-"))
        print(f"{method} @ {length}: {e}")
  lines = [f"# {args.task}: MemAgent vs direct reading, {args.model} (greedy)", "",
           f"Command: `.venv/bin/python experiments/eval_table.py --model {args.model} --task {args.task} "
           f"--lengths {args.lengths} --n {args.n} --chunk-tokens {args.chunk_tokens} --memory-tokens "
           f"{args.memory_tokens} --answer-tokens {args.answer_tokens} --seed {args.seed}`", "",
           "Score: string_match_all (RULER) / sub_em (QA) on the boxed answer (RULER: the whole response "
           "when nothing is boxed). Seconds include compilation.", "",
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
  main()
