"""Faults during a checkpoint write and preemption: a full disk (a real small tmpfs where the test may
mount one) stops the run with one line and exit 2, keeps the previous step readable, and resumes once
space is freed; one of two processes killed (SIGKILL) while orbax writes asynchronously leaves an
incomplete step that is never taken as complete; on the CLI restart SIGTERM to one of the two stops
both at the same step (exit 143, one line), and the next restart ends bit for bit as an uninterrupted
run (which is also the plain two-process save and resume test). SIGINT (exit 130) raised inside a
step: test_trainer.py."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types

import jax
import numpy as np
import pytest

from fault_runs import (RUN_OVERRIDES, assert_resumed_exactly, cache_env, metric_steps, signal_after_step, stopped,
                        train_cmd)
from test_parallel import REPO, _clean_env, _collect, _free_port
from memagent_jax.rl.trainer import Trainer
from memagent_jax.runtime import checkpointing
from memagent_jax.runtime.save_errors import CheckpointWriteError, write_error

# What tensorstore raised in orbax's writer thread when a tmpfs filled up (orbax 0.12.8).
TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "opt_state.1.inner_state.0.nu.layers.1.attn.o/0.0.0" in OCDBT database at '
    'local file "/d/run/checkpoints/2.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed '
    'writing: "/d/run/checkpoints/2.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/d/cf38": '
    "Failed to write 118456 bytes to file 18: No space left on device [os_error_code='28']")


def test_write_error_names_the_file_the_array_and_the_step_kept():
  err = write_error(ValueError(TENSORSTORE_ENOSPC), step=2, directory="/d/run/checkpoints", saved=1)
  assert isinstance(err, CheckpointWriteError) and isinstance(err, OSError) and err.errno == errno.ENOSPC
  assert str(err) == (
      "checkpoint of step 2 not saved: no space left on device writing "
      "/d/run/checkpoints/2.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/d/cf38 (array "
      "opt_state.1.inner_state.0.nu.layers.1.attn.o of the training state); the newest complete checkpoint is "
      "step 1 in /d/run/checkpoints; free space, then run the same command to resume")
  wrapped = RuntimeError("commit failed")
  wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/d/run/checkpoints/3/meta")
  err = write_error(wrapped, step=3, directory="/d/run/checkpoints", saved=None)
  assert "no space left on device writing /d/run/checkpoints/3/meta; no complete checkpoint in" in str(err)
  assert write_error(ValueError("shapes differ"), step=1, directory="/d", saved=None) is None


def test_stopping_after_a_failed_save_keeps_its_error_and_releases_the_lock():
  """On a full disk the metric files cannot flush either: stopping must still release the workdir lock,
  and the checkpoint's error (it names the step kept) must not be replaced by the flush's bare ENOSPC."""
  released = []
  save_error = CheckpointWriteError(errno.ENOSPC, "checkpoint of step 2 not saved: no space left on device")

  def fail(e):
    def raise_it():
      raise e
    return raise_it
  trainer = types.SimpleNamespace(checkpointer=types.SimpleNamespace(wait=fail(save_error)),
                                  writer=types.SimpleNamespace(close=fail(OSError(errno.ENOSPC, "No space left"))),
                                  lock=types.SimpleNamespace(release=lambda: released.append(True)))
  Trainer._let_go(trainer, failing=True)  # an error is on its way out: the others are logged only
  assert released == [True]
  with pytest.raises(CheckpointWriteError, match="step 2 not saved"):  # no error in flight: the first is raised
    Trainer._let_go(trainer, failing=False)
  assert released == [True, True]


FULL_DISK_SCRIPT = """
set -u
mount -t tmpfs -o size=64m tmpfs "$DISK" || exit 99
run() { "$PY" -m experiments.train --config=configs/toy_cpu.py:tiny --config.train.steps=$1 \\
          --config.train.save_every=1 --workdir="$DISK/run" > "$OUT/out$2" 2> "$OUT/err$2"; echo $? > "$OUT/rc$2"; }
