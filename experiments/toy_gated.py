"""Gated against overwrite memory on the toy lookup world: the same recipe (warm start from the committed
base, then RL) with each memory, in training seeds 0 and 1; RL-MemAgent's accuracy, decoded tokens,
chunks read and seconds per document at every length, one table and plot.

  python -m experiments.toy_gated                # make gated: the full recipe (each run about as long as make reproduce)
  python -m experiments.toy_gated --scale=demo   # the demo recipe (16 RL steps, 1x..16x): minutes per run
  python -m experiments.toy_gated --dry_run      # the commands only

Each run is `experiments.toy_reproduction --world=lookup --memory=<overwrite|gated> --seed=<s>` in its own
workdir (resumable: a finished run is not run again). The gated runs' warm start imitates a teacher that
replies <keep> on chunks without the asked key, and their memory turns run only the rows still decoding
(agent.decode_buckets=3). Output: docs/results/toy_gated[_demo].{md,json,png}.

At full scale the overwrite runs are make reproduce's recipe itself: seed s is make seeds' run of seed s
(seed 0: make reproduce's), reused from its workdir or committed record when it is of the current recipe
(experiments/toy_seeds.finished_run), not run again. A finished gated run's RL rows are recorded in
docs/results/toy_gated/<run>.json with their recipe digest (to be committed), so the runs (each about as long as
make reproduce) may finish on different days or machines; a record of another recipe counts for nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from experiments import toy_analysis, toy_report, toy_seeds
from memagent_jax.evaluation.length_sweep import SweepRow
from memagent_jax.data import toy
from memagent_jax.evaluation.memory_errors import KINDS  # missed_update, distractor_overwrite, copy_corruption, answer
from memagent_jax.runtime.atomic_io import atomic_write, save_figure

MEMORIES = ("overwrite", "gated")
FINISHED = "docs/results/toy_gated"  # each finished full-scale gated run's record, committed
FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags, defined when run as a script only (tests import this module)."""
  flags.DEFINE_enum("scale", "full", ["full", "demo"], "the toy recipe's scale (toy_reproduction --scale)")
  flags.DEFINE_list("seeds", ["0", "1"], "training seeds")
  flags.DEFINE_string("root", None, "directory of the runs (default runs/toy_gated_<scale>)")
  flags.DEFINE_string("out", None, "table + plot path stem (default docs/results/toy_gated[_demo])")
  flags.DEFINE_bool("dry_run", False, "print the commands, run nothing")
  flags.DEFINE_list("only", [], "run only these runs (workdir names: overwrite_seed0, gated_seed0, ...); the table "
                    "still holds every finished run")


def runs(root: str, seeds: list[int], scale: str = "full") -> list[dict]:
  """One run per (seed, memory): label, workdir, seed, memory; at full scale an overwrite run names the make
  seeds run it is (`seeds_run`), where make seeds has that seed."""
  by_seed = {r["seed"]: r for r in toy_seeds.runs("runs/toy_seeds_lookup") if not r["perturb"]
             and r.get("host_devices", 1) == 1}
  out = []
  for seed in seeds:
    for memory in MEMORIES:
      run = dict(label=f"{memory}, seed {seed}", workdir=os.path.join(root, f"{memory}_seed{seed}"), seed=seed,
                 memory=memory)
      if scale == "full" and memory == "overwrite" and seed in by_seed:
        run["seeds_run"] = by_seed[seed]
      out.append(run)
  return out


def command(run: dict, scale: str) -> list[str]:
  """A run as a toy_reproduction command: warm start and RL trained (or resumed), RL swept."""
  if "seeds_run" in run:
    return toy_seeds.command(run["seeds_run"])
  return [sys.executable, "-m", "experiments.toy_reproduction", f"--scale={scale}", "--world=lookup",
          "--base=experiments/data/toy_base_lookup", "--stages=warm_start,rl,eval", "--eval_methods=rl",
          f"--memory={run['memory']}", f"--seed={run['seed']}", f"--workdir={run['workdir']}",
          f"--results_dir={os.path.join(run['workdir'], 'results')}"]


def result_path(run: dict, scale: str) -> str:
  return os.path.join(run["workdir"], "results", toy_report.report_name(scale, "lookup") + ".json")


def record_path(run: dict, finished: str = FINISHED) -> str:
  return os.path.join(finished, os.path.basename(os.path.normpath(run["workdir"])) + ".json")


def run_recipe(run: dict, scale: str) -> str:
  """The recipe digest a result of this run must carry (toy_report.recipe)."""
  return toy_report.recipe(toy_report.ToyRun(scale=scale, root="", world="lookup", n=200, max_multiple=256,
                                             memory=run["memory"]))


