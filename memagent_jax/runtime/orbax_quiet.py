"""Orbax reading a damaged checkpoint: its own error logging and the asynchronous leftovers of
a failed read (closed event loop, unretrieved task errors) are pages, never news. These helpers
turn them off so the caller reports one line of its own."""

from __future__ import annotations

import contextlib
import logging
import sys


def _is_read_noise(exc=None, text: str = "") -> bool:
  """After a failed read, orbax's pending reads report its closed event loop, their own
  cancellation (GeneratorExit) and asyncio their unretrieved errors: pages, never news."""
  if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
    return True
  if isinstance(getattr(exc, "__cause__", None), GeneratorExit) and "reading array index" in str(exc):
    return True
  # asyncio names the object: Task, Future, or the _GatheringFuture of orbax's gathered reads
  unretrieved = "exception was never retrieved" in text.split("\n", 1)[0]
  lowered = text.lower()
  return unretrieved and ("tensorstore" in lowered or "orbax" in lowered or "reading array index" in lowered)


def _keep_record(record) -> bool:
  return not _is_read_noise(text=f"{record.getMessage()} {record.exc_info[1] if record.exc_info else ''}")


def _drop_read_noise():
  """Wraps sys.excepthook / sys.unraisablehook (where not yet wrapped) and filters the asyncio
  logger so that only `_is_read_noise` reports are dropped."""
  if not getattr(sys.excepthook, "_memagent", False):
    excepthook = sys.excepthook

    def on_exception(kind, exc, tb):
      if not _is_read_noise(exc):
        excepthook(kind, exc, tb)
    on_exception._memagent = True
    sys.excepthook = on_exception
  if not getattr(sys.unraisablehook, "_memagent", False):
    unraisablehook = sys.unraisablehook

    def on_unraisable(info):
      if not _is_read_noise(info.exc_value):
        unraisablehook(info)
    on_unraisable._memagent = True
    sys.unraisablehook = on_unraisable
  if _keep_record not in logging.getLogger("asyncio").filters:
    logging.getLogger("asyncio").addFilter(_keep_record)


@contextlib.contextmanager
def quiet_orbax():
  """Silences orbax's own (absl) logging while we read a step: a damaged step becomes one
  error or warning of ours, not pages of orbax errors."""
  _drop_read_noise()
  loggers = [logging.getLogger(name) for name in ("absl", "orbax")]
  levels = [lg.level for lg in loggers]
  for lg in loggers:
    lg.setLevel(logging.CRITICAL + 1)
  try:
    yield
  finally:
    for lg, level in zip(loggers, levels):
      lg.setLevel(level)


def one_line(text: str, limit: int = 300) -> str:
  """An error message squeezed onto one line (tensorstore messages span many)."""
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


# --- PRNG keys and nnx params --------------------------------------------------------
