"""Output files that are either complete or absent: written under a temporary name beside the
target and renamed on success, so a crash or Ctrl-C never truncates earlier results."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import IO, Iterator


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def _tmp_name(path: str) -> str:
  """An empty file beside `path` with the permissions a plain open() would give."""
  directory, base = os.path.split(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
  os.close(fd)
  os.chmod(tmp, 0o666 & ~_umask())
  return tmp


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", encoding: str | None = "utf-8",
                 newline: str | None = None) -> Iterator[IO]:
  """`with atomic_write(p) as f: f.write(...)`: p appears (or is replaced) only if the block
  finishes; on an exception the temporary file is removed and p is untouched."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = _tmp_name(path)
  try:
    binary = "b" in mode
    with open(tmp, mode, encoding=None if binary else encoding, newline=None if binary else newline) as f:
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
  os.chmod(tmp, 0o777 & ~_umask())
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


def save_figure(fig, path: str, **savefig_kwargs) -> str:
  """A matplotlib figure written atomically (format from the file's extension)."""
  fmt = os.path.splitext(path)[1].lstrip(".") or "png"
  with atomic_write(path, "wb") as f:
    fig.savefig(f, format=fmt, **savefig_kwargs)
  return path
