"""Numbers on a package's structure: import arrows and how many point upward, imports
inside functions, config knobs given a default again in function signatures, long files and
possibly-dead functions. Pure `ast`: nothing of the package is imported, so it measures any
checkout (e.g. an old commit unpacked with `git archive <commit> | tar -x -C /tmp/before`).

  python -m experiments.research.architecture_report                          # this repo
  python -m experiments.research.architecture_report /tmp/other/memagent_jax memagent_jax --details

Layers (docs/DESIGN.md), bottom to top: 0 runtime, 1 text, 2 models, 3 data, 4 policy, 5 agent,
6 rl, 7 evaluation, 8 experiment, 9 cli. Modules of the flat layout (top-level modules, which an
older checkout may have) count in the layer of their home here: registry / atomic_io / orbax_quiet / parallel /
checkpointing -> runtime, tokenization -> text, word_tokenizer -> data, sampling / policy ->
policy, evaluation / length_sweep -> evaluation; models/loading.py -> policy,
data/toy_teacher.py -> rl, agent/templates.py -> text, data/tfds_builders.py -> experiment.

An arrow is a distinct (folder or top-level module) -> (another one) pair of module-level imports;
it points upward when any of its module -> module edges goes to a higher layer. The package root
(`__init__.py`, the public API re-export) is left out. A knob is a leaf key of the repo's
configs/base.py; "knob defaults" counts function parameters named like a knob that carry a
default. A function or class is possibly dead when its name occurs nowhere but its definition
in the package, experiments/ (scripts and notebooks), configs/ and setup.py (tests excluded);
names that occur only in docstrings do not count as uses.
"""

from __future__ import annotations

import ast
import collections
import importlib.util
import json
import os
import re

from absl import app, flags

LAYER_NAMES = ("runtime", "text", "models", "data", "policy", "agent", "rl", "evaluation", "experiment", "cli")
FOLDER_LAYER = {name: i for i, name in enumerate(LAYER_NAMES[:-1])}
TOP_MODULE_LAYER = {"cli": 9,
                    # the flat layout's top-level modules, in the layer of their home here
                    "registry": 0, "atomic_io": 0, "orbax_quiet": 0, "parallel": 0, "checkpointing": 0,
                    "tokenization": 1, "word_tokenizer": 3, "sampling": 4, "policy": 4,
                    "evaluation": 7, "length_sweep": 7}
MOVED_MODULE_LAYER = {"models.loading": 4, "data.toy_teacher": 6, "agent.templates": 1,
                      "data.tfds_builders": 8}
MAX_LINES = 400
OURS = ("configs",)  # besides the package itself


# ----- reading a package ---------------------------------------------------------------------------

class Module:
  def __init__(self, name: str, path: str, rel: str):
    self.name, self.path, self.rel = name, path, rel
    with open(path, encoding="utf-8") as f:
      self.source = f.read()
    self.tree = ast.parse(self.source, filename=path)
    self.is_package = path.endswith("__init__.py")
    self.lines = len(self.source.splitlines())


def read_package(pkg_dir: str) -> dict[str, Module]:
  pkg_dir = os.path.abspath(pkg_dir)
  pkg, parent = os.path.basename(pkg_dir), os.path.dirname(pkg_dir)
  modules = {}
  for root, dirs, files in os.walk(pkg_dir):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for f in sorted(files):
      if f.endswith(".py"):
        path = os.path.join(root, f)
        parts = os.path.relpath(path, parent)[:-3].split(os.sep)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = Module(name, path, os.path.relpath(path, parent))
  assert pkg in modules, f"{pkg_dir} has no __init__.py"
  return modules


def imports_of(tree: ast.AST):
  """(node, in_function) for every import statement."""
  out = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        out.append((child, in_function))
      visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

  visit(tree, False)
  return out


