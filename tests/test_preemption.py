"""Stopping a CLI run mid-training, then running the same command again: a SIGKILL keeps the
committed checkpoints and the restart goes on from the newest; SIGTERM / SIGINT finish the step in
flight, save it and stop with one stderr line and exit 143 / 130 (`Preempted`), and the same
command resumes the run exactly. SIGINT to one of two processes: test_save_faults.py; a signal
inside a library call (`Preempted` raised in-process): test_trainer.py."""

import json
import signal
import subprocess
import time

import numpy as np
import pytest

from fault_runs import (REPO, assert_resumed_exactly, cache_env, committed_step, leaves, signal_after_step,
                        stopped, train_cmd)
from memagent_jax.runtime import checkpointing

STEPS = 8  # more than are run before each stop lands (a step takes about a second)


@pytest.mark.slow
def test_sigkill_then_sigterm_mid_run_and_the_same_command_resumes_bit_exact(tmp_path):
  """One run stopped twice and finished, against an uninterrupted one: SIGKILL once step 3 is
  committed, while later steps run (every step saved, asynchronously); then a command saving only
  when stopped (and at the end) resumes it, gets SIGTERM after a step, saves that step, exits 143 in
  one line; the same command finishes the run bit for bit as the uninterrupted one."""
  env = cache_env()
  ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "stopped"
  # the reference saves only its last step (what is compared): saving changes no step's result
  subprocess.run(train_cmd(ref_dir, STEPS, save_every=STEPS), cwd=REPO, env=env, check=True, capture_output=True,
                 timeout=600)

  proc = subprocess.Popen(train_cmd(run_dir, STEPS, save_every=1), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckpt_dir = str(run_dir / "checkpoints")
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:  # kill once step 3 is committed, while later steps run
    if committed_step(ckpt_dir) >= 3:
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  killed_at = checkpointing.Checkpointer(ckpt_dir).latest_step()
  assert killed_at is not None and 3 <= killed_at < STEPS, killed_at
  at_kill, _ = checkpointing.Checkpointer(ckpt_dir).restore()
  kept = (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()[:killed_at]
  assert [json.loads(line)["step"] for line in kept] == list(range(1, killed_at + 1))

  cmd = train_cmd(run_dir, STEPS, save_every=100)  # only the preemption and the last step save
  since = time.time()
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  sent = signal_after_step(proc, run_dir, signal.SIGTERM, after=killed_at, since=since)
  step = stopped(proc, sent, run_dir, exit_code=143, steps=STEPS)
  assert step > killed_at
  assert checkpointing.Checkpointer(ckpt_dir).all_steps() == [killed_at, step]  # the stop saved its step
  # resumed from the kill's checkpoint: the steps up to it were not run (nor logged) again
  assert (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()[:killed_at] == kept
  print(f"killed at step {killed_at}, SIGTERM stopped step {step}")  # reported, not asserted

  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout.strip().splitlines()[-1])["step"] == STEPS
  assert_resumed_exactly(ref_dir, run_dir, STEPS)
  final, _ = checkpointing.Checkpointer(ckpt_dir).restore()
  assert not all(np.array_equal(a, b) for a, b in zip(leaves(at_kill["params"]), leaves(final["params"])))
