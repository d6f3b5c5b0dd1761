"""Is the toy recipe robust or lucky? make reproduce's recipe with training seeds 0, 1, 2, once
more from a warm start perturbed at float rounding's size, and seed 0 once more on another float path
(two host devices: every batch split over a data axis of 2); RL-MemAgent's curve of each, one table.

  python -m experiments.toy_seeds            # make seeds: each run 20-25 min on 2 cores, resumable
  python -m experiments.toy_seeds --dry_run  # the commands only
  python -m experiments.toy_seeds --only=seed1,seed2  # some runs only

Seed 0 is make reproduce's own run (runs/toy_full_lookup when it is there, else its committed result
docs/results/toy_reproduction_lookup.json); the perturbed run starts from a copy of seed 0's warm start,
every weight times 1 + 1e-6 N(0, 1). Each run sweeps only RL (n = 200, 1x..256x). A finished run's record
(its RL rows, minutes, commit and recipe digest, toy_report.recipe) is written to
docs/results/toy_seeds/<run>.json, to be committed: a run of the current recipe recorded there is not run
again, on this machine or another, so the five runs (20-25 min each on 2 cores) may finish on different
days; a record of another recipe counts for nothing. The table is rewritten after every run, with the runs finished so far:
docs/results/toy_reproduction_seeds.{md,json,png}.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from configs import toy_memagent
from experiments import toy_report
from memagent_jax.evaluation.length_sweep import SweepRow
from memagent_jax.runtime.atomic_io import atomic_write, save_figure

REPRODUCE_ROOT = "runs/toy_full_lookup"  # make reproduce's workdir: seed 0
REPRODUCE_RESULT = "docs/results/toy_reproduction_lookup.json"  # make reproduce's committed result: seed 0 too
FINISHED = "docs/results/toy_seeds"  # each finished run's record, committed
PERTURB = 1e-6
TOLERANCE = 5.0  # points: each run's accuracy at every length within this of its own 1x (issue 34)

FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags, defined when run as a script only: tests import this module beside
  other scripts' flags of the same names (--out, --root, --dry_run)."""
  flags.DEFINE_string("root", "runs/toy_seeds_lookup", "directory of the seed-1, seed-2 and perturbed runs")
  flags.DEFINE_string("out", "docs/results/toy_reproduction_seeds", "table + plot path stem")
  flags.DEFINE_bool("dry_run", False, "print the commands, run nothing")
  flags.DEFINE_bool("table_only", False, "rewrite the table from the finished runs (after a recipe change: of "
                    "none), run nothing")
  flags.DEFINE_list("only", [], "run only these runs (workdir names: toy_full_lookup, perturbed, seed1, seed2, "
                    "two_devices); the table still holds every finished run")


def runs(root: str) -> list[dict]:
  """The five runs: label, workdir, seed, perturbation (and forced host devices, where not 1)."""
  return [dict(label="seed 0 (make reproduce)", workdir=REPRODUCE_ROOT, seed=0, perturb=0.0),
          dict(label=f"seed 0, warm start x (1 + {PERTURB:g} N(0, 1))", workdir=os.path.join(root, "perturbed"),
               seed=0, perturb=PERTURB),
          dict(label="seed 1", workdir=os.path.join(root, "seed1"), seed=1, perturb=0.0),
          dict(label="seed 2", workdir=os.path.join(root, "seed2"), seed=2, perturb=0.0),
          dict(label="seed 0 on two host devices (data axis 2)", workdir=os.path.join(root, "two_devices"),
               seed=0, perturb=0.0, host_devices=2)]


def command(run: dict) -> list[str]:
  """One run as a toy_reproduction command: warm start and RL trained (or resumed), RL swept."""
  return [sys.executable, "-m", "experiments.toy_reproduction", "--scale=full", "--world=lookup",
          "--base=experiments/data/toy_base_lookup", "--stages=warm_start,rl,eval", "--eval_methods=rl",
          f"--workdir={run['workdir']}", f"--results_dir={os.path.join(run['workdir'], 'results')}",
          f"--seed={run['seed']}", f"--perturb={run['perturb']:g}"]


def run_environment(run: dict) -> dict[str, str]:
  """The run's process environment: forced host devices (another reduction order for every sum over
  the batch) where the run asks for them."""
  env = dict(os.environ)
  if run.get("host_devices", 1) > 1:
    flag = f"--xla_force_host_platform_device_count={run['host_devices']}"
    env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), flag) if f)
  return env


