"""One workdir, one run: a live holder refuses a second run (naming its host, pid and start time),
a lock left by a dead process or a reused pid is taken over with a warning, and a release removes
only our own lock."""

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from memagent_jax.runtime import workdir_lock
from memagent_jax.runtime.workdir_lock import WorkdirLock, WorkdirLockedError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLD = textwrap.dedent("""
    import sys, time
    from memagent_jax.runtime.workdir_lock import WorkdirLock
    lock = WorkdirLock(sys.argv[1]).acquire()  # held while the object lives
    print("held", flush=True)
    time.sleep(120)
""")


@pytest.fixture
def holder(tmp_path):
  """A live process of this host holding tmp_path/run; killed (not released) at the end."""
  proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], cwd=REPO, stdout=subprocess.PIPE,
                          text=True, env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  try:
    assert proc.stdout.readline().strip() == "held"
    yield proc
  finally:
    proc.kill()
    proc.wait()


def _lock_file(workdir) -> dict:
  with open(os.path.join(workdir, workdir_lock.LOCK_NAME)) as f:
    return json.load(f)


def _write_lock(workdir, **holder):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, workdir_lock.LOCK_NAME), "w") as f:
    json.dump(holder, f)


def _dead_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()  # reaped: the pid is gone
  return proc.pid


def test_live_holder_is_refused_with_its_host_pid_and_start_time(tmp_path, holder, caplog):
  workdir = tmp_path / "run"
  held = _lock_file(workdir)
  assert held["pid"] == holder.pid and held["host"] == socket.gethostname() and held["start_time"]
  with pytest.raises(WorkdirLockedError) as e:
    WorkdirLock(str(workdir)).acquire()
  msg = str(e.value)
  for part in (f"host {socket.gethostname()}", f"pid {holder.pid}", f"started {held['start_time']}",
               str(workdir), "delete " + str(workdir / "run.lock")):
    assert part in msg, (part, msg)
  assert _lock_file(workdir) == held  # untouched
  holder.kill()  # the holder dies without releasing: its lock is taken over with one warning
  holder.wait()
  with caplog.at_level(logging.WARNING):
    lock = WorkdirLock(str(workdir)).acquire()
  assert _lock_file(workdir)["pid"] == os.getpid()
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1 and "gone" in warnings[0] and f"pid {holder.pid}" in warnings[0], warnings
  lock.release()
  assert not (workdir / "run.lock").exists()


def test_train_script_refuses_a_held_workdir(tmp_path, holder):
  """The CLI fails in one line (exit 2) before it reads or writes anything in the workdir."""
  cmd = [sys.executable, "-m", "experiments.train", "--config=configs/toy_cpu.py:tiny", f"--workdir={tmp_path / 'run'}"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2, out.stderr[-2000:]
  line = out.stderr.strip().splitlines()[-1]
  assert line.startswith("train: error: workdir ") and f"pid {holder.pid}" in line, line
  assert sorted(os.listdir(tmp_path / "run")) == ["run.lock"]  # no logs, no checkpoints


def test_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
  pid = _dead_pid()
  _write_lock(tmp_path, host=socket.gethostname(), pid=pid, start_time="2024-01-01T00:00:00+00:00",
              proc_start=None, token="x")
  with caplog.at_level(logging.WARNING):
    lock = WorkdirLock(str(tmp_path)).acquire()
  assert lock.held and _lock_file(tmp_path)["pid"] == os.getpid()
  assert any(f"pid {pid}" in r.getMessage() and "2024-01-01" in r.getMessage() for r in caplog.records)
  lock.release()
  assert not (tmp_path / "run.lock").exists()


def test_a_reused_pid_is_not_the_holder(tmp_path):
  """The pid runs, but it started at another time than the lock's holder: a restarted container or
  a recycled pid, not the run that took the lock."""
  parent = os.getppid()
  start = workdir_lock._proc_stat(parent)
  if start is None:
    pytest.skip("no /proc: process start times are unknown")
  _write_lock(tmp_path, host=socket.gethostname(), pid=parent, start_time="t", proc_start=start[1] + 1, token="x")
  WorkdirLock(str(tmp_path)).acquire().release()
  _write_lock(tmp_path, host=socket.gethostname(), pid=parent, start_time="t", proc_start=start[1], token="x")
  with pytest.raises(WorkdirLockedError, match=f"pid {parent}"):
    WorkdirLock(str(tmp_path)).acquire()


def test_another_hosts_lock_is_never_taken_over(tmp_path):
  _write_lock(tmp_path, host="tpu-vm-7", pid=_dead_pid(), start_time="2024-05-01T12:00:00+00:00", token="x")
  with pytest.raises(WorkdirLockedError, match=r"host tpu-vm-7, pid \d+, started 2024-05-01T12:00:00"):
    WorkdirLock(str(tmp_path)).acquire()


def test_release_removes_only_our_lock_and_acquire_is_reentrant(tmp_path):
  lock = WorkdirLock(str(tmp_path / "new")).acquire()  # creates the workdir
  first = _lock_file(tmp_path / "new")
  assert lock.acquire() is lock and _lock_file(tmp_path / "new") == first  # held: a no-op
  lock.release()
  lock.release()  # twice: nothing more
  assert not (tmp_path / "new" / "run.lock").exists()
  lock.acquire()
  _write_lock(tmp_path / "new", host="elsewhere", pid=1, start_time="t", token="theirs")  # replaced by hand
  lock.release()
  assert _lock_file(tmp_path / "new")["token"] == "theirs"


def test_an_unreleased_lock_of_this_process_is_taken_over(tmp_path, caplog):
  """A notebook that builds a second Trainer on a workdir an earlier, untrained one holds."""
  first = WorkdirLock(str(tmp_path)).acquire()
  with caplog.at_level(logging.WARNING):
    second = WorkdirLock(str(tmp_path)).acquire()
  assert "this process" in caplog.text
  first.release()  # not its lock any more
  assert _lock_file(tmp_path)["token"] and second.held
  second.release()
  assert not (tmp_path / "run.lock").exists()
