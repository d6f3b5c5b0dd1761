"""Reward curve of a training run, with its held-out score when it has one (step 0 = before
training): PNG + markdown table from <workdir>/logs/metrics.jsonl.

  python -m experiments.plot_training --workdir=runs/toy_cpu --out=docs/results/train_toy_cpu
"""

from __future__ import annotations

import os

import numpy as np
from absl import app, flags

from memagent_jax.rl.metrics import read_jsonl
from memagent_jax.runtime.atomic_io import atomic_write, save_figure

flags.DEFINE_string("workdir", None, "the training run's directory", required=True)
flags.DEFINE_string("out", None, "output path without extension (.md and .png written)", required=True)
flags.DEFINE_integer("window", 10, "steps per row of the table / smoothing window")
flags.DEFINE_string("command", "", "the training command, recorded in the table")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  records = read_jsonl(os.path.join(args.workdir, "logs", "metrics.jsonl"))
  lines = [l for l in records if "train/reward_mean" in l]
  if not lines:
    raise SystemExit(f"no training metrics in {args.workdir}/logs/metrics.jsonl")
  held_out = [(l["step"], l["eval/score"]) for l in records if "eval/score" in l]  # step 0: before RL
  steps = np.array([l["step"] for l in lines])
  reward = np.array([l["train/reward_mean"] for l in lines])
  # a step whose groups all tied (dynamic sampling kept none) made no update: no entropy
  entropy = np.array([l.get("train/entropy", np.nan) for l in lines], np.float64)
  seconds = np.array([l["train/step_seconds"] for l in lines])
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
  w = min(args.window, len(reward))
  smooth = np.convolve(reward, np.ones(w) / w, mode="valid")
  ax[0].plot(steps, reward, alpha=0.35, label="mean reward per step")
  ax[0].plot(steps[w - 1:], smooth, label=f"{w}-step mean")
  if held_out:
    ax[0].plot(*zip(*held_out), "o-", color="C3", label="held-out score")
  ax[0].set_xlabel("step"), ax[0].set_ylabel("reward / score"), ax[0].legend()
  ax[1].plot(steps, entropy, color="C2")
  ax[1].set_xlabel("step"), ax[1].set_ylabel("policy entropy (nats)")
  fig.suptitle(os.path.basename(os.path.normpath(args.workdir)))
  fig.tight_layout()
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  save_figure(fig, args.out + ".png", dpi=120)
  rows = ["| steps | mean reward | mean entropy | seconds (cumulative) |", "|---|---|---|---|"]
  for s in range(0, len(lines), args.window):
    sl = slice(s, s + args.window)
    updated = entropy[sl][np.isfinite(entropy[sl])]
    rows.append(f"| {steps[sl][0]}-{steps[sl][-1]} | {reward[sl].mean():.3f} | "
                f"{updated.mean() if updated.size else np.nan:.2f} | {seconds[:s + args.window].sum():.0f} |")
  if held_out:
    rows += ["", "| step | held-out score |", "|---|---|"] + [f"| {s} | {v:.3f} |" for s, v in held_out]
  with atomic_write(args.out + ".md") as f:
    f.write(f"# Training curve: {args.workdir}\n\n")
    if args.command:
      f.write(f"Command: `{args.command}`\n\n")
    f.write("\n".join(rows) + f"\n\n![reward]({os.path.basename(args.out)}.png)\n")
  print("\n".join(rows))


if __name__ == "__main__":
  app.run(main)