def shown_command(run: dict) -> str:
  """The run's command as a user would type it (environment first)."""
  prefix = [] if run.get("host_devices", 1) == 1 else [
      f"XLA_FLAGS=--xla_force_host_platform_device_count={run['host_devices']}"]
  return shlex.join([*prefix, "python", *command(run)[1:]])


def reuse_warm_start(run: dict):
  """The perturbed run perturbs seed 0's warm start: its trained stage directory is copied in (the
  run then resumes it at its last step), when seed 0 has one."""
  src, dst = os.path.join(REPRODUCE_ROOT, "warm_start"), os.path.join(run["workdir"], "warm_start")
  if run["perturb"] and os.path.isdir(os.path.join(src, "export")) and not os.path.isdir(dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("export_perturbed_*"))


def record_path(run: dict, finished: str = FINISHED) -> str:
  return os.path.join(finished, os.path.basename(os.path.normpath(run["workdir"])) + ".json")


def recipe_text() -> str:
  """The recipe in words, from its configs, and its digest."""
  ws, rl = (toy_memagent.get_config(f"{stage},full,lookup") for stage in ("warm_start", "rl"))
  return (f"warm start {ws.train.steps} steps; RL {rl.train.steps} steps on the data curriculum "
          f"`{rl.data.phases}` (configs/toy_memagent.LOOKUP_CURRICULUM), KL {rl.rl.kl_coef:g}; recipe "
          f"digest {toy_report.reproduce_recipe()}, toy_report.recipe")


def finished_run(run: dict, finished: str = FINISHED) -> dict | None:
  """A finished run of the current recipe: {rows: RL-MemAgent's rows by length, minutes, commit, source,
  recipe}, from its workdir's results, else its committed record (seed 0: make reproduce's committed
  result); None: not finished, or finished on another recipe (a result without a recipe is of an older one)."""
  paths = [os.path.join(run["workdir"], "results", toy_report.report_name("full", "lookup") + ".json"),
           record_path(run, finished)]
  if run["workdir"] == REPRODUCE_ROOT:
    paths.append(REPRODUCE_RESULT)
  current = toy_report.reproduce_recipe()
  found = toy_report.finished_rl_rows(paths, current)
  if found is None:
    return None
  rows, data, source = found
  return dict(rows=rows, minutes=data.get("minutes"), commit=data.get("commit"), source=source, recipe=current)


def keep_record(run: dict, command_line: str, minutes: float, finished: str = FINISHED):
  """The finished run's RL rows, this command's minutes for it and the commit, where it is committed from."""
  done = finished_run(run, finished)
  os.makedirs(finished, exist_ok=True)
  with atomic_write(record_path(run, finished)) as f:
    json.dump({"label": run["label"], "seed": run["seed"], "perturb": run["perturb"], "command": command_line,
               "minutes": minutes, "commit": toy_report.current_commit(), "cpu_cores": os.cpu_count(),
               "recipe": done["recipe"], "rows": [r.to_json() for r in done["rows"]]}, f, indent=1)


def verdict(rows: list[SweepRow]) -> tuple[float, bool]:
  """(largest drop below the run's own 1x accuracy in points, whether every length is within TOLERANCE)."""
  acc = np.array([100 * r.accuracy for r in rows])
  drop = float(np.max(acc[0] - acc))
  return drop, drop <= TOLERANCE


def markdown(results: list[tuple[dict, dict]], commands: list[str],
             plot_name: str = "toy_reproduction_seeds.png") -> str:
  """The finished runs' table (results: (run, finished_run(run)))."""
  lengths = [r.length for r in results[0][1]["rows"]]
  head = ("| run | " + " | ".join(f"{length // lengths[0]}x" for length in lengths)
          + " | largest drop below 1x (points) | within 5 points at every length | wall min | commit |")
  lines = [head, "|---|" + "---|" * (len(lengths) + 4)]
  for run, done in results:
    drop, ok = verdict(done["rows"])
    cells = [toy_report.acc_cell(r) for r in done["rows"]]
    wall = "-" if done["minutes"] is None else f"{done['minutes']:.1f}"
    lines.append(f"| {run['label']} | " + " | ".join(cells) + f" | {drop:.1f} | {'yes' if ok else '**no**'} | {wall} | "
                 f"{done['commit'] or '-'} |")
  return "\n".join([
      "# The toy recipe across seeds (lookup world, RL-MemAgent)", "",
      "Command: `python -m experiments.toy_seeds` (make seeds). Each run is make reproduce's recipe "
      f"({recipe_text()}) from the committed base, swept at n = 200 per length (evaluation seed 1000, "
      "temperature 0.7, top-p 0.95); "
      "accuracy in % with a 95% Wilson interval. Wall min: the minutes of the command that finished the run "
      "(a run resumed from its checkpoints counts only its last command), on 2 CPU cores that may have been "
      "shared with other work; commit: the tree it finished on. The runs:", "",
      *[f"    {c}" for c in commands], "", *lines, "",
      f"![RL-MemAgent across seeds]({plot_name})", ""])


