"""Output files that are either complete or absent: written under a temporary name beside the
target and renamed on success, so a crash or Ctrl-C never truncates earlier results."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import IO, Iterator


def _tmp_name(path: str, suffix: str = "") -> str:
  directory, base = os.path.split(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=suffix + ".tmp", dir=directory)
  os.close(fd)
  return tmp


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
  """`with atomic_write(p) as f: f.write(...)`: p appears (or is replaced) only if the block
  finishes; on an exception the temporary file is removed and p is untouched."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = _tmp_name(path)
  try:
    with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise


@contextlib.contextmanager
def atomic_directory(path: str) -> Iterator[str]:
  """Yields a fresh temporary directory beside `path`; on success it replaces `path` whole
  (an existing directory is moved aside first and removed only after the swap)."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = None
  if os.path.exists(path):
    if not os.path.isdir(path):
      shutil.rmtree(tmp, ignore_errors=True)
      raise NotADirectoryError(f"output {path} exists and is not a directory")
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".old", dir=parent)
    os.rmdir(old)
    os.replace(path, old)
  os.replace(tmp, path)
  if old:
    shutil.rmtree(old, ignore_errors=True)
