"""Analyses of evaluated toy policies, all from the per-document lines a length sweep writes
(<prefix>_<length>.jsonl: the memories after each chunk and the score), with the documents
regenerated from the task and seeds as the evaluation made them (evaluation/memory_errors.py).

  python -m experiments.toy_analysis sweep --export=runs/toy_full_lookup/rl/export --name=rl --multiples=1,4,16
  python -m experiments.toy_analysis errors --workdir=runs/toy_full_lookup --stage=rl
  python -m experiments.toy_analysis variants --out=runs/variants --policy="RL=runs/toy_full_lookup/eval/rl"
  python -m experiments.toy_analysis hazards --out=runs/hazards --multiple=256 --policy="RL=runs/toy_full_lookup/eval/rl"

sweep     evaluates ONE exported policy at several lengths and prints, per length, accuracy with its 95%
          Wilson interval, seconds per document and the per-chunk error rate of each chunk kind.
errors    the first chunk after which each wrong document's memory lost the asked key's latest value,
          by what that chunk held, per length of a reproduction's stage (a markdown table).
variants  several swept policies side by side: accuracy and per-chunk error rates (markdown + PNG).
hazards   where distractor overwrites happen at one length: the rate by the fact's place in the chunk,
          the chunk's load, the asked key, the value, the place in the document and the memory's
          wording (markdown + PNG).
Each --policy is LABEL=PREFIX of a swept policy's <PREFIX>_<length>.jsonl.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import sys

from absl import app, flags

from configs import toy_memagent  # an installed package (setup.py)
from memagent_jax.data import tasks, toy
from memagent_jax.evaluation.length_sweep import SweepSpec, sweep_lengths, wilson_interval
from memagent_jax.evaluation.memory_errors import (CHUNK_KINDS, DISTRACTOR_SPLIT, HAZARD_FACTORS, KINDS,
                                                   distractor_hazards, error_table)
from memagent_jax.experiment.assembly import load_reader

COMMANDS = ("sweep", "errors", "variants", "hazards")

# Per-chunk rates of the variants table: (label, where in error_table, key)
RATES = (("other askable key's fact overwrote", "distractor_split", "other_askable"),
         ("unaskable key's fact overwrote", "distractor_split", "unaskable"),
         ("copy corrupted", "per_chunk", "copy_corruption"),
         ("update missed", "per_chunk", "missed_update"))

FACTOR_TITLES = {
    "last_fact_offset": "offset of the chunk's last fact (tokens into the chunk)",
    "facts_in_chunk": "facts in the chunk",
    "asked_key": "the question's key",
    "distractor_value": "a distractor's value",
    "document_quarter": "quarter of the document",
    "memory_before": "the memory before the chunk",
}


# ---- the shared reader ----

def chunk_tokens(world: str) -> int:
  return toy_memagent.get_config(f"rl,{world}").agent.chunk_tokens


def swept_documents(prefix: str, length: int, eval_seed: int, world: str) -> tuple[list[dict], list[dict]]:
  """The documents of <prefix>_<length>.jsonl, regenerated from the task and seeds, and its lines."""
  cfg = toy_memagent.get_config(f"rl,{world}")
  path = f"{prefix}_{length}.jsonl"
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no {path}: evaluate the policy at {length} tokens first "
                            "(python -m experiments.toy_analysis sweep)")
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  samples = tasks.make_samples(cfg.data.task, length, len(rows), eval_seed + length, None,
                               chunk_tokens=cfg.agent.chunk_tokens)
  return samples, rows


def prefix_rows(prefix: str, eval_seed: int, world: str, lengths: set[int] | None = None) -> list[dict]:
  """One row per <prefix>_<length>.jsonl (of `lengths` if given), by length: n, exact-match hits,
  accuracy with its Wilson interval and the error_table counts."""
  out = []
  for length in sorted(int(m.group(1)) for p in glob.glob(f"{prefix}_*.jsonl")
                       if (m := re.search(r"_(\d+)\.jsonl$", p))):
    if lengths and length not in lengths:
      continue
    samples, rows = swept_documents(prefix, length, eval_seed, world)
    right = sum(bool(r["score"]) for r in rows)
    out.append({"length": length, "n": len(rows), "right": right, "accuracy": right / len(rows),
                "interval": wilson_interval(right, len(rows)),
                **error_table(samples, rows, chunk_tokens=chunk_tokens(world))})
  if not out:
    raise FileNotFoundError(f"no {prefix}_<length>.jsonl: evaluate the policy first "
                            "(experiments.toy_reproduction or experiments.toy_analysis sweep)")
  return out


def rate(failed: int, exposed: int, digits: int = 1) -> str:
  return f"{failed}/{exposed} = {100 * failed / exposed:.{digits}f}%" if exposed else "-"


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


def _save(text: str, out: str, draw) -> str:
  """<out>.md (the text) and <out>.png (draw(path)); prints and returns the text."""
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out + ".md", "w") as fh:
    fh.write(text)
  draw(out + ".png")
  print(text)
  return text


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


# ---- errors: the first memory error of each wrong document ----

def error_rows(workdir: str, stage: str, eval_seed: int, world: str) -> list[dict]:
  """One row per evaluated length of a reproduction's `stage`."""
  return prefix_rows(os.path.join(workdir, "eval", stage), eval_seed, world)


