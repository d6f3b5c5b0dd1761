"""Helpers of the fault and resume tests (test_save_faults.py): the tiny run's
command line, its environment, stopping a run at a chosen point, and what a stopped and resumed
run must look like. Their runs share one configuration (RUN_FLAGS; the two-process script sets the
same RUN_OVERRIDES), so after a test's first run the persistent compile cache (the session's, from
tests/conftest.py, or the two-process test's own) holds every program: a later run, or a restart,
compiles nothing and costs its start-up (tracing) and its steps."""

import json
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from memagent_jax.runtime import checkpointing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# configs/toy_cpu.py:tiny with an entropy bonus, so params move on every step (the random policy scores 0
# on most steps: its zero advantages alone leave them where they started, and the bit-exact comparisons
# would compare starting params), one mini-batch per step (half the update programs to compile), and
# a CLI override that every checkpoint must record (clip_high)
RUN_OVERRIDES = {"rl.clip_high": 0.31, "rl.entropy_coef": 0.05, "rl.ppo_mini_batch": 4}
RUN_FLAGS = ["--config=configs/toy_cpu.py:tiny", *(f"--config.{k}={v}" for k, v in RUN_OVERRIDES.items())]

STOP_LINE = re.compile(r"train: preempted at step (\d+); checkpoint saved in (\S+); run the same command to resume")


def train_cmd(workdir, steps, save_every=1) -> list[str]:
  return [sys.executable, "-m", "experiments.train", *RUN_FLAGS, f"--workdir={workdir}",
          f"--config.train.steps={steps}", f"--config.train.save_every={save_every}"]


def cache_env(**extra) -> dict:
  """A CLI run's environment: conftest's compile cache, shared by every run of the session (a restart
  compiles nothing: the same programs; the resume under test is the state's), every program cached."""
  return dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=os.environ["MEMAGENT_TEST_XLA_CACHE"],
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
              **extra)


def leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def metric_steps(workdir) -> list[int]:
  """The steps of the complete lines of <workdir>/logs/metrics.jsonl (a line being written is left out)."""
  path = os.path.join(workdir, "logs", "metrics.jsonl")
  steps = []
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
          pass
  return steps


def signal_after_step(proc, workdir, signum, *, after: int = 0, since: float, timeout=300) -> float:
  """Waits until the run `proc` (started at time.time() `since`) logged a step past `after`, then sends
  `signum`; returns when it was sent. Lines an earlier, killed run left past its checkpoint do not count:
  the run drops them when it resumes (a write after `since`) and logs those steps again."""
  metrics = os.path.join(workdir, "logs", "metrics.jsonl")
  deadline = time.monotonic() + timeout
  while not (os.path.exists(metrics) and os.stat(metrics).st_mtime > since
             and any(s > after for s in metric_steps(workdir))):
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      pytest.fail(f"the run ended or stalled before logging a step past {after}: {proc.communicate()[1][-3000:]}")
    time.sleep(0.05)
  proc.send_signal(signum)
  return time.monotonic()


def stopped(proc, sent: float, workdir, exit_code: int, steps: int) -> int:
  """Checks a signalled CLI run: the exit code, within 30 s, one stderr line naming the step and
  the checkpoint directory, that step saved, the workdir lock released; returns the step."""
  try:
    _, stderr = proc.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    proc.kill()
    pytest.fail(f"no exit within 60 s of the signal: {proc.communicate()[1][-3000:]}")
  took = time.monotonic() - sent
  assert proc.returncode == exit_code, stderr[-3000:]
  assert took < 30, took
  stops = [m for m in map(STOP_LINE.fullmatch, stderr.strip().splitlines()) if m]
  assert len(stops) == 1 and STOP_LINE.fullmatch(stderr.strip().splitlines()[-1]), stderr[-3000:]
  step, directory = int(stops[0][1]), stops[0][2]
  assert directory == str(workdir / "checkpoints") and 1 <= step < steps
  assert checkpointing.Checkpointer(directory).latest_step() == step
  assert not (workdir / "run.lock").exists()
  return step


_TIMING = ("seconds", "per_s", "perf/")  # metrics of how fast, not what, a step computed


def assert_resumed_exactly(ref_dir, run_dir, steps: int):
  """The interrupted-then-resumed run in run_dir ended exactly as the uninterrupted one in ref_dir:
  final checkpoint bit for bit (params that moved), data position, final-step metrics, every step
  logged once."""
  ref, ref_meta = checkpointing.Checkpointer(str(ref_dir / "checkpoints")).restore()
  got, meta = checkpointing.Checkpointer(str(run_dir / "checkpoints")).restore()
  assert ref_meta["step"] == meta["step"] == steps
  for name in ("params", "opt_state", "rng"):
    for x, y in zip(leaves(ref[name]), leaves(got[name])):
      assert np.array_equal(x, y), name  # bit for bit
  assert meta["data_state"] == ref_meta["data_state"]
  assert meta["config"] and json.loads(meta["config"])["rl"]["clip_high"] == 0.31  # the CLI override
  ref_lines, lines = ([json.loads(l) for l in open(d / "logs" / "metrics.jsonl")] for d in (ref_dir, run_dir))
  assert [l["step"] for l in lines] == list(range(1, steps + 1))  # re-run steps are not logged twice
  untimed = lambda line: {k: v for k, v in line.items() if not any(t in k for t in _TIMING)}  # noqa: E731
  assert untimed(lines[-1]) == untimed(ref_lines[-1])
