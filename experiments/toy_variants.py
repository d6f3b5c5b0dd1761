"""Several evaluated toy policies side by side: accuracy (95% Wilson) and per-chunk memory error rates
at each length, as a markdown table and a PNG. For RL ablations (KL, documents, steps) whose policies
were each swept by experiments/toy_sweep.py or experiments/toy_reproduction.py.

  python experiments/toy_variants.py --out=docs/results/toy_lookup_rl_variants \
    --policy="default (120 steps)=runs/toy_full_lookup/eval/rl" --policy="KL 0=runs/toy_sweep/kl0/kl0"

Each --policy is LABEL=PREFIX: the per-document lines are PREFIX_<length>.jsonl. A length missing for
a policy shows as "-"; the documents are regenerated from the task and seeds, as the evaluation made them.
"""

from __future__ import annotations

import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from configs import toy_memagent  # noqa: E402
from experiments import memory_errors  # noqa: E402
from memagent_jax.data import toy  # noqa: E402
from memagent_jax.evaluation.length_sweep import wilson_interval  # noqa: E402

# Per-chunk rates shown: (label, where in error_table, key)
RATES = (("other askable key's fact overwrote", "distractor_split", "other_askable"),
         ("unaskable key's fact overwrote", "distractor_split", "unaskable"),
         ("copy corrupted", "per_chunk", "copy_corruption"),
         ("update missed", "per_chunk", "missed_update"))


def policy_rows(prefix: str, world: str, eval_seed: int, lengths: set[int] | None = None) -> dict[int, dict]:
  """{length: accuracy, interval and error_table} for every <prefix>_<length>.jsonl (of `lengths` if given)."""
  return {r["length"]: {**r, "accuracy": r["right"] / r["n"], "interval": wilson_interval(r["right"], r["n"])}
          for r in memory_errors.prefix_rows(prefix, eval_seed, world, lengths)}


def markdown(policies: dict[str, dict[int, dict]], command: str) -> str:
  lengths = sorted({length for rows in policies.values() for length in rows})
  longest = lengths[-1]
  head = ["policy", *(f"{length // toy.TRAIN_TOKENS}x" for length in lengths),
          *(f"{label} at {longest // toy.TRAIN_TOKENS}x (per chunk)" for label, _, _ in RATES)]
  lines = ["Accuracy in % [95% Wilson interval], n documents per point; per-chunk rates: first errors at "
           "chunks of that kind / such chunks read while the memory was still right.", "",
           "    " + command, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for label, rows in policies.items():
    acc = [f"{100 * rows[x]['accuracy']:.1f} [{100 * rows[x]['interval'][0]:.0f}, "
           f"{100 * rows[x]['interval'][1]:.0f}]" if x in rows else "-" for x in lengths]
    rates = [memory_errors.rate(*rows[longest][where][key], digits=2) if longest in rows else "-"
             for _, where, key in RATES]
    lines.append(f"| {label} | " + " | ".join(acc + rates) + " |")
  ns = sorted({r["n"] for rows in policies.values() for r in rows.values()})
  return "\n".join(lines) + f"\n\nn = {', '.join(map(str, ns))}.\n"


def plot(policies: dict[str, dict[int, dict]], path: str) -> None:
  """Left: accuracy against length with intervals; right: per-chunk error rates at the longest length."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  lengths = sorted({length for rows in policies.values() for length in rows})
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  for i, (label, rows) in enumerate(policies.items()):  # colour C<i>: the same policy in both panels
    xs = [x for x in lengths if x in rows]
    acc = [100 * rows[x]["accuracy"] for x in xs]
    err = [[a - 100 * rows[x]["interval"][0] for a, x in zip(acc, xs)],
           [100 * rows[x]["interval"][1] - a for a, x in zip(acc, xs)]]
    left.errorbar([x // toy.TRAIN_TOKENS for x in xs], acc, yerr=err, marker="o", capsize=3, label=label,
                  color=f"C{i % 10}")
  multiples = [x // toy.TRAIN_TOKENS for x in lengths]
  left.set(xscale="log", xlabel="document length (x training length)", ylabel="accuracy (%)",
           title="accuracy, 95% Wilson intervals")
  left.set_xticks(multiples, [f"{m}x" for m in multiples])
  left.minorticks_off()
  left.legend(fontsize=8)
  longest, width = lengths[-1], 0.8 / len(policies)
  for i, (label, rows) in enumerate(policies.items()):
    if longest not in rows:
      continue
    rates = [100 * rows[longest][w][k][0] / max(1, rows[longest][w][k][1]) for _, w, k in RATES]
    right.bar([j + i * width for j in range(len(RATES))], rates, width, label=label, color=f"C{i % 10}")
  right.set_xticks([j + 0.4 - width / 2 for j in range(len(RATES))],
                   [r[0].replace("'s fact ", "'s fact\n") for r in RATES], fontsize=8)
  right.set(ylabel="first errors per such chunk (%)", title=f"per-chunk error rates at {longest // toy.TRAIN_TOKENS}x")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def policy_prefixes(specs: list[str]) -> dict[str, str]:
  """{label: prefix} from --policy=LABEL=PREFIX flags (at least one)."""
  out = {}
  for spec in specs:
    label, sep, prefix = spec.partition("=")
    if not sep or not label or not prefix:
      raise app.UsageError(f"--policy={spec!r}: give LABEL=PREFIX")
    out[label] = prefix
  if not out:
    raise app.UsageError("give at least one --policy=LABEL=PREFIX")
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  lengths = {toy.TRAIN_TOKENS * int(m) for m in f.multiples}
  policies = {label: policy_rows(prefix, f.world, f.eval_seed, lengths)
              for label, prefix in policy_prefixes(f.policy).items()}
  command = "python experiments/toy_variants.py " + " ".join(
      [f"--out={f.out}"] + ([f"--multiples={','.join(f.multiples)}"] if f.multiples else [])
      + [shlex.quote(f"--policy={s}") for s in f.policy])
  write(policies, command, f.out)


def write(policies: dict[str, dict[int, dict]], command: str, out: str) -> str:
  """<out>.md (the table, with the command) and <out>.png; returns the table."""
  text = markdown(policies, command)
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out + ".md", "w") as fh:
    fh.write(text)
  plot(policies, out + ".png")
  print(text)
  return text


if __name__ == "__main__":  # flags only when run as a script: tests import this module
  flags.DEFINE_multi_string("policy", [], "LABEL=PREFIX of a swept policy's <PREFIX>_<length>.jsonl")
  flags.DEFINE_string("out", None, "write <out>.md and <out>.png", required=True)
  flags.DEFINE_list("multiples", [], "only these lengths, as multiples of the training length (default: all)")
  flags.DEFINE_integer("eval_seed", 1000, "the sweeps' --eval_seed (documents: seed + length)")
  flags.DEFINE_enum("world", "lookup", list(toy_memagent.WORLDS), "the world the policies were trained in")
  app.run(main)
