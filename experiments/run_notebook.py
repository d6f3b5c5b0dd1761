"""Executes a notebook headless with the installed kernel and writes the executed copy, so the
README's notebook step runs without a Jupyter server.

  .venv/bin/python experiments/run_notebook.py [NOTEBOOK] [--out runs/notebooks]
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat
from nbclient import NotebookClient

from memagent_jax.runtime.atomic_io import atomic_write

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notebooks", "memagent_quickstart.ipynb")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("notebook", nargs="?", default=DEFAULT)
  p.add_argument("--out", default="runs/notebooks", help="directory for the executed copy")
  p.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
  args = p.parse_args(argv)
  if not os.path.isfile(args.notebook):
    print(f"run_notebook: error: no such notebook: {args.notebook}", file=sys.stderr)
    return 2
  nb = nbformat.read(args.notebook, as_version=4)
  NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                 resources={"metadata": {"path": os.getcwd()}}).execute()
  out = os.path.join(args.out, os.path.basename(args.notebook))
  with atomic_write(out) as f:
    nbformat.write(nb, f)
  print(f"executed {args.notebook} -> {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
