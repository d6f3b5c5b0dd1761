"""Where the residual memory errors sit: the overwrite rate of distractor-only chunks at one length,
broken down by the fact's place in the chunk, the chunk's load, the asked key, the distractor's
value, the place in the document and the memory's wording (evaluation/memory_errors.py,
distractor_hazards), for one or more swept toy policies. A markdown table and a PNG.

  python experiments/error_hazards.py --out=docs/results/toy_lookup_error_hazards --multiple=256 \
    --policy="200 steps, T 0.7=runs/toy_sweep/fresh200/fresh200" \
    --policy="200 steps, greedy=runs/toy_sweep/fresh200_greedy/fresh200_greedy"

Each --policy is LABEL=PREFIX: the per-document lines are PREFIX_<length>.jsonl (experiments/toy_sweep.py).
"""

from __future__ import annotations

import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from configs import toy_memagent  # noqa: E402
from experiments import memory_errors, toy_variants  # noqa: E402
from memagent_jax.data import toy  # noqa: E402
from memagent_jax.evaluation.length_sweep import wilson_interval  # noqa: E402
from memagent_jax.evaluation.memory_errors import HAZARD_FACTORS, distractor_hazards  # noqa: E402

FACTOR_TITLES = {
    "last_fact_offset": "offset of the chunk's last fact (tokens into the chunk)",
    "facts_in_chunk": "facts in the chunk",
    "asked_key": "the question's key",
    "distractor_value": "a distractor's value",
    "document_quarter": "quarter of the document",
    "memory_before": "the memory before the chunk",
}


def policy_hazards(prefix: str, length: int, world: str, eval_seed: int) -> dict:
  samples, rows = memory_errors.swept_documents(prefix, length, eval_seed, world)
  cfg = toy_memagent.get_config(f"rl,{world}")
  return distractor_hazards(samples, rows, chunk_tokens=cfg.agent.chunk_tokens)


def cell(lost_read: tuple[int, int] | None) -> str:
  if not lost_read or not lost_read[1]:
    return "-"
  low, high = wilson_interval(*lost_read)
  return f"{memory_errors.rate(*lost_read, digits=2)} [{100 * low:.2f}, {100 * high:.2f}]"


def markdown(policies: dict[str, dict], multiple: int, command: str) -> str:
  lines = [f"Overwrite rate of distractor-only chunks read while the memory was right, at {multiple}x: "
           "first errors / such chunks [95% Wilson interval], by one factor at a time. A chunk with two "
           "distractor values counts under each.", "", "    " + command, ""]
  for factor in HAZARD_FACTORS:
    levels = sorted({level for hazards in policies.values() for level in hazards[factor]})
    lines += [f"### {FACTOR_TITLES[factor]}", "", "| level | " + " | ".join(policies) + " |",
              "|" + "---|" * (len(policies) + 1)]
    lines += [f"| {level} | " + " | ".join(cell(h[factor].get(level)) for h in policies.values()) + " |"
              for level in levels]
    lines.append("")
  return "\n".join(lines)


def plot(policies: dict[str, dict], multiple: int, path: str) -> None:
  """One panel per factor: the rate of each level, a bar per policy with its Wilson interval."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(2, 3, figsize=(16, 8))
  width = 0.8 / len(policies)
  for ax, factor in zip(axes.flat, HAZARD_FACTORS):
    levels = sorted({level for hazards in policies.values() for level in hazards[factor]})
    for i, (label, hazards) in enumerate(policies.items()):
      xs, rates, low, high = [], [], [], []
      for j, level in enumerate(levels):
        lost, read = hazards[factor].get(level, (0, 0))
        if not read:
          continue
        lo, hi = wilson_interval(lost, read)
        xs.append(j + i * width)
        rates.append(100 * lost / read)
        low.append(max(0.0, rates[-1] - 100 * lo))  # clipped: float rounding at 0 lost
        high.append(max(0.0, 100 * hi - rates[-1]))
      crowded = len(levels) > 10  # many levels: intervals would hide the bars (they are in the table)
      ax.bar(xs, rates, width, yerr=None if crowded else [low, high], capsize=2, label=label, color=f"C{i % 10}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], levels, rotation=60 if len(levels) > 6 else 0,
                  fontsize=7 if len(levels) > 6 else 8)
    ax.set(title=FACTOR_TITLES[factor] + (" (intervals in the table)" if len(levels) > 10 else ""),
           ylabel="overwrites per chunk (%)")
  axes.flat[0].legend(fontsize=8)
  fig.suptitle(f"where distractor overwrites happen at {multiple}x (95% Wilson intervals)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def write(policies: dict[str, dict], multiple: int, command: str, out: str) -> str:
  """<out>.md (the tables, with the command) and <out>.png; returns the tables."""
  text = markdown(policies, multiple, command)
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out + ".md", "w") as fh:
    fh.write(text)
  plot(policies, multiple, out + ".png")
  print(text)
  return text


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  policies = {label: policy_hazards(prefix, toy.TRAIN_TOKENS * f.multiple, f.world, f.eval_seed)
              for label, prefix in toy_variants.policy_prefixes(f.policy).items()}
  command = "python experiments/error_hazards.py " + " ".join(
      [f"--out={f.out}", f"--multiple={f.multiple}"] + [shlex.quote(f"--policy={s}") for s in f.policy])
  write(policies, f.multiple, command, f.out)


if __name__ == "__main__":  # flags only when run as a script: tests import this module
  flags.DEFINE_multi_string("policy", [], "LABEL=PREFIX of a swept policy's <PREFIX>_<length>.jsonl")
  flags.DEFINE_string("out", None, "write <out>.md and <out>.png", required=True)
  flags.DEFINE_integer("multiple", 256, "the length, as a multiple of the training length")
  flags.DEFINE_integer("eval_seed", 1000, "the sweeps' --eval_seed (documents: seed + length)")
  flags.DEFINE_enum("world", "lookup", list(toy_memagent.WORLDS), "the world the policies were trained in")
  app.run(main)