def targets(node, mod: Module, modules: dict[str, Module]) -> list[str]:
  """Absolute dotted names read by an import; `from a import b` is a.b when that is a module."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  if node.level:
    base = mod.name.split(".")
    if not mod.is_package:
      base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    src = ".".join(base + ([node.module] if node.module else []))
  else:
    src = node.module or ""
  return [f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src for a in node.names]


def owner(name: str, modules: dict[str, Module]) -> str:
  """The longest prefix of a dotted name that is one of our modules (`pkg.x.y.Cls` -> `pkg.x.y`)."""
  parts = name.split(".")
  while parts and ".".join(parts) not in modules:
    parts.pop()
  return ".".join(parts)


def unit_of(name: str, modules: dict[str, Module]) -> str:
  """Folder or top-level module: 'memagent_jax.rl.update' -> 'rl/', 'memagent_jax.cli' -> 'cli.py'."""
  parts = name.split(".")
  if len(parts) == 1:
    return ""
  top = f"{parts[0]}.{parts[1]}"
  return parts[1] + ("/" if modules[top].is_package else ".py")


def layer_of(name: str, modules: dict[str, Module]) -> int | None:
  parts = name.split(".")
  if len(parts) == 1:
    return None
  inner = ".".join(parts[1:])
  if inner in MOVED_MODULE_LAYER:
    return MOVED_MODULE_LAYER[inner]
  top = parts[1]
  if f"{parts[0]}.{top}" in modules and modules[f"{parts[0]}.{top}"].is_package:
    return FOLDER_LAYER.get(top)
  return TOP_MODULE_LAYER.get(top)


def knob_values(repo: str) -> dict[str, set]:
  """Leaf keys of <repo>/configs/base.py's get_config(), each with the values it has there."""
  spec = importlib.util.spec_from_file_location("_base_config", os.path.join(repo, "configs", "base.py"))
  base = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(base)
  leaves = collections.defaultdict(set)

  def walk(node):
    for k, v in node.items():
      if hasattr(v, "items"):
        walk(v)
      else:
        leaves[k].add(v if isinstance(v, (int, float, str, bool)) else repr(v))

  walk(base.get_config())
  return dict(leaves)


def _constant(node):
  """The value of a literal default (`0.2`, `-1`, `"x"`), else a sentinel."""
  try:
    return ast.literal_eval(node)
  except ValueError:
    return _constant


# ----- names used outside their definition (for possibly-dead functions) ---------------------------

def _docstring_ids(tree) -> set[int]:
  ids = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        ids.add(id(body[0].value))
  return ids


def used_names(tree) -> collections.Counter:
  used = collections.Counter()
  docs = _docstring_ids(tree)
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      used[node.id] += 1
    elif isinstance(node, ast.Attribute):
      used[node.attr] += 1
    elif isinstance(node, ast.alias):
      used[node.name.split(".")[-1]] += 1
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
      if re.fullmatch(r"[\w.:]+", node.value):  # "f1", "memagent_jax.cli:main"
        used.update(re.findall(r"\w+", node.value))
  return used


def _notebook_trees(path: str):
  with open(path, encoding="utf-8") as f:
    nb = json.load(f)
  for cell in nb.get("cells", []):
    if cell.get("cell_type") == "code":
      src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
      src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
      try:
        yield ast.parse(src)
      except SyntaxError:
        pass


def reference_trees(repo: str, modules: dict[str, Module]):
  yield from (m.tree for m in modules.values())
  for folder in ("experiments", "configs"):
    for root, dirs, files in os.walk(os.path.join(repo, folder)):
      dirs[:] = sorted(d for d in dirs if d != "__pycache__")
      for f in sorted(files):
        path = os.path.join(root, f)
        if f.endswith(".py"):
          with open(path, encoding="utf-8") as fh:
            yield ast.parse(fh.read(), filename=path)
        elif f.endswith(".ipynb"):
          yield from _notebook_trees(path)
  if os.path.exists(os.path.join(repo, "setup.py")):
    with open(os.path.join(repo, "setup.py"), encoding="utf-8") as fh:
      yield ast.parse(fh.read())


# ----- the measurements ----------------------------------------------------------------------------