def finished_rows(run: dict, scale: str, finished: str = FINISHED) -> tuple[list[SweepRow], float | None] | None:
  """A finished run's RL rows by length and its minutes, else None: a make seeds run where the run is one, else
  its workdir's result or (full scale) its committed record, of the current recipe."""
  if "seeds_run" in run:
    done = toy_seeds.finished_run(run["seeds_run"], toy_seeds.FINISHED)
    return None if done is None else (done["rows"], done["minutes"])
  paths = [result_path(run, scale)] + ([record_path(run, finished)] if scale == "full" else [])
  found = toy_report.finished_rl_rows(paths, run_recipe(run, scale))
  return None if found is None else (found[0], found[1].get("minutes"))


def first_errors(workdir: str) -> dict[str, dict] | None:
  """Per length, how the wrong documents of a run's RL sweep first went wrong (experiments/toy_analysis.py
  errors: the first wrong memory's kind, or the answer), from its per-document answers; None without them."""
  prefix = os.path.join(workdir, "eval", "rl")
  try:
    rows = toy_analysis.prefix_rows(prefix, toy_report.ToyRun.eval_seed, "lookup")
  except FileNotFoundError:
    return None
  return {str(r["length"]): {"wrong": r["wrong"], **{k: r[k] for k in KINDS}} for r in rows}


def run_errors(run: dict, finished: str = FINISHED) -> dict[str, dict] | None:
  """A run's first errors: from its committed record (computed once, when it finished), else from its workdir's
  per-document answers (a make seeds run's; a record of an earlier version without them)."""
  if "seeds_run" not in run and os.path.exists(record_path(run, finished)):
    recorded = json.load(open(record_path(run, finished))).get("first_errors")
    if recorded is not None:
      return recorded
  return first_errors(run["seeds_run"]["workdir"] if "seeds_run" in run else run["workdir"])


def keep_record(run: dict, scale: str, command_line: str, minutes: float, finished: str = FINISHED):
  """A finished full-scale run's RL rows, recipe, this command's minutes and the commit, to be committed."""
  rows, _ = finished_rows(run, scale, finished)
  os.makedirs(finished, exist_ok=True)
  with atomic_write(record_path(run, finished)) as f:
    json.dump({"label": run["label"], "seed": run["seed"], "memory": run["memory"], "command": command_line,
               "minutes": minutes, "commit": toy_report.current_commit(), "cpu_cores": os.cpu_count(),
               "recipe": run_recipe(run, scale), "rows": [r.to_json() for r in rows],
               "first_errors": first_errors(run["workdir"])}, f, indent=1)


def _cost(row: SweepRow, key: str) -> float:
  return float(row.reading.get(key, float("nan")))


def _gated_seeds(errors: dict[tuple[int, str], dict[str, dict] | None]) -> list[int]:
  """The seeds whose gated run has first errors."""
  return sorted({seed for (seed, memory), e in errors.items() if memory == "gated" and e})


def errors_markdown(errors: dict[tuple[int, str], dict[str, dict] | None]) -> list[str]:
  """Where gating loses: per seed and length, the wrong documents of each memory by their first error."""
  seeds = _gated_seeds(errors)
  if not seeds:
    return []
  lines = ["## Where gating loses", "",
           "Each wrong document by its first error (experiments/toy_analysis.py errors, from the sweep's "
           "per-document memories): **missed update**, the chunk with the asked key's (latest) fact left the "
           "memory without it (a gated turn that kept, or a write that dropped it); **distractor overwrite**, a "
           "chunk with another key's fact put that fact in its place; **copy corruption**, a chunk with nothing "
           "asked about spoiled a right memory; **answer**, the final memory was right and the answer not. "
           "Overwrite / gated; - where the run's per-document answers are not kept (a make seeds run whose "
           "workdir is gone).", "",
           "| seed | length | wrong | " + " | ".join(k.replace("_", " ") for k in KINDS) + " |",
           "|---|---|---|" + "---|" * len(KINDS)]
  for seed in seeds:
    ow, gt = errors.get((seed, "overwrite")), errors[(seed, "gated")]
    for length in sorted(gt, key=int):
      cell = lambda key: (f"{ow[length][key]}" if ow and length in ow else "-") + f" / {gt[length][key]}"
      lines.append(f"| {seed} | {length} ({int(length) // toy.TRAIN_TOKENS}x) | {cell('wrong')} | "
                   + " | ".join(cell(k) for k in KINDS) + " |")
  sentence = loss_sentence(errors)
  return ["", *lines, *(["", sentence] if sentence else [])]