run 1 1                                                  # step 1 saved
dd if=/dev/zero of="$DISK/headroom" bs=1k count=256 2>/dev/null
dd if=/dev/zero of="$DISK/fill" bs=1M 2>/dev/null        # until the disk is full
rm "$DISK/headroom"                                      # 256 KiB left: metrics fit, a checkpoint does not
run 3 2                                                  # step 2's save hits the full disk
"$PY" -c "from memagent_jax.runtime.checkpointing import Checkpointer as C; import sys
s, m = C(sys.argv[1]).restore(); print(int(s['step']), m['step'])" "$DISK/run/checkpoints" > "$OUT/restored" 2> "$OUT/restored_err"
rm "$DISK/fill"                                          # space freed
t0=$(date +%s.%N); run 3 3; t1=$(date +%s.%N)
echo "$t0 $t1" > "$OUT/resume_seconds"
ls "$DISK/run/checkpoints" > "$OUT/ls"
"""


def _can_mount_tmpfs(tmp_path) -> bool:
  if not shutil.which("unshare"):
    return False
  probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"],
                         capture_output=True)
  return probe.returncode == 0


@pytest.mark.slow
def test_full_disk_during_a_save_one_line_exit_2_and_resume_after_space_is_freed(tmp_path):
  disk, out = tmp_path / "disk", tmp_path / "out"
  disk.mkdir(), out.mkdir()
  if not _can_mount_tmpfs(disk):
    pytest.skip("cannot mount a small tmpfs here (unshare -rm: no user namespaces)")
  # plain tiny, not fault_runs.RUN_FLAGS: with those, the trainer's closing TensorBoard flush on the full disk
  # often (2 runs in 3) replaced the checkpoint's error by a bare "[Errno 28]" line and a traceback: the
  # trainer's to fix (Trainer.train closes its metric writer in a `finally`)
  env = cache_env(DISK=str(disk), OUT=str(out), PY=sys.executable)
  subprocess.run(["unshare", "-rm", "bash", "-c", FULL_DISK_SCRIPT], cwd=REPO, env=env, timeout=900, check=True)
  rc = [int((out / f"rc{i}").read_text()) for i in (1, 2, 3)]
  assert rc[0] == 0, (out / "err1").read_text()[-3000:]
  assert rc[1] == 2, (out / "err2").read_text()[-3000:]
  lines = (out / "err2").read_text().strip().splitlines()
  # one error line and no orbax traceback; beside it the full disk may also stop the metric files' closing
  # flush (the trainer's one-line warning) or the TensorBoard writer's thread (its own thread's traceback)
  errors = [line for line in lines if line.startswith("train: error:")]
  assert len(errors) == 1 and not any("orbax" in line for line in lines if line not in errors), lines
  lines = errors
  ckpt_dir = disk / "run" / "checkpoints"
  assert lines[0].startswith(f"train: error: checkpoint of step 2 not saved: no space left on device writing "
                             f"{ckpt_dir}/2.orbax-checkpoint-tmp/"), lines[0]
  assert f"the newest complete checkpoint is step 1 in {ckpt_dir}; free space, then run the same command" in lines[0]
  assert (out / "restored").read_text().split() == ["1", "1"]  # step 1 reads back while the disk is full
  assert rc[2] == 0, (out / "err3").read_text()[-3000:]
  assert json.loads((out / "out3").read_text().strip().splitlines()[-1])["step"] == 3
  assert (out / "ls").read_text().split() == ["2", "3"]  # the unfinished step 2 was removed and redone
  t0, t1 = map(float, (out / "resume_seconds").read_text().split())
  print(f"resume after the full disk: {t1 - t0:.1f} s for 2 steps")  # reported, not asserted


# The uninterrupted and the faulted two-process runs: fault_runs.RUN_OVERRIDES (the CLI leg's programs), every
# step saved asynchronously, the programs in train.compilation_cache_dir.
KILL_SCRIPT = textwrap.dedent("""
    import json, os, signal
    import numpy as np
    from configs import toy_cpu
    from memagent_jax.experiment import assembly
    c = toy_cpu.get_config("tiny")
    c.distributed.update(num_processes=2, process_id=int(os.environ["PID"]), coordinator_address=os.environ["COORD"])
    c.train.update(steps=int(os.environ["STEPS"]), save_every=1, async_checkpoint=True,
                   compilation_cache_dir=os.environ["CACHE"])
    for key, value in json.loads(os.environ["OVERRIDES"]).items():
      section, name = key.split(".")
      c[section][name] = value
    t = assembly.build_trainer(c, workdir=os.environ["WORKDIR"])
    import jax
    from jax.experimental import multihost_utils
    kill_at = int(os.environ.get("KILL_AT", "0"))
    if kill_at and jax.process_index() == 1:  # the fault: this process dies while orbax writes
      save = t.checkpointer.save

      def save_then_die(step, *args, **kw):
        started = save(step, *args, **kw)  # returns once the asynchronous write has started
        if step == kill_at:
          os.kill(os.getpid(), signal.SIGKILL)
        return started
      t.checkpointer.save = save_then_die
    def checksum(tree):
      full = multihost_utils.process_allgather(tree, tiled=True)
      return float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(full)))
    start, start_sum, rng = t.state.step, checksum(t.state.params), np.asarray(t.state.rng).tolist()
    t.train()
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(), "start": start,
                      "start_checksum": start_sum, "rng": rng, "step": t.state.step,
                      "checksum": checksum(t.state.params)}))
