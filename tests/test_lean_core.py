"""The package is plain JAX that leaves the process alone: importing it changes nothing, and no file of
the project reaches into JAX's private modules."""

import ast
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
  """JAX's private modules (its `_src` package, jaxlib's `_jax`) in no package, experiment, config or test file
  (the pattern is assembled so that this file does not name them)."""
  private = "_" + "src"
  pattern = re.compile(rf"jax\.{private}|jax/{private}|jaxlib\._jax|from jax import {private}")
  hits = []
  for top in ("memagent_jax", "experiments", "configs", "tests"):
    for root, _, files in os.walk(os.path.join(REPO, top)):
      for name in files:
        if name.endswith((".py", ".ipynb", ".cc")):
          path = os.path.join(root, name)
          for n, line in enumerate(open(path, encoding="utf-8"), 1):
            if pattern.search(line):
              hits.append(f"{os.path.relpath(path, REPO)}:{n}: {line.strip()}")
  assert hits == []


def test_libtpu_is_the_one_the_installed_jax_tpu_extra_pins():
  """The Makefile's libtpu, the compile tool's install hint and jax's own `tpu` extra name one build."""
  from importlib import metadata
  from memagent_jax.runtime.tpu_targets import LIBTPU_REQUIREMENT
  pins = [r.split(";")[0].replace(" ", "") for r in metadata.requires("jax") or []
          if r.startswith("libtpu") and 'extra == "tpu"' in r]
  assert pins == [LIBTPU_REQUIREMENT]
  makefile = open(os.path.join(REPO, "Makefile")).read()
  assert f"LIBTPU := {LIBTPU_REQUIREMENT}\n" in makefile


def test_constraints_pin_versions_inside_setup_py_ranges():
  """`make setup` installs constraints.txt's exact set; each pin must satisfy setup.py's declared range."""
  from packaging.requirements import Requirement
  import ast
  tree = ast.parse(open(os.path.join(REPO, "setup.py")).read())
  call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
  kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
  ranges = {Requirement(r).name.lower().replace("_", "-"): Requirement(r).specifier
            for r in kw["install_requires"] + sum(kw["extras_require"].values(), [])}
  pins = [Requirement(line.strip()) for line in open(os.path.join(REPO, "constraints.txt"))
          if line.strip() and not line.startswith("#")]
  assert {p.name for p in pins} >= {"jax", "jaxlib", "flax"}
  for pin in pins:
    version = next(iter(pin.specifier)).version
    name = pin.name.lower().replace("_", "-")
    assert name in ranges and ranges[name].contains(version), (pin, ranges.get(name))


# The documented public APIs (DESIGN.md) keep their keyword signatures: outside checks call them so.
MANY_PARAMETERS_ALLOWED = {"memagent_jax/agent/memagent.py:answer_batch", "memagent_jax/rl/losses.py:policy_loss"}


def long_signatures(source: str, rel_path: str, limit: int = 8) -> list[str]:
  """`path:function (n)` for each function of the source taking more than `limit` parameters (self aside)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      a = node.args
      names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
      if len(names) > limit:
        found.append(f"{rel_path}:{node.name} ({len(names)})")
  return found


def test_functions_of_more_than_eight_parameters_take_a_spec():
  found = []
  for top in ("memagent_jax", "experiments"):
    for root, _, files in os.walk(os.path.join(REPO, top)):
      for name in sorted(f for f in files if f.endswith(".py")):
        rel = os.path.relpath(os.path.join(root, name), REPO)
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
          found += long_signatures(f.read(), rel)
  extra = [f for f in found if f.rsplit(" ", 1)[0] not in MANY_PARAMETERS_ALLOWED]
  assert not extra, f"take a spec (a frozen dataclass) instead: {extra}"
  assert long_signatures("def f(self, a, b, c, d, e, g, h, i, *, j):\n  pass\n", "x.py") == ["x.py:f (9)"]
  assert long_signatures("def f(self, a, b, c, d, e, g, h, i):\n  pass\n", "x.py") == []
