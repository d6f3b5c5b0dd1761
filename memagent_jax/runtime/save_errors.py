"""A checkpoint that could not be written (a full disk, a read-only or vanished filesystem) as one
error line naming the file and the array being written, instead of orbax's pages of tracebacks.

Orbax writes asynchronously: tensorstore's error ("RESOURCE_EXHAUSTED: Error writing "<array>" ...
Failed writing: "<file>": ... No space left on device [os_error_code='28']") is raised in a background
thread, logged there by orbax several times, and raised again in the caller's next
`wait_until_finished`. We drop orbax's own reports of it and raise `CheckpointWriteError` there.
"""

from __future__ import annotations

import errno
import logging
import os
import re

from memagent_jax.runtime.orbax_quiet import one_line

_OS_CODE = re.compile(r"os_error_code='?(\d+)'?")
_FILE = re.compile(r'Failed writing: "([^"]+)"')
_ARRAY = re.compile(r'Error writing "([^"]+?)(?:/[\d.]+)?" in')
# orbax's own ERROR reports of a failed background save (its caller gets the error itself)
_ORBAX_SAVE_REPORTS = ("_SignalingThread.run() raised an exception", "in background save thread",
                       "Save Finalize thread", "Checkpointer failed: one or more items may not be finalized")


class CheckpointWriteError(OSError):
  """A step's checkpoint was not written; the steps saved before it are intact."""

  def __str__(self) -> str:
    return self.strerror  # the one line, without OSError's "[Errno 28] " prefix


def _os_error(exc: BaseException) -> tuple[int | None, str, str | None]:
  """(errno, text, file name) of the first OS-level failure in `exc`'s chain (tensorstore reports
  the errno as os_error_code inside a ValueError's message); errno None if there is none."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno:
      return exc.errno, str(exc), exc.filename
    if m := _OS_CODE.search(str(exc)):
      return int(m[1]), str(exc), None
    exc = exc.__cause__ or exc.__context__
  return None, "", None


def write_error(exc: BaseException, *, step: int | None, directory: str, saved: int | None) -> CheckpointWriteError | None:
  """`exc` (raised by orbax while writing `step` into `directory`) as a one-line CheckpointWriteError,
  None when it is not an OS-level write failure; `saved` is the newest complete step."""
  code, text, filename = _os_error(exc)
  if code is None:
    return None
  filename = filename or ((m := _FILE.search(text)) and m[1])
  what = f"writing {filename}" if filename else f"writing into {directory}"
  if m := _ARRAY.search(text):
    what += f" (array {m[1]} of the training state)"
  reason = "no space left on device" if code == errno.ENOSPC else os.strerror(code).lower()
  kept = (f"the newest complete checkpoint is step {saved} in {directory}" if saved is not None
          else f"no complete checkpoint in {directory} yet")
  where = f"step {step}" if step is not None else "a step"
  hint = "free space, then" if code == errno.ENOSPC else "fix that, then"
  return CheckpointWriteError(code, one_line(f"checkpoint of {where} not saved: {reason} {what}; {kept}; "
                                             f"{hint} run the same command to resume", limit=1000))


class _DropOrbaxSaveReports(logging.Filter):
  def filter(self, record) -> bool:
    if record.levelno < logging.ERROR or "orbax" not in record.pathname:
      return True
    return not any(s in record.getMessage() for s in _ORBAX_SAVE_REPORTS)


_FILTER = _DropOrbaxSaveReports()


def drop_orbax_save_reports():
  """Drops orbax's own ERROR reports (with tracebacks) of a failed background save from the absl
  logger; the save's caller raises the error as one line."""
  for name in ("absl", "orbax"):
    if _FILTER not in logging.getLogger(name).filters:
      logging.getLogger(name).addFilter(_FILTER)
