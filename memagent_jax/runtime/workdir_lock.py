"""One workdir, one run: `<workdir>/run.lock` names the run that holds it (host, pid, start time).

Two runs in one workdir would overwrite each other's checkpoints and truncate each other's
metrics, so a second run is refused with an error naming the holder. A lock whose holder is
gone is taken over with a warning: same host and the pid no longer runs (or now belongs to
another process: the pid's start time is recorded too, so a restarted container that reuses
the pid is not mistaken for the holder). A lock held from another host cannot be checked and
is never taken over: the error says to delete the file if that run is gone.

On a multi-process run only process 0 touches the file; every process learns whether it got
the lock (a broadcast), so all of them start or all of them fail.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import time
import uuid
import weakref

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"


class WorkdirLockedError(RuntimeError):
  """Another live run holds the workdir."""


def _proc_stat(pid: int) -> tuple[str, int] | None:
  """(state letter, start time in clock ticks since boot) of a Linux process, None without /proc
  or when the process does not exist."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()  # the command name in (...) may hold spaces
  except (OSError, IndexError):
    return None
  return fields[0], int(fields[19])


def _alive(pid: int, proc_start: int | None) -> bool:
  """Whether process `pid` of this host runs and, where its start time was recorded, is that one."""
  stat = _proc_stat(pid)
  if stat is not None:
    state, start = stat
    return state not in ("Z", "X") and (proc_start is None or start == proc_start)  # zombie: exited
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's process
    return True
  return True


def _this_process() -> dict:
  pid = os.getpid()
  stat = _proc_stat(pid)
  return {"host": socket.gethostname(), "pid": pid,
          "start_time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "proc_start": stat[1] if stat else None, "token": uuid.uuid4().hex}


def describe(holder: dict) -> str:
  return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
          f"started {holder.get('start_time', '?')}")


def _read(path: str) -> dict | None:
  """The holder written in `path`; None if there is no file; {} if it does not parse (a writer
  that died between creating and writing it, after a short wait for a live writer to finish)."""
  for attempt in range(3):
    try:
      with open(path) as f:
        text = f.read()
    except FileNotFoundError:
      return None
    try:
      holder = json.loads(text)
      if isinstance(holder, dict):
        return holder
    except json.JSONDecodeError:
      pass
    time.sleep(0.2 * (attempt + 1))
  return {}


def _remove_if_ours(path: str, token: str):
  holder = _read(path)
  if holder and holder.get("token") == token:
    try:
      os.remove(path)
    except FileNotFoundError:
      pass


class WorkdirLock:
  """`acquire()` takes `<workdir>/run.lock` (a no-op while held), `release()` removes it; it is
  also removed when the object is garbage collected or the interpreter exits."""

  def __init__(self, workdir: str):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_NAME)
    self.held = False
    self._release = None  # weakref.finalize removing our lock file (process 0 only)

  def acquire(self) -> WorkdirLock:
    if self.held:
      return self
    error = None
    if jax.process_index() == 0:
      try:
        self._take()
      except Exception as e:  # noqa: BLE001 - every process must reach the broadcast below
        error = e
    if jax.process_count() > 1:
      taken = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
      if not taken and error is None:
        error = WorkdirLockedError(f"process 0 could not take the workdir lock {self.path}; its error "
                                   "names the run holding it")
    if error is not None:
      raise error
    self.held = True
    return self

  def release(self):
    if self._release is not None:
      self._release()  # runs once; later calls and the finalizer at exit do nothing
      self._release = None
    self.held = False

  def _take(self):
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    me = _this_process()
    for _ in range(5):
      if self._create(me):
        self._release = weakref.finalize(self, _remove_if_ours, self.path, me["token"])
        return
      holder = _read(self.path)
      if holder is None:  # released between our two looks
        continue
      reason = self._stale(holder, me)
      if reason is None:
        raise WorkdirLockedError(
            f"workdir {os.path.dirname(self.path)} is in use by another run ({describe(holder)}): two runs "
            f"in one workdir overwrite each other's checkpoints. Stop that run or choose another workdir; "
            f"if that run is gone, delete {self.path}")
      log.warning("taking over the workdir lock %s: %s", self.path, reason)
      if _read(self.path) == holder:  # not replaced meanwhile by a run that also found it stale
        try:
          os.remove(self.path)
        except FileNotFoundError:
          pass
    raise WorkdirLockedError(f"could not take the workdir lock {self.path}: other runs keep taking it")

  def _create(self, me: dict) -> bool:
    """Creates the lock file holding `me`; False if it exists."""
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
      f.flush()
      os.fsync(f.fileno())
    return True

  @staticmethod
  def _stale(holder: dict, me: dict) -> str | None:
    """Why the lock `holder` wrote can be taken over, None if its run may still be alive."""
    if not holder:
      return "its file is empty or unreadable (a run that died while taking it)"
    if holder.get("host") != me["host"]:
      return None  # another machine's processes cannot be checked
    pid, start = holder.get("pid"), holder.get("proc_start")
    if pid == me["pid"] and start == me["proc_start"]:
      return f"it was taken by this process earlier ({describe(holder)}), by a Trainer not released"
    if not isinstance(pid, int) or not _alive(pid, start):
      return f"the run that held it is gone ({describe(holder)})"
    return None
