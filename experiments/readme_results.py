"""The README's result tables and the numbers in their sentences, generated from the result JSON files in
docs/results/ (so no number is typed by hand): each block sits between `<!-- generated:NAME -->` and
`<!-- /generated:NAME -->` markers.

  python -m experiments.readme_results          # rewrites README.md's generated blocks
  python -m experiments.readme_results --check  # exit 1 when README.md differs from its results
"""

from __future__ import annotations

import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("docs", "results")
LABELS = {"rl": "RL-MemAgent", "warm_start": "warm start only", "full_attention": "full attention"}
_BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _load(repo: str, name: str) -> dict | None:
  path = os.path.join(repo, RESULTS, name)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def _accuracy_table(rows: list[dict], methods: tuple[str, ...]) -> tuple[list[str], dict]:
  """Markdown lines of accuracy (%) by method and length multiple, and {(method, multiple): accuracy %}."""
  lengths = sorted({r["length"] for r in rows})
  base = lengths[0]
  acc = {(r["method"], r["length"] // base): 100 * r["accuracy"] for r in rows}
  present = [m for m in methods if any(r["method"] == m for r in rows)]
  lines = ["| length | " + " | ".join(f"{n // base}x" for n in lengths) + " |",
           "|---|" + "---|" * len(lengths)]
  for m in present:
    lines.append(f"| {LABELS[m]} | " + " | ".join(f"{acc[(m, n // base)]:.1f}" if (m, n // base) in acc else "-"
                                                  for n in lengths) + " |")
  return lines, acc


def _largest_drop(acc: dict, method: str) -> tuple[float, int]:
  """(points below the method's own 1x at its worst length, that length's multiple)."""
  mine = {x: a for (m, x), a in acc.items() if m == method}
  worst = min(mine, key=lambda x: (mine[x], -x))
  return mine[1] - mine[worst], worst


def _ran(result: dict) -> str:
  """"M min on C CPU cores, commit X" from a result file's own record of its run."""
  parts = []
  if result.get("minutes") is not None:
    parts.append(f"{result['minutes']:.1f} min" + (f" on {result['cpu_cores']} CPU cores" if result.get("cpu_cores") else ""))
  if result.get("commit"):
    parts.append(f"commit {result['commit']}")
  return ", ".join(parts) if parts else "an earlier tree's run (its JSON records no commit; not yet re-run on this one)"


def toy_reproduction(repo: str) -> str:
  result = _load(repo, "toy_reproduction_lookup.json")
  if result is None:
    return "`make reproduce` has not written docs/results/toy_reproduction_lookup.json yet.\n"
  lines, acc = _accuracy_table(result["rows"], ("rl", "warm_start", "full_attention"))
  drop, at = _largest_drop(acc, "rl")
  top = max(x for m, x in acc if m == "rl")
  return "\n".join([
      *lines, "",
      f"RL-MemAgent falls at most {drop:.1f} points below its own 1x ({acc[('rl', 1)]:.1f}%) at any length to "
      f"{top}x (the largest drop at {at}x); the warm start it started from falls from {acc[('warm_start', 1)]:.1f}% "
      f"to {acc[('warm_start', top)]:.1f}%, full attention from {acc[('full_attention', 1)]:.1f}% to "
      f"{acc[('full_attention', top)]:.1f}%. n = {result['n']} per point; this run: {_ran(result)}.", ""])


def seeds(repo: str) -> str:
  result = _load(repo, "toy_reproduction_seeds.json")
  if result is None:
    return "`make seeds` has not been run on this tree yet (no docs/results/toy_reproduction_seeds.json).\n"
  runs = result["runs"]
  top = max(int(n) for n in runs[0]["accuracy"])
  last = [100 * r["accuracy"][str(top)] for r in runs]
  worst = max(r["largest_drop_points"] for r in runs)
  within = sum(r["largest_drop_points"] <= result["tolerance_points"] for r in runs)
  return (f"Across seeds ({', '.join(r['label'] for r in runs)}): {within} of {len(runs)} runs stay within "
          f"{result['tolerance_points']:g} points of their own 1x at every length (the largest drop "
          f"{worst:.1f} points; {min(last):.1f}-{max(last):.1f}% at the longest length); commit "
          f"{result.get('commit') or 'not recorded'}.\n")


def demo(repo: str) -> str:
  result = _load(repo, "toy_reproduction_lookup_demo.json")
  if result is None:
    return "`make demo`'s committed result (docs/results/toy_reproduction_lookup_demo.json) is missing.\n"
  lines, _ = _accuracy_table(result["rows"], ("rl", "warm_start"))
  return "\n".join([*lines, "", f"n = {result['n']} per point; this run: {_ran(result)}.", ""])


BLOCKS = {"toy_reproduction": toy_reproduction, "seeds": seeds, "demo": demo}


def render(text: str, repo: str = REPO) -> str:
  """text with every generated block replaced by what its results say; unknown block names raise."""
  def one(m):
    name = m.group("name")
    if name not in BLOCKS:
      raise ValueError(f"README block generated:{name} has no generator; known: {', '.join(BLOCKS)}")
    return m.group(1) + BLOCKS[name](repo) + m.group(4)
  return _BLOCK.sub(one, text)


def main(argv: list[str]) -> int:
  path = os.path.join(REPO, "README.md")
  with open(path) as f:
    text = f.read()
  new = render(text)
  if "--check" in argv:
    if new != text:
      print("README.md's generated blocks differ from docs/results: run python -m experiments.readme_results")
      return 1
    return 0
  if new != text:
    with open(path, "w") as f:
      f.write(new)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