def errors_markdown(rows: list[dict], stage: str) -> str:
  head = ["length (tokens)", "x training", "documents", "wrong", *KINDS, "right despite a wrong memory",
          "mean position of the first error (0 = first chunk, 1 = last)",
          *(f"per-chunk {k} rate" for k in CHUNK_KINDS),
          *(f"distractor overwrite rate, {k.replace('_', ' ')} keys" for k in DISTRACTOR_SPLIT)]
  lines = [f"First memory error of each wrong document, {stage} (experiments/toy_analysis.py errors). Per-chunk "
           "rate: first errors at chunks of that kind / such chunks read while the memory was still right.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    pos = "-" if r["mean_relative_chunk"] is None else f"{r['mean_relative_chunk']:.2f}"
    rates = ([rate(*r["per_chunk"][k]) for k in CHUNK_KINDS]
             + [rate(*r["distractor_split"][k]) for k in DISTRACTOR_SPLIT])
    lines.append(f"| {r['length']} | {r['length'] // toy.TRAIN_TOKENS}x | {r['documents']} | {r['wrong']} | "
                 + " | ".join(str(r[k]) for k in KINDS) + f" | {r['right_despite_wrong_memory']} | {pos} | "
                 + " | ".join(rates) + " |")
  return "\n".join(lines) + "\n"


# ---- variants: several policies side by side ----

def policy_rows(prefix: str, world: str, eval_seed: int, lengths: set[int] | None = None) -> dict[int, dict]:
  """{length: prefix_rows row} for every <prefix>_<length>.jsonl (of `lengths` if given)."""
  return {r["length"]: r for r in prefix_rows(prefix, eval_seed, world, lengths)}


def variants_markdown(policies: dict[str, dict[int, dict]], command: str) -> str:
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
    rates = [rate(*rows[longest][where][key], digits=2) if longest in rows else "-" for _, where, key in RATES]
    lines.append(f"| {label} | " + " | ".join(acc + rates) + " |")
  ns = sorted({r["n"] for rows in policies.values() for r in rows.values()})
  return "\n".join(lines) + f"\n\nn = {', '.join(map(str, ns))}.\n"


def variants_plot(policies: dict[str, dict[int, dict]], path: str) -> None:
  """Left: accuracy against length with intervals; right: per-chunk error rates at the longest length."""
  plt = _pyplot()
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
    if longest in rows:
      rates = [100 * rows[longest][w][k][0] / max(1, rows[longest][w][k][1]) for _, w, k in RATES]
      right.bar([j + i * width for j in range(len(RATES))], rates, width, label=label, color=f"C{i % 10}")
  right.set_xticks([j + 0.4 - width / 2 for j in range(len(RATES))],
                   [r[0].replace("'s fact ", "'s fact\n") for r in RATES], fontsize=8)
  right.set(ylabel="first errors per such chunk (%)", title=f"per-chunk error rates at {longest // toy.TRAIN_TOKENS}x")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_variants(policies: dict[str, dict[int, dict]], command: str, out: str) -> str:
  """<out>.md (the table, with the command) and <out>.png; returns the table."""
  return _save(variants_markdown(policies, command), out, lambda path: variants_plot(policies, path))


# ---- hazards: where distractor overwrites happen ----

def policy_hazards(prefix: str, length: int, world: str, eval_seed: int) -> dict:
  samples, rows = swept_documents(prefix, length, eval_seed, world)
  return distractor_hazards(samples, rows, chunk_tokens=chunk_tokens(world))


def _hazard_cell(lost_read: tuple[int, int] | None) -> str:
  if not lost_read or not lost_read[1]:
    return "-"
  low, high = wilson_interval(*lost_read)
  return f"{rate(*lost_read, digits=2)} [{100 * low:.2f}, {100 * high:.2f}]"


def hazards_markdown(policies: dict[str, dict], multiple: int, command: str) -> str:
  lines = [f"Overwrite rate of distractor-only chunks read while the memory was right, at {multiple}x: "
           "first errors / such chunks [95% Wilson interval], by one factor at a time. A chunk with two "
           "distractor values counts under each.", "", "    " + command, ""]
  for factor in HAZARD_FACTORS:
    levels = sorted({level for hazards in policies.values() for level in hazards[factor]})
    lines += [f"### {FACTOR_TITLES[factor]}", "", "| level | " + " | ".join(policies) + " |",
              "|" + "---|" * (len(policies) + 1)]
    lines += [f"| {level} | " + " | ".join(_hazard_cell(h[factor].get(level)) for h in policies.values()) + " |"
              for level in levels]
    lines.append("")
  return "\n".join(lines)


def hazards_plot(policies: dict[str, dict], multiple: int, path: str) -> None:
  """One panel per factor: the rate of each level, a bar per policy with its Wilson interval."""
  plt = _pyplot()
  fig, axes = plt.subplots(2, 3, figsize=(16, 8))
  width = 0.8 / len(policies)
  for ax, factor in zip(axes.flat, HAZARD_FACTORS):
    levels = sorted({level for hazards in policies.values() for level in hazards[factor]})
    crowded = len(levels) > 10  # many levels: intervals would hide the bars (they are in the table)
    for i, (label, hazards) in enumerate(policies.items()):
      xs, rates, low, high = [], [], [], []
      for j, level in enumerate(levels):
        lost, read = hazards[factor].get(level, (0, 0))
        if read:
          lo, hi = wilson_interval(lost, read)
          xs.append(j + i * width)
          rates.append(100 * lost / read)
          low.append(max(0.0, rates[-1] - 100 * lo))  # clipped: float rounding at 0 lost
          high.append(max(0.0, 100 * hi - rates[-1]))
      ax.bar(xs, rates, width, yerr=None if crowded else [low, high], capsize=2, label=label, color=f"C{i % 10}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], levels, rotation=60 if len(levels) > 6 else 0,
                  fontsize=7 if len(levels) > 6 else 8)
    ax.set(title=FACTOR_TITLES[factor] + (" (intervals in the table)" if crowded else ""),
           ylabel="overwrites per chunk (%)")
  axes.flat[0].legend(fontsize=8)
  fig.suptitle(f"where distractor overwrites happen at {multiple}x (95% Wilson intervals)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_hazards(policies: dict[str, dict], multiple: int, command: str, out: str) -> str:
  """<out>.md (the tables, with the command) and <out>.png; returns the tables."""
  return _save(hazards_markdown(policies, multiple, command), out,
               lambda path: hazards_plot(policies, multiple, path))


# ---- sweep: one exported policy ----

def sweep(export: str, name: str, world: str, multiples: list[int], *, n: int, temperature: float,
          eval_seed: int, out_dir: str) -> list[str]:
  """Evaluates `export` at each multiple of the training length; one printed line per length."""
  cfg = toy_memagent.get_config(f"rl,{world}")
  chunk = cfg.agent.chunk_tokens
  os.makedirs(out_dir, exist_ok=True)
  reader = load_reader(cfg, export, training=False)
  lengths = [toy.TRAIN_TOKENS * m for m in multiples]
  spec = SweepSpec(task=cfg.data.task, lengths=tuple(lengths), n=n, seed=eval_seed, batch_size=n,
                   temperature=temperature, top_p=cfg.eval.top_p, chunk_tokens=chunk,
                   warmup_each_length=False,  # one warm-up, on 1x documents
                   warmup_length=toy.TRAIN_TOKENS)  # (with --multiples=256 alone, not on 200 long ones)
  rows = sweep_lengths(reader, name, spec, out_dir=out_dir)
  lines = []
  for length, row in zip(lengths, rows):
    table = error_table(*swept_documents(os.path.join(out_dir, name), length, eval_seed, world), chunk_tokens=chunk)
    kinds = {**table["per_chunk"], **{f"overwrite by {k}": v for k, v in table["distractor_split"].items()}}
    lines.append(f"{name} {length // toy.TRAIN_TOKENS}x: {100 * row.accuracy:.1f}% [{100 * row.ci_low:.0f}, "
                 f"{100 * row.ci_high:.0f}], {row.seconds_per_doc:.3f} s/doc; "
                 + "; ".join(f"{k} {rate(*v)}" for k, v in kinds.items()))
    print(lines[-1], flush=True)
  return lines


def define_flags() -> None:
  """The command line's flags, defined when run as a script only: toy_reproduction and tests import
  this module beside their own flags."""
  flags.DEFINE_string("export", None, "sweep: an exported policy directory (a stage's export)")
  flags.DEFINE_string("name", "policy", "sweep: its name in the output files")
  flags.DEFINE_integer("n", 200, "sweep: documents per length")
  flags.DEFINE_float("temperature", 0.7, "sweep: sampling temperature (0: greedy)")
  flags.DEFINE_string("out_dir", None, "sweep: per-document lines (default runs/toy_sweep/<name>)")
  flags.DEFINE_string("workdir", "runs/toy_full_lookup", "errors: the reproduction's run directory")
  flags.DEFINE_string("stage", "rl", "errors: which evaluated policy (rl, warm_start)")
  flags.DEFINE_multi_string("policy", [], "variants, hazards: LABEL=PREFIX of a swept policy's <PREFIX>_<length>.jsonl")
  flags.DEFINE_string("out", None, "variants, hazards: write <out>.md and <out>.png; errors: also write the table "
                      "to this markdown file")
  flags.DEFINE_list("multiples", [], "sweep (default 1,4,16), variants (default: all swept): lengths, as "
                    "multiples of the training length")
  flags.DEFINE_integer("multiple", 256, "hazards: the length, as a multiple of the training length")
  flags.DEFINE_integer("eval_seed", 1000, "documents: seed + length (the reproduction's --eval_seed)")
  flags.DEFINE_enum("world", "lookup", list(toy_memagent.WORLDS), "the world the policies were trained in")


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"give one subcommand of {', '.join(COMMANDS)}; got {argv[1:]}")
  command, f = argv[1], flags.FLAGS
  if command in ("variants", "hazards") and not f.out:
    raise app.UsageError(f"{command}: give --out")
  said = "python -m experiments.toy_analysis " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  if command == "sweep":
    if not f.export:
      raise app.UsageError("sweep: give --export")
    sweep(f.export, f.name, f.world, [int(m) for m in f.multiples or ["1", "4", "16"]], n=f.n,
          temperature=f.temperature, eval_seed=f.eval_seed, out_dir=f.out_dir or os.path.join("runs", "toy_sweep", f.name))
  elif command == "errors":
    text = errors_markdown(error_rows(f.workdir, f.stage, f.eval_seed, f.world), f.stage)
    print(text)
    if f.out:
      with open(f.out, "w") as out:
        out.write(text)
  elif command == "variants":
    lengths = {toy.TRAIN_TOKENS * int(m) for m in f.multiples}
    policies = {label: policy_rows(prefix, f.world, f.eval_seed, lengths)
                for label, prefix in policy_prefixes(f.policy).items()}
    write_variants(policies, said, f.out)
  else:
    policies = {label: policy_hazards(prefix, toy.TRAIN_TOKENS * f.multiple, f.world, f.eval_seed)
                for label, prefix in policy_prefixes(f.policy).items()}
    write_hazards(policies, f.multiple, said, f.out)


if __name__ == "__main__":
  define_flags()
  app.run(main)