def loss_sentence(errors: dict[tuple[int, str], dict[str, dict] | None]) -> str:
  """How gated's wrong documents at the longest length first went wrong, per seed ('' without errors)."""
  seeds = _gated_seeds(errors)
  if not seeds:
    return ""
  longest = max(int(length) for length in errors[(seeds[-1], "gated")])
  said = []
  for seed in seeds:
    e = errors[(seed, "gated")].get(str(longest))
    if e and e["wrong"]:
      top = max(KINDS, key=lambda k: e[k])
      said.append(f"seed {seed}: {e[top]} of its {e['wrong']} wrong documents first went wrong at a "
                  f"{top.replace('_', ' ')}, {e['missed_update']} at a missed update")
  return f"At the longest length ({longest} tokens), gated " + "; ".join(said) + "." if said else ""


def gated_rl_signals(scale: str) -> str:
  """The gated RL stage's training signals, as its config sets them (configs/toy_memagent.py)."""
  from configs import toy_memagent
  rl = toy_memagent.get_config(f"rl,{scale},lookup,gated").rl
  terms = ", ".join(f"{name} x {w:g}" + (" (+1 on a turn that writes from a chunk holding the answer or keeps past "
                                          "a chunk without it, -1 on the other two)" if name == "evidence" else "")
                    for name, w in sorted(rl.gate_rewards.items()) if w)
  mode = (f"advantages {rl.advantage_mode}, turn weight {rl.turn_advantage_weight:g}"
          if rl.advantage_mode == "turn_mix" else f"advantages {rl.advantage_mode}")
  sampling = (" Dynamic sampling keeps a group whose answers all scored the same when its gate terms differ."
              if terms and rl.dynamic_sampling and rl.dynamic_sampling_filter == "score_or_gates" else "")
  return (f"Its RL adds gate terms to the final reward (rl/gate_signals.py): {terms}; {mode}.{sampling}" if terms
          else f"Its RL has the final reward alone; {mode}.")


