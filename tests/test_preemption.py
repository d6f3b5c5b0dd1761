"""Preemption: SIGTERM / SIGINT during training finish the step in flight, save it, and stop with
`Preempted` (experiments.train: one stderr line, exit 143 / 130); the same command resumes
the run exactly; on two processes a signal to one of them stops both after the same step."""

import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from test_parallel import _clean_env, _free_port
from test_trainer import REPO, _assert_resumed_exactly, _cache_env, _leaves, _train_cmd, tiny
from memagent_jax.experiment import assembly
from memagent_jax.runtime import checkpointing
from memagent_jax.runtime.preemption import Preempted

STOP_LINE = re.compile(r"train: preempted at step (\d+); checkpoint saved in (\S+); run the same command to resume")
STEPS = 8  # far more than are run before the signal lands (a step takes well under a second)


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
  """One persistent compile cache for every CLI run of this module (the same programs)."""
  return tmp_path_factory.mktemp("xla_cache")


class _SignalDuringCollect:
  """A collector that signals its own process in the middle of its first rollout."""

  def __init__(self, collector, signum):
    self.inner, self.signum, self.sent = collector, signum, False

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def collect(self, *args, **kw):
    if not self.sent:
      self.sent = True
      os.kill(os.getpid(), self.signum)  # the handler runs at once: the step must still finish
    return self.inner.collect(*args, **kw)


def test_signal_mid_step_finishes_saves_and_raises_in_process(tmp_path):
  """A library user (a notebook) gets an exception, not a dead interpreter: Ctrl-C in the first
  step lets it finish, saves it, raises Preempted (exit code 130), puts the handlers back and
  frees the workdir, whose checkpoint a new trainer resumes from."""
  before = signal.getsignal(signal.SIGINT)
  t = assembly.build_trainer(tiny(**{"train.steps": 3, "train.save_every": 100}), workdir=str(tmp_path))
  t.collector = _SignalDuringCollect(t.collector, signal.SIGINT)
  with pytest.raises(Preempted) as e:
    t.train()
  assert (e.value.step, e.value.signum, e.value.exit_code) == (1, signal.SIGINT, 130)
  assert str(e.value) == (f"preempted at step 1; checkpoint saved in {tmp_path / 'checkpoints'}; "
                          "run the same command to resume")
  assert signal.getsignal(signal.SIGINT) is before
  assert not (tmp_path / "run.lock").exists()
  assert checkpointing.Checkpointer(str(tmp_path / "checkpoints")).all_steps() == [1]
  again = assembly.build_trainer(tiny(**{"train.steps": 3}), workdir=str(tmp_path))
  assert again.state.step == 1  # step 1 was applied whole and saved
  assert all(np.array_equal(a, b) for a, b in zip(_leaves(t.state.params), _leaves(again.state.params)))


def _signal_after_first_step(proc, workdir, signum, timeout=300) -> float:
  """Waits until the run logged its first step, then sends `signum`; returns when it was sent."""
  metrics = workdir / "logs" / "metrics.jsonl"
  deadline = time.monotonic() + timeout
  while not (metrics.exists() and metrics.stat().st_size):
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      pytest.fail(f"the run ended or stalled before its first step: {proc.communicate()[1][-3000:]}")
    time.sleep(0.05)
  proc.send_signal(signum)
  return time.monotonic()


def _stopped(proc, sent: float, workdir, exit_code: int) -> int:
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
  assert directory == str(workdir / "checkpoints") and 1 <= step < STEPS
  assert checkpointing.Checkpointer(directory).latest_step() == step
  assert not (workdir / "run.lock").exists()
  return step


@pytest.mark.slow
def test_sigterm_saves_exits_143_and_the_same_command_resumes_exactly(tmp_path, xla_cache):
  env = _cache_env(xla_cache)
  ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "preempted"
  subprocess.run(_train_cmd(ref_dir, STEPS, save_every=100), cwd=REPO, env=env, check=True, capture_output=True,
                 timeout=600)
  cmd = _train_cmd(run_dir, STEPS, save_every=100)  # only the preemption and the last step save
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  sent = _signal_after_first_step(proc, run_dir, signal.SIGTERM)
  step = _stopped(proc, sent, run_dir, exit_code=143)
  assert checkpointing.Checkpointer(str(run_dir / "checkpoints")).all_steps() == [step]
  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  _assert_resumed_exactly(ref_dir, run_dir, STEPS)


@pytest.mark.slow
def test_sigint_saves_and_exits_130(tmp_path, xla_cache):
  proc = subprocess.Popen(_train_cmd(tmp_path, STEPS, save_every=100), cwd=REPO, env=_cache_env(xla_cache),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  sent = _signal_after_first_step(proc, tmp_path, signal.SIGINT)
  _stopped(proc, sent, tmp_path, exit_code=130)


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(tmp_path):
  """jax.distributed on CPU, one device per process; only process 0 is signalled. Both processes
  agree on the flag before each step, so both save the same step (a complete checkpoint) and exit
  143; neither hangs in a collective the other left."""
  workdir, coord = tmp_path / "run", f"localhost:{_free_port()}"
  procs = []
  for pid in range(2):
    cmd = _train_cmd(workdir, STEPS, save_every=100) + [
        "--config.distributed.num_processes=2", f"--config.distributed.process_id={pid}",
        f"--config.distributed.coordinator_address={coord}"]
    env = _clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=1")  # the run's compile cache: _clean_env
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  try:
    sent = _signal_after_first_step(procs[0], workdir, signal.SIGTERM)  # process 0 alone writes metrics
    steps = [_stopped(p, sent, workdir, exit_code=143) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  assert steps[0] == steps[1]
  ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"))
  assert ckpt.all_steps() == [steps[0]]
  state, meta = ckpt.restore()  # complete: every array and the meta read back
  assert meta["step"] == int(state["step"]) == steps[0]