def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        strong(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      strong(v)
  return out


def _arrows(edges: dict, modules: dict[str, Module]):
  """Upward module edges, folder/top-module arrows, and the arrows with an upward edge."""
  upward_edges = {}
  for (s, t), where in edges.items():
    ls, lt = layer_of(s, modules), layer_of(t, modules)
    if ls is None or lt is None or lt > ls:
      upward_edges[(s, t)] = f"{where}: {s} ({ls}) -> {t} ({lt})"
  arrows = collections.defaultdict(list)
  for s, t in edges:
    if unit_of(s, modules) != unit_of(t, modules):
      arrows[(unit_of(s, modules), unit_of(t, modules))].append((s, t))
  upward_arrows = {a: [upward_edges[e] for e in es if e in upward_edges] for a, es in arrows.items()}
  return upward_edges, arrows, {a: v for a, v in upward_arrows.items() if v}


def measure(pkg_dir: str, repo: str | None = None) -> dict:
  pkg_dir = os.path.abspath(pkg_dir)
  repo = os.path.abspath(repo or os.path.dirname(pkg_dir))
  modules = read_package(pkg_dir)
  pkg = os.path.basename(pkg_dir)
  edges, edges_all, configs_below, in_fn_own, in_fn_all = {}, {}, [], [], []
  graph = collections.defaultdict(set)
  for mod in modules.values():
    src_layer = layer_of(mod.name, modules)
    for node, in_function in imports_of(mod.tree):
      where = f"{mod.rel}:{node.lineno}"
      names = list(dict.fromkeys(targets(node, mod, modules)))
      if in_function:  # counted per statement
        in_fn_all.append(f"{where} {', '.join(names)}")
        if any(t.split(".")[0] in (pkg, *OURS) for t in names):
          in_fn_own.append(f"{where} {', '.join(names)}")
      for t in names:
        if (not in_function and t.split(".")[0] == "configs" and mod.name != pkg
            and (src_layer or 0) < FOLDER_LAYER["experiment"]):
          configs_below.append(f"{where} {t}")
        if t.split(".")[0] != pkg or mod.name == pkg:
          continue
        tgt = owner(t, modules)
        if tgt == mod.name or tgt == pkg:  # the root re-export is exempt
          continue
        edges_all.setdefault((mod.name, tgt), where)
        if not in_function:
          graph[mod.name].add(tgt)
          edges.setdefault((mod.name, tgt), where)
  upward_edges, arrows, upward_arrows = _arrows(edges, modules)
  upward_edges_all, arrows_all, upward_arrows_all = _arrows(edges_all, modules)

  knobs = knob_values(repo)
  disagree = []
  knob_defaults = collections.Counter()
  knob_where = collections.defaultdict(list)
  field_defaults = collections.Counter()
  for mod in modules.values():
    for node in ast.walk(mod.tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        positional = a.posonlyargs + a.args
        named = list(zip(positional[len(positional) - len(a.defaults):], a.defaults)) + [
            (arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        for arg, default in named:
          if arg.arg in knobs:
            knob_defaults[arg.arg] += 1
            knob_where[arg.arg].append(f"{mod.rel}:{node.lineno} {node.name}")
            value = _constant(default)
            if value is not _constant and value is not None and value not in knobs[arg.arg]:
              disagree.append(f"{mod.rel}:{node.lineno} {node.name}({arg.arg}={value!r}); "
                              f"configs/base.py: {sorted(map(repr, knobs[arg.arg]))}")
      elif isinstance(node, ast.ClassDef):  # dataclass-style fields: `clip_high: float = 0.28`
        for stmt in node.body:
          if (isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name)
              and stmt.target.id in knobs):
            field_defaults[stmt.target.id] += 1
            knob_where[stmt.target.id].append(f"{mod.rel}:{stmt.lineno} {node.name}.{stmt.target.id} (field)")
            value = _constant(stmt.value)
            if value is not _constant and value is not None and value not in knobs[stmt.target.id]:
              disagree.append(f"{mod.rel}:{stmt.lineno} {node.name}.{stmt.target.id}={value!r}; "
                              f"configs/base.py: {sorted(map(repr, knobs[stmt.target.id]))}")

  used = collections.Counter()
  for tree in reference_trees(repo, modules):
    used.update(used_names(tree))
  dead = []
  for mod in modules.values():
    for node in mod.tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        registered = any(isinstance(d, ast.Call) and "register" in ast.unparse(d.func)
                         for d in node.decorator_list)  # @REGISTRY.register("name"), @register_x("name")
        if not node.name.startswith("__") and not registered and used[node.name] == 0:
          dead.append(f"{mod.rel}:{node.lineno} {node.name}")

  return dict(
      package=pkg_dir, repo=repo, files=len(modules), lines=sum(m.lines for m in modules.values()),
      module_edges=len(edges), upward_module_edges=len(upward_edges),
      arrows=len(arrows), upward_arrows=len(upward_arrows),
      module_edges_all=len(edges_all), upward_module_edges_all=len(upward_edges_all),
      arrows_all=len(arrows_all), upward_arrows_all=len(upward_arrows_all),
      configs_below_experiment=len(configs_below),
      import_cycles=len(_sccs(graph)),
      in_function_imports_own=len(in_fn_own), in_function_imports_all=len(in_fn_all),
      knob_defaults_total=sum(knob_defaults.values()), knob_defaults=dict(sorted(knob_defaults.items())),
      knob_field_defaults_total=sum(field_defaults.values()),
      knob_field_defaults=dict(sorted(field_defaults.items())),
      knob_defaults_unlike_base=len(disagree),
      files_over_400=sum(m.lines > MAX_LINES for m in modules.values()),
      possibly_dead=len(dead),
      details=dict(
          upward_arrows={f"{s} -> {t}": v for (s, t), v in sorted(upward_arrows.items())},
          arrows=sorted(f"{s} -> {t}" for s, t in arrows),
          upward_arrows_incl_function_level={f"{s} -> {t}": v for (s, t), v in sorted(upward_arrows_all.items())},
          configs_below_experiment=configs_below, import_cycles=_sccs(graph),
          in_function_imports_own=in_fn_own, in_function_imports_all=in_fn_all,
          knob_defaults=dict(sorted(knob_where.items())),
          knob_defaults_unlike_base=disagree,
          files_over_400=sorted(f"{m.rel} ({m.lines})" for m in modules.values() if m.lines > MAX_LINES),
          possibly_dead=dead))


ROWS = (("files (.py)", "files"), ("lines", "lines"),
        ("module -> module import edges", "module_edges"), ("  of them upward", "upward_module_edges"),
        ("folder/top-module arrows", "arrows"), ("  of them upward", "upward_arrows"),
        ("module edges, function-level imports included", "module_edges_all"),
        ("  of them upward", "upward_module_edges_all"),
        ("arrows, function-level imports included", "arrows_all"), ("  of them upward", "upward_arrows_all"),
        ("configs imports below experiment/", "configs_below_experiment"),
        ("module-level import cycles", "import_cycles"),
        ("in-function imports of own modules", "in_function_imports_own"),
        ("in-function imports, all", "in_function_imports_all"),
        ("knob defaults in signatures (total)", "knob_defaults_total"),
        ("knob defaults in class fields (total)", "knob_field_defaults_total"),
        ("  literal defaults differing from configs/base.py", "knob_defaults_unlike_base"),
        ("files over 400 lines", "files_over_400"), ("possibly-dead functions/classes", "possibly_dead"))


def table(results: list[dict], labels: list[str]) -> str:
  out = ["| measure | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
  out += [f"| {name} | " + " | ".join(str(r[key]) for r in results) + " |" for name, key in ROWS]
  knobs = sorted(set().union(*(r["knob_defaults"] for r in results), *(r["knob_field_defaults"] for r in results)))
  out += [f"| knob `{k}` with a default (params + fields) | " + " | ".join(
      f'{r["knob_defaults"].get(k, 0)} + {r["knob_field_defaults"].get(k, 0)}' for r in results) + " |" for k in knobs]
  return "\n".join(out)


flags.DEFINE_string("repo", None, "repo root holding configs/base.py and experiments/ (default: each package's "
                    "parent directory)")
flags.DEFINE_bool("folder_layers", False, "flat layout: every module in its folder's layer (models/loading.py "
                  "in models, ...) instead of its home's here")
flags.DEFINE_bool("details", False, "also list every counted item")
flags.DEFINE_string("json", None, "write the numbers and details to this JSON file")


def main(argv):
  """argv[1:]: package directories, one column each (default: this repo's memagent_jax)."""
  args = flags.FLAGS
  here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  packages = argv[1:] or [os.path.join(here, "memagent_jax")]
  if args.folder_layers:
    MOVED_MODULE_LAYER.clear()
  results = [measure(p, args.repo) for p in packages]
  cwd = os.getcwd()
  labels = [os.path.relpath(p) if os.path.abspath(p).startswith(cwd + os.sep) else p for p in packages]
  print(table(results, labels))
  if args.details:
    for p, r in zip(packages, results):
      print(f"\n## {p}")
      for k, v in r["details"].items():
        print(f"\n{k}:")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for key, val in items:
          print(f"  {val}" if isinstance(key, int) else f"  {key}: {val}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