def markdown(results: list[tuple[dict, list[SweepRow], float | None]], commands: list[str], scale: str,
             plot_name: str, errors: dict[tuple[int, str], dict[str, dict] | None] | None = None) -> str:
  """The finished runs side by side: per seed and length, overwrite against gated."""
  lines = ["| seed | length (x training) | overwrite acc % | gated acc % | decoded tokens / doc, overwrite | gated "
           "| chunks read / doc, overwrite | gated | s / doc, overwrite | gated | gated keep share |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  by = {(run["seed"], run["memory"]): rows for run, rows, _ in results}
  for seed in sorted({run["seed"] for run, _, _ in results}):
    ow, gt = by.get((seed, "overwrite")), by.get((seed, "gated"))
    for i, length in enumerate(r.length for r in (ow or gt)):
      pair = (ow[i] if ow else None, gt[i] if gt else None)
      cells = lambda f: [("-" if r is None else f(r)) for r in pair]
      tokens = cells(lambda r: f"{_cost(r, 'decoded_tokens_per_doc'):.1f}")
      chunks = cells(lambda r: f"{_cost(r, 'chunks_per_doc'):.1f}")
      seconds = cells(lambda r: f"{r.seconds_per_doc:.4f}")
      keep = "-" if pair[1] is None else f"{100 * _cost(pair[1], 'keep_frac'):.0f}%"
      lines.append(f"| {seed} | {length} ({length // (ow or gt)[0].length}x) | "
                   + " | ".join([*cells(toy_report.acc_cell), *tokens, *chunks, *seconds, keep]) + " |")
  minutes = [f"{run['label']}: {m:.1f} min" for run, _, m in results if m is not None]
  return "\n".join([
      f"# Gated against overwrite memory, toy lookup world ({scale})", "",
      f"Command: `python -m experiments.toy_gated --scale={scale}`" + (" (make gated)" if scale == "full" else "")
      + ". Each run is one toy_reproduction command (below): the warm start from the committed base, then RL, "
      "then RL-MemAgent swept at n documents per length (evaluation seed 1000, temperature 0.7, top-p 0.95; "
      "accuracy in % with a 95% Wilson interval). Gated: a memory turn may reply `<keep>` (the memory stays); "
      "its warm start's teacher does so on chunks without the asked key, and its memory turns run only the rows "
      f"still decoding (agent.decode_buckets = 3). {gated_rl_signals(scale)} Decoded tokens: memory turns and the "
      "answer. Seconds: wall "
      "time of the batched evaluation / n on 2 CPU cores, which two sweeps and other work may share (a run's "
      "seconds are not comparable across runs; docs/results/bench_compaction.md times row compaction alone, side by "
      "side in one process).",
      *([] if not any("seeds_run" in run for run, _, _ in results) else [
          "", "The overwrite runs are make reproduce's recipe itself: make seeds' runs of the same seeds (seed 0 is "
          "make reproduce's; docs/results/toy_reproduction_seeds.md), reused, not run again; their wall time is "
          "that of the command that finished them (make reproduce's sweeps every method)."]),
      "", *[f"    {c}" for c in commands], "", *lines, "",
      "Wall time per run, of the command that finished it (a run stopped and resumed counts its last command "
      "only): " + ("; ".join(minutes) if minutes else "-") + ".", "",
      f"![gated against overwrite]({plot_name})", *errors_markdown(errors or {}), ""])


def plot(results, path: str):
  """Accuracy, decoded tokens per document and seconds per document against length, one line per run."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import ScalarFormatter
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
  for run, rows, _ in results:
    x = np.array([r.length / rows[0].length for r in rows])
    style = "o-" if run["memory"] == "gated" else "s--"
    line, = axes[0].plot(x, [100 * r.accuracy for r in rows], style, label=run["label"])
    axes[0].fill_between(x, [100 * r.ci_low for r in rows], [100 * r.ci_high for r in rows], color=line.get_color(),
                         alpha=0.12)
    axes[1].plot(x, [_cost(r, "decoded_tokens_per_doc") for r in rows], style, color=line.get_color())
    axes[2].plot(x, [r.seconds_per_doc for r in rows], style, color=line.get_color())
  for ax, label in zip(axes, ("accuracy % (95% Wilson interval)", "decoded tokens / document", "seconds / document")):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("document length / training length")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
  for ax in axes[1:]:
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=7)
  axes[0].legend(fontsize=8, loc="lower left")
  fig.suptitle("RL-MemAgent, toy lookup world: gated (keep form) against overwrite memory")
  save_figure(fig, path)
  plt.close(fig)


def write_table(todo: list[dict], commands: list[str], scale: str, out: str):
  results = [(run, *done) for run in todo if (done := finished_rows(run, scale)) is not None]
  if not results:
    return
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  errors = {(run["seed"], run["memory"]): run_errors(run) for run, _, _ in results}
  with atomic_write(out + ".md") as f:
    f.write(markdown(results, commands, scale, os.path.basename(out) + ".png", errors))
  with atomic_write(out + ".json") as f:
    json.dump({"scale": scale, "commit": toy_report.current_commit(), "where_gating_loses": loss_sentence(errors),
               "runs": [{"label": run["label"], "seed": run["seed"], "memory": run["memory"], "minutes": minutes,
                         "rows": [r.to_json() for r in rows]} for run, rows, minutes in results]}, f, indent=1)
  plot(results, out + ".png")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  scale = FLAGS.scale
  root = FLAGS.root or f"runs/toy_gated_{scale}"
  out = FLAGS.out or ("docs/results/toy_gated" + ("" if scale == "full" else f"_{scale}"))
  todo = runs(root, [int(s) for s in FLAGS.seeds], scale)
  commands = [shlex.join(["python", *command(run, scale)[1:]]) for run in todo]
  if FLAGS.dry_run:
    print("\n".join(commands))
    return
  names = [os.path.basename(os.path.normpath(run["workdir"])) for run in todo]
  unknown = sorted(set(FLAGS.only) - set(names))
  if unknown:
    raise app.UsageError(f"--only={','.join(FLAGS.only)}: no run named {', '.join(unknown)} (runs: {', '.join(names)})")
  for run, cmd, name in zip(todo, commands, names):
    if finished_rows(run, scale) is None and (not FLAGS.only or name in FLAGS.only):
      print(f"\n==== {run['label']}: {cmd}", flush=True)
      t0 = time.perf_counter()
      subprocess.run(command(run, scale), check=True)
      minutes = (time.perf_counter() - t0) / 60
      print(f"==== {run['label']}: {minutes:.1f} min", flush=True)
      if "seeds_run" in run:
        toy_seeds.keep_record(run["seeds_run"], cmd, minutes, toy_seeds.FINISHED)
      elif scale == "full":
        keep_record(run, scale, cmd, minutes)
    write_table(todo, commands, scale, out)  # after every run: a stopped command leaves the runs it finished
  print(f"\nTable: {out}.md\nPlot:  {out}.png" + (f"\nCommit the runs' records: {FINISHED}/" if scale == "full" else ""))


if __name__ == "__main__":
  define_flags()
  app.run(main)
