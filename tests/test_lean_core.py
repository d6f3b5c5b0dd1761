"""The package is plain JAX that leaves the process alone: importing it changes nothing, and no file of
the project reaches into JAX's private modules."""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints what a process's JAX set-up is, before and after `import memagent_jax`.
_SNAPSHOT = r"""
import json, os, sys, logging
import jax

def snapshot():
  from jax import config
  lowerings = None
  try:  # the registered MLIR lowering rules, where this jax exposes them publicly
    from jax.interpreters import mlir
    lowerings = {str(p): repr(r) for p, r in getattr(mlir, "_lowerings", {}).items()}
  except ImportError:
    pass
  return dict(config={k: repr(v) for k, v in config.values.items()},
              environ=dict(os.environ),
              excepthook=repr(sys.excepthook), unraisablehook=repr(sys.unraisablehook),
              lowerings=lowerings,
              loggers={n: (lg.level, len(lg.filters)) for n, lg in logging.root.manager.loggerDict.items()
                       if isinstance(lg, logging.Logger)})

before = snapshot()
import memagent_jax  # noqa: F401
after = snapshot()
def diff(b, a, new_too=True):
  return sorted((set(b) ^ set(a) if new_too else set(b) - set(a)) | {n for n in b if n in a and b[n] != a[n]})
changed = {k: diff(before[k], after[k], new_too=k not in ("lowerings", "loggers")) if isinstance(before[k], dict)
           else (before[k] != after[k]) for k in before if before[k] is not None}
print(json.dumps(changed))
"""


def test_importing_the_package_changes_no_jax_config_environment_hook_or_lowering():
  """A fresh process: jax's config values, os.environ, sys.excepthook / unraisablehook and the registered
  lowering rules are the same before and after `import memagent_jax` (jax modules it imports may register
  their own primitives' rules, and loggers may appear; no existing rule, level or filter changes)."""
  import json
  out = subprocess.run([sys.executable, "-c", _SNAPSHOT], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
  assert out.returncode == 0, out.stderr[-3000:]
  changed = json.loads(out.stdout.strip().splitlines()[-1])
  assert changed["config"] == [] and changed["environ"] == []
  assert changed["excepthook"] is False and changed["unraisablehook"] is False
  assert changed.get("lowerings", []) == []  # no rule registered before the import was replaced
  assert changed["loggers"] == []  # no logger that existed changed its level or filters


def test_no_file_of_the_project_uses_jax_private_modules():
  """`jax._src` (and jaxlib's private `_jax`) in no package, experiment, config or test file."""
  pattern = re.compile(r"jax\._src|jax/_src|jaxlib\._jax|from jax import _src")
  hits = []
  for top in ("memagent_jax", "experiments", "configs", "tests"):
    for root, _, files in os.walk(os.path.join(REPO, top)):
      for name in files:
        if name.endswith((".py", ".ipynb", ".cc")) and name != "test_lean_core.py":
          path = os.path.join(root, name)
          for n, line in enumerate(open(path, encoding="utf-8"), 1):
            if pattern.search(line):
              hits.append(f"{os.path.relpath(path, REPO)}:{n}: {line.strip()}")
  assert hits == []
