"""Runs an ablation sweep (configs/sweeps/*.py) one run after another, or prints its commands,
then writes one summary table (markdown + CSV) of every run's final metrics.

  python -m experiments.sweep --sweep=configs/sweeps/clip_high.py --root=runs/sweep_clip_high
  python -m experiments.sweep --sweep=configs/sweeps/memory_size.py --dry_run
  python -m experiments.sweep --sweep=... --set=train.steps=5    # extra override for every run
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shlex
import subprocess
import sys
import time

from absl import app, flags

from memagent_jax.experiment import config_overrides
from memagent_jax.rl.metrics import read_jsonl
from memagent_jax.runtime.atomic_io import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the runs start here

_SWEEP = flags.DEFINE_string("sweep", None, "configs/sweeps/<name>.py")
_ROOT = flags.DEFINE_string("root", None, "directory of the runs (default runs/sweep_<name>)")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "print the commands, run nothing")
_SET = flags.DEFINE_multi_string("set", [], "KEY=VALUE override added to every run (e.g. train.steps=5)")

COLUMNS = ("train/reward_mean", "train/accuracy", "train/kept_group_frac", "train/memory_tokens",
           "train/grad_norm", "eval/score", "eval/verifier")
# under the table: which held-out score is which (evaluation.METRICS), so a validation score is not read as the paper's
SCORE_NOTE = ("eval/score: the task's headline score on the held-out set (QA: sub_em, the paper's accuracy; RULER: "
              "string_match_all; toy: exact match); eval/verifier: the training verifier (boxed exact match), not "
              "the paper's metric.")


def load_sweep(path: str) -> dict:
  if not os.path.isfile(path):
    raise SystemExit(f"sweep: no such sweep file: {path}")
  spec = importlib.util.spec_from_file_location("sweep_file", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  sweep = module.get_sweep()
  if not sweep.get("runs"):
    raise SystemExit(f"sweep: {path} lists no runs")
  return sweep


def check_sweep_keys(path: str, sweep: dict, extra: dict):
  """Every run's override keys and every --set key exist in the sweep's config: a mistyped key fails the
  sweep before its first run, naming the nearest valid key."""
  cfg = config_overrides.load_config_file(sweep["config"])
  for run, overrides in sweep["runs"].items():
    for key in overrides:
      try:
        config_overrides.check_key(cfg, key, flag="")
      except config_overrides.ConfigKeyError as e:
        raise config_overrides.ConfigKeyError(f"{path}, run {run!r}: {e}") from None
  for key in extra:
    config_overrides.check_key(cfg, key, flag="--set ")


def run_command(config: str, overrides: dict, workdir: str) -> list[str]:
  cmd = [sys.executable, "-m", "experiments.train", f"--config={config}", f"--workdir={workdir}"]
  return cmd + [f"--config.{k}={v}" for k, v in overrides.items()]


def summarize(name: str, workdir: str, seconds: float | None) -> dict:
  """Final value of each column (last logged step), plus the first and last mean reward."""
  path = os.path.join(workdir, "logs", "metrics.jsonl")
  row = {"run": name, "steps": 0, "seconds": "" if seconds is None else f"{seconds:.0f}"}
  if not os.path.exists(path):
    return row
  lines = read_jsonl(path)
  train = [l for l in lines if "train/reward_mean" in l]
  row["steps"] = max((l["step"] for l in lines), default=0)
  if train:
    k = max(1, len(train) // 5)  # first / last fifth of the run
    row["reward_first"] = sum(l["train/reward_mean"] for l in train[:k]) / k
    row["reward_last"] = sum(l["train/reward_mean"] for l in train[-k:]) / k
  for col in COLUMNS:
    vals = [l[col] for l in lines if col in l]
    if vals:
      row[col] = vals[-1]
  return row


def write_table(rows: list[dict], out_dir: str) -> str:
  cols = ["run", "steps", "seconds", "reward_first", "reward_last"] + list(COLUMNS)
  cols = [c for c in cols if any(c in r for r in rows)]
  fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
  md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  md += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
  if "eval/score" in cols:
    md += ["", SCORE_NOTE]
  os.makedirs(out_dir, exist_ok=True)
  with atomic_write(os.path.join(out_dir, "summary.md")) as f:
    f.write("\n".join(md) + "\n")
  with atomic_write(os.path.join(out_dir, "summary.csv"), newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
  return "\n".join(md)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  sweep = load_sweep(_SWEEP.value)
  name = os.path.splitext(os.path.basename(_SWEEP.value))[0]
  root = _ROOT.value or os.path.join("runs", f"sweep_{name}")
  extra = {}
  for item in _SET.value:
    if "=" not in item:
      raise app.UsageError(f"--set {item!r} must be KEY=VALUE")
    k, v = item.split("=", 1)
    extra[k] = v
  try:
    check_sweep_keys(_SWEEP.value, sweep, extra)
  except (config_overrides.ConfigKeyError, FileNotFoundError) as e:
    print(f"sweep: error: {e}", file=sys.stderr)
    sys.exit(2)
  rows = []
  for run, overrides in sweep["runs"].items():
    workdir = os.path.join(root, run)
    cmd = run_command(sweep["config"], {**overrides, **extra}, workdir)
    print(shlex.join(cmd), flush=True)
    seconds = None
    if not _DRY_RUN.value:
      t0 = time.perf_counter()
      rc = subprocess.call(cmd, cwd=ROOT)
      seconds = time.perf_counter() - t0
      if rc:
        raise SystemExit(f"sweep: run {run!r} failed with exit code {rc}; its log is in {workdir}")
    rows.append(summarize(run, workdir, seconds))
  if not _DRY_RUN.value:
    print(write_table(rows, root))
    print(f"summary: {os.path.join(root, 'summary.md')}")


if __name__ == "__main__":
  flags.mark_flag_as_required("sweep")
  app.run(main, flags_parser=config_overrides.absl_flags_parser("sweep"))
