"""Executes a notebook headless with the installed kernel and writes the executed copy, so the
README's notebook step runs without a Jupyter server.

  python -m experiments.run_notebook [NOTEBOOK] [--out=runs/notebooks]
"""

from __future__ import annotations

import os
import sys

import nbformat
from absl import app, flags
from nbclient import NotebookClient

from memagent_jax.runtime.atomic_io import atomic_write

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notebooks", "memagent_quickstart.ipynb")


_OUT = flags.DEFINE_string("out", "runs/notebooks", "directory for the executed copy")
_TIMEOUT = flags.DEFINE_integer("timeout", 1200, "seconds per cell")


def main(argv):
  if len(argv) > 2:
    raise app.UsageError(f"give at most one notebook; got {argv[1:]}")
  notebook = argv[1] if len(argv) > 1 else DEFAULT
  if not os.path.isfile(notebook):
    print(f"run_notebook: error: no such notebook: {notebook}", file=sys.stderr)
    sys.exit(2)
  nb = nbformat.read(notebook, as_version=4)
  NotebookClient(nb, timeout=_TIMEOUT.value, kernel_name="python3",
                 resources={"metadata": {"path": os.getcwd()}}).execute()
  out = os.path.join(_OUT.value, os.path.basename(notebook))
  with atomic_write(out) as f:
    nbformat.write(nb, f)
  print(f"executed {notebook} -> {out}")


if __name__ == "__main__":
  app.run(main)
