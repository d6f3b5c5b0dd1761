"""The package's import structure (docs/DESIGN.md): layers import only downward, and nothing of
ours is imported inside a function.

Layers, bottom to top; a module imports only from its own folder or a lower layer:

  0 runtime   1 text   2 models   3 data   4 policy   5 agent   6 rl   7 evaluation
  8 experiment   9 cli.py

`memagent_jax/__init__.py` (the public API re-export) is exempt. `configs` (the repo's config
files) may be imported by experiment/ and cli.py only. A third-party import inside a function is
allowed for optional or slow-to-import dependencies, with a one-line reason as a comment on its
line or on the line above it (or above the run of imports it belongs to).
"""

from __future__ import annotations

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "memagent_jax"
LAYERS = {"runtime": 0, "text": 1, "models": 2, "data": 3, "policy": 4, "agent": 5, "rl": 6,
          "evaluation": 7, "experiment": 8, "cli": 9}
CONFIGS_FROM = LAYERS["experiment"]  # the lowest layer that may read the repo's configs package


def _module_name(rel_path: str) -> str:
  """'memagent_jax/rl/update.py' -> 'memagent_jax.rl.update' (a package's __init__ -> the package)."""
  parts = rel_path[:-3].replace(os.sep, "/").split("/")
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str | None:
  """The folder or top-level module a dotted name belongs to ('memagent_jax.rl.update' -> 'rl');
  None for the package root."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
  """The absolute dotted names an import statement reads (relative imports resolved)."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  if node.level:
    base = module.split(".")
    if not is_package:
      base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    mod = ".".join(base + ([node.module] if node.module else []))
  else:
    mod = node.module or ""
  if mod == PACKAGE:  # `from memagent_jax import rl` reads memagent_jax.rl; `import MemAgent`, the root
    return [f"{PACKAGE}.{a.name}" if a.name in LAYERS else PACKAGE for a in node.names]
  return [mod]


def _ours(name: str) -> bool:
  top = name.split(".")[0]
  return top in (PACKAGE, "configs")


def _function_import_nodes(tree: ast.AST):
  """(import node, in_function) for every import statement of a module."""
  out = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        out.append((child, in_function))
      inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      visit(child, inner)

  visit(tree, False)
  return out


def _has_reason(lines: list[str], node: ast.AST, import_lines: set[int]) -> bool:
  """A comment on the import's line, or on the line above it / above its run of imports."""
  if "#" in lines[node.lineno - 1]:
    return True
  above = node.lineno - 1
  while above in import_lines and "#" not in lines[above - 1]:  # one reason may cover a run of imports
    above -= 1
  return above >= 1 and (above in import_lines or lines[above - 1].lstrip().startswith("#"))


def check_source(source: str, rel_path: str) -> list[str]:
  """Every layering violation of one file (`rel_path` relative to the repo, e.g.
  'memagent_jax/models/decoder.py'), as 'file:line: message' strings."""
  module = _module_name(rel_path)
  is_package = rel_path.endswith("__init__.py")
  unit = _unit(module)
  tree = ast.parse(source, filename=rel_path)
  lines = source.splitlines()
  found = []
  if unit is None:  # the public API re-export
    return found
  if unit not in LAYERS:
    return [f"{rel_path}:1: '{unit}' is in no layer; add it to LAYERS in tests/test_layers.py and docs/DESIGN.md"]
  layer = LAYERS[unit]
  imports = _function_import_nodes(tree)
  import_lines = {i for n, _ in imports for i in range(n.lineno, n.end_lineno + 1)}
  for node, in_function in imports:
    where = f"{rel_path}:{node.lineno}"
    for target in _targets(node, module, is_package):
      if in_function:
        if _ours(target):
          found.append(f"{where}: function-level import of our own module {target} "
                       "(import it at the top of the file)")
        elif not _has_reason(lines, node, import_lines):
          found.append(f"{where}: function-level import of {target} without a one-line reason "
                       "(a comment on the line or the line above)")
        continue
      if target.split(".")[0] == "configs":
        if layer < CONFIGS_FROM:
          found.append(f"{where}: {unit} (layer {layer}) imports {target}; only experiment/ and cli.py "
                       f"(layers >= {CONFIGS_FROM}) may read configs")
        continue
      if target.split(".")[0] != PACKAGE:
        continue
      to = _unit(target)
      if to is None:
        if root_layer() >= layer:
          found.append(f"{where}: {unit} (layer {layer}) imports the package root {PACKAGE}, which "
                       f"re-exports layers up to {root_layer()}; import the module itself")
      elif to not in LAYERS:
        found.append(f"{where}: {unit} (layer {layer}) imports {target}, whose '{to}' is in no layer")
      elif LAYERS[to] > layer:
        found.append(f"{where}: upward import {unit} (layer {layer}) -> {to} (layer {LAYERS[to]}): {target}")
  for node in ast.walk(tree):  # importlib.import_module("memagent_jax.x") hides an arrow from the walk above
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str) and _ours(node.args[0].value)
        and ast.unparse(node.func).split(".")[-1] in ("import_module", "__import__")):
      found.append(f"{rel_path}:{node.lineno}: dynamic import of our own module {node.args[0].value} "
                   "(import it at the top of the file)")
  return found