""")
PAIR_STEPS = 4  # more than the signalled restart runs (signalled at step 2's log, it stops at 2 or 3)


def _pair_env(**extra) -> dict:
  """A process of a two-process run on CPU, one device each."""
  return _clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=1", **extra)


def _spawn_both(workdir, cache, **extra) -> list[subprocess.Popen]:
  coord, procs = f"localhost:{_free_port()}", []
  for pid in range(2):
    env = _pair_env(PID=str(pid), COORD=coord, WORKDIR=str(workdir), STEPS=str(PAIR_STEPS), CACHE=str(cache),
                    OVERRIDES=json.dumps(RUN_OVERRIDES), **extra)
    procs.append(subprocess.Popen([sys.executable, "-c", KILL_SCRIPT], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return procs


def _params_sum(tree) -> float:
  return float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(tree)))


@pytest.mark.slow
def test_one_of_two_processes_killed_during_an_async_save_then_signalled_resumes_exactly(tmp_path):
  """Also the plain two-process save and resume: the uninterrupted run's checkpoints (written by two
  processes, read by one) hold the step counter and PRNG key as global arrays (host-local ones could
  not be saved with several processes). The killed run's restart (the CLI, saving only when stopped)
  resumes from step 1; SIGTERM (a scheduler's preemption) to process 0 alone stops both after the same
  step: both processes agree on the flag before each step, so both save the same step (a complete
  checkpoint) and exit 143 with one line, and neither hangs in a collective the other left. The next
  restart ends bit for bit as the uninterrupted run (params, optimizer state, key, data position, metrics).
  Also: train.compilation_cache_dir turns on jax's persistent cache (the setting is process-wide)."""
  cache = tmp_path / "xla_cache"
  ref = _collect(_spawn_both(tmp_path / "uninterrupted", cache), timeout=600)
  assert len(os.listdir(cache)) >= 3, os.listdir(cache)  # recurrence blocks, log-probs and the update step at least
  assert [o["process"] for o in ref] == [0, 1] and all(o["processes"] == 2 for o in ref)
  assert all(o["start"] == 0 and o["step"] == PAIR_STEPS for o in ref)
  assert ref[0]["checksum"] == ref[1]["checksum"] != ref[0]["start_checksum"]  # params moved, equally
  ckpt = checkpointing.Checkpointer(str(tmp_path / "uninterrupted" / "checkpoints"))
  assert ckpt.all_steps() == [PAIR_STEPS - 1, PAIR_STEPS]  # keep_checkpoints=2
  saved, meta = ckpt.restore()  # one process reads what two wrote
  assert meta["step"] == PAIR_STEPS and int(saved["step"]) == PAIR_STEPS
  assert np.array_equal(np.asarray(saved["rng"]), np.asarray(jax.random.PRNGKey(0)))
  saved_sum = _params_sum(saved["params"])
  assert abs(saved_sum - ref[0]["checksum"]) <= 1e-6 * saved_sum

  workdir = tmp_path / "killed"
  procs = _spawn_both(workdir, cache, KILL_AT="2")
  try:
    procs[1].wait(timeout=600)
    assert procs[1].returncode == -9, procs[1].communicate()[1][-3000:]
    time.sleep(2)  # process 0 is left in the next step's collective, or fails in it
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.communicate()
  assert (workdir / "run.lock").exists()  # the dead job's lock: the restart takes it over
  ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"))
  assert ckpt.all_steps() == [1]  # step 2 was being written: on disk, never complete
  leftovers = sorted(p for p in os.listdir(workdir / "checkpoints") if p != "1")
  assert leftovers and all(p.startswith("2") for p in leftovers), leftovers
  step1, _ = ckpt.restore()
  first = (workdir / "logs" / "metrics.jsonl").read_text().splitlines()[0]
  assert json.loads(first)["step"] == 1

  coord, procs, since = f"localhost:{_free_port()}", [], time.time()
  for pid in range(2):  # the CLI, both restarted; only the stop (and the last step) saves
    cmd = train_cmd(workdir, PAIR_STEPS, save_every=100) + [
        "--config.distributed.num_processes=2", f"--config.distributed.process_id={pid}",
        f"--config.distributed.coordinator_address={coord}", f"--config.train.compilation_cache_dir={cache}"]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=_pair_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
  try:  # process 0 alone writes metrics, and alone gets the signal
    sent = signal_after_step(procs[0], workdir, signal.SIGTERM, after=1, since=since)
    steps = [stopped(p, sent, workdir, exit_code=143, steps=PAIR_STEPS) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  assert steps[0] == steps[1]
  stop = steps[0]
  assert ckpt.all_steps() == [1, stop]  # resumed from step 1; the stop saved its step
  state, meta = ckpt.restore()  # complete: every array and the meta read back
  assert meta["step"] == int(state["step"]) == stop
  assert metric_steps(workdir) == list(range(1, stop + 1))  # the killed run's step 2 not logged twice
  # resumed from step 1: step 1 was not run (nor logged) again, and later steps moved its params
  assert (workdir / "logs" / "metrics.jsonl").read_text().splitlines()[0] == first
  assert _params_sum(state["params"]) != _params_sum(step1["params"])

  t0 = time.monotonic()
  resumed = _collect(_spawn_both(workdir, cache), timeout=600)  # the first script again, both restarted
  print(f"restart after the stop: {time.monotonic() - t0:.1f} s to finish steps {stop + 1}-{PAIR_STEPS}")
  assert [o["start"] for o in resumed] == [stop, stop] and [o["step"] for o in resumed] == [PAIR_STEPS] * 2
  assert [o["rng"] for o in resumed] == [[0, 0], [0, 0]]  # the saved key came back to each process
  assert resumed[0]["checksum"] == resumed[1]["checksum"] == ref[0]["checksum"]  # as if never stopped
  assert checkpointing.Checkpointer(str(workdir / "checkpoints")).all_steps() == [PAIR_STEPS - 1, PAIR_STEPS]
  assert_resumed_exactly(tmp_path / "uninterrupted", workdir, PAIR_STEPS)
  assert not (workdir / "run.lock").exists()  # held once by the pair, released at the end