def plot(results: list[tuple[dict, list[SweepRow]]], path: str):
  """Accuracy against length multiple, one line (with its interval) per run."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for run, rows in results:
    x = np.array([r.length / rows[0].length for r in rows])
    acc = np.array([100 * r.accuracy for r in rows])
    line, = ax.plot(x, acc, "o-", label=run["label"])
    ax.fill_between(x, [100 * r.ci_low for r in rows], [100 * r.ci_high for r in rows],
                    color=line.get_color(), alpha=0.12)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("document length / training length")
  ax.set_ylabel("accuracy % (95% Wilson interval)")
  ax.set_title(f"RL-MemAgent, toy lookup world: {len(results)} runs of one recipe")
  ax.legend(fontsize=8, loc="lower left")
  ax.grid(alpha=0.3)
  save_figure(fig, path)
  plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  todo = runs(FLAGS.root)
  commands = [shown_command(run) for run in todo]
  if FLAGS.table_only:
    write_table(todo, commands, FLAGS.out)
    return
  if FLAGS.dry_run:
    print("\n".join(commands))
    return
  names = [os.path.basename(os.path.normpath(run["workdir"])) for run in todo]
  unknown = sorted(set(FLAGS.only) - set(names))
  if unknown:
    raise app.UsageError(f"--only={','.join(FLAGS.only)}: no run named {', '.join(unknown)} "
                         f"(runs: {', '.join(names)})")
  for run, cmd, name in zip(todo, commands, names):
    if finished_run(run) is None and (not FLAGS.only or name in FLAGS.only):
      print(f"\n==== {run['label']}: {cmd}", flush=True)
      reuse_warm_start(run)
      t0 = time.perf_counter()
      subprocess.run(command(run), check=True, env=run_environment(run))
      keep_record(run, cmd, (time.perf_counter() - t0) / 60)
      write_table(todo, commands, FLAGS.out)  # after every run: a stopped command leaves the runs it finished
  write_table(todo, commands, FLAGS.out)
  print(f"\nTable: {FLAGS.out}.md\nPlot:  {FLAGS.out}.png\nCommit the runs' records: {FINISHED}/")


def write_table(todo: list[dict], commands: list[str], out: str, finished: str = FINISHED):
  """Table (out.md) and plot (out.png) of the finished runs, each with its verdict printed."""
  results = [(run, done) for run in todo if (done := finished_run(run, finished)) is not None]
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  if not results:  # e.g. just after a recipe change: no stale table of another recipe stays behind
    with atomic_write(out + ".json") as f:
      json.dump({"tolerance_points": TOLERANCE, "recipe": toy_report.reproduce_recipe(), "runs": [],
                 "not_run_yet": [run["label"] for run in todo]}, f, indent=1)
    with atomic_write(out + ".md") as f:
      f.write(f"# The toy recipe across seeds\n\nNo run of the current recipe ({recipe_text()}) has finished yet: "
              "`python -m experiments.toy_seeds`.\n")
    if os.path.exists(out + ".png"):
      os.remove(out + ".png")
    return
  with atomic_write(out + ".md") as f:
    f.write(markdown(results, commands, os.path.basename(out) + ".png"))
  with atomic_write(out + ".json") as f:  # what the README's sentence about seeds is generated from
    json.dump({"tolerance_points": TOLERANCE, "commit": toy_report.current_commit(),
               "recipe": toy_report.reproduce_recipe(),
               "not_run_yet": [run["label"] for run in todo if finished_run(run, finished) is None],
               "runs": [{"label": run["label"], "seed": run["seed"], "perturb": run["perturb"],
                         "minutes": done["minutes"], "commit": done["commit"],
                         "largest_drop_points": verdict(done["rows"])[0],
                         "accuracy": {str(r.length): r.accuracy for r in done["rows"]}}
                        for run, done in results]}, f, indent=1)
  plot([(run, done["rows"]) for run, done in results], out + ".png")
  for run, done in results:
    drop, ok = verdict(done["rows"])
    print(f"{run['label']}: largest drop below 1x {drop:.1f} points ({'within' if ok else 'OUTSIDE'} {TOLERANCE:g})",
          flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