def root_layer() -> int:
  """The highest layer the package root re-exports: only layers above it may `import memagent_jax`."""
  tree = ast.parse(_read(f"{PACKAGE}/__init__.py"))
  units = [_unit(t) for node, _ in _function_import_nodes(tree)
           for t in _targets(node, PACKAGE, True) if t.startswith(PACKAGE + ".")]
  return max((LAYERS.get(u, max(LAYERS.values())) for u in units), default=-1)


def package_files() -> list[str]:
  out = []
  for root, dirs, files in os.walk(os.path.join(REPO, PACKAGE)):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    out += [os.path.relpath(os.path.join(root, f), REPO) for f in sorted(files) if f.endswith(".py")]
  return out


def _read(rel_path: str) -> str:
  with open(os.path.join(REPO, rel_path), encoding="utf-8") as f:
    return f.read()


def test_package_is_found():
  files = package_files()
  assert len(files) > 30 and f"{PACKAGE}/cli.py" in files, files


def test_imports_point_downward_and_none_of_ours_inside_functions():
  found = [v for path in package_files() for v in check_source(_read(path), path)]
  assert not found, f"{len(found)} layering violation(s) (see docs/DESIGN.md):\n" + "\n".join(found)


# ----- the checker flags what it should (so the tests above can fail) ---------------------------

@pytest.mark.parametrize("path, source, expect", [
    ("memagent_jax/models/decoder.py", "from memagent_jax.rl.trainer import Trainer\n",
     "upward import models (layer 2) -> rl (layer 6)"),
    ("memagent_jax/data/toy.py", "from memagent_jax import agent\n", "upward import data (layer 3) -> agent"),
    ("memagent_jax/text/answers.py", "import memagent_jax.policy.sampling\n", "upward import text (layer 1)"),
    ("memagent_jax/runtime/parallel.py", "from ..models import config\n", "upward import runtime (layer 0) -> models"),
    ("memagent_jax/rl/__init__.py", "from ..evaluation import run_eval\n", "upward import rl (layer 6) -> evaluation"),
    ("memagent_jax/rl/trainer.py", "import configs.base\n", "only experiment/ and cli.py"),
    ("memagent_jax/agent/memagent.py", "from memagent_jax import MemAgent\n", "the package root"),
    ("memagent_jax/data/toy.py", "import memagent_jax as mj\n", "the package root"),
    ("memagent_jax/shiny/new.py", "import os\n", "in no layer"),
    ("memagent_jax/rl/update.py", "def f():\n  from memagent_jax.runtime import parallel\n",
     "function-level import of our own module memagent_jax.runtime"),
    ("memagent_jax/cli.py", "def f():\n  from configs import base\n", "function-level import of our own module configs"),
    ("memagent_jax/rl/update.py", "class A:\n  def f(self):\n    from . import losses\n",
     "function-level import of our own module memagent_jax.rl"),
    ("memagent_jax/rl/metrics.py", "def f():\n  import tensorboard\n", "without a one-line reason"),
    ("memagent_jax/data/toy.py", "import importlib\nm = importlib.import_module('memagent_jax.rl.trainer')\n",
     "dynamic import of our own module memagent_jax.rl.trainer"),
])
def test_checker_flags(path, source, expect):
  found = check_source(source, path)
  assert any(expect in v for v in found), (expect, found)
  assert all(v.startswith(path + ":") for v in found), found


@pytest.mark.parametrize("path, source", [
    ("memagent_jax/rl/trainer.py", "from memagent_jax.runtime import parallel\nfrom . import losses\n"
                                   "from memagent_jax.rl.update import UpdateSpec\nimport numpy as np\n"),
    ("memagent_jax/experiment/assembly.py", "import configs.base\nfrom memagent_jax.rl.trainer import Trainer\n"),
    ("memagent_jax/__init__.py", "from memagent_jax.cli import main\n"),
    ("memagent_jax/cli.py", "import memagent_jax as mj\nfrom memagent_jax import evaluation\n"),
    ("memagent_jax/rl/metrics.py", "def f():\n  import tensorboard  # optional sink, slow to import\n"),
    ("memagent_jax/models/attention.py", "def f():\n  # TPU only: pallas kernels\n  from a import b\n"
                                         "  from a import c\n"),
])
def test_checker_accepts(path, source):
  assert check_source(source, path) == []
