"""docs/results/tpu_compile.md: the paper's configs and small-pod configs compiled for real TPU
topologies on this CPU (`memagent compile`, one command per row), with before/after rows for the
rollout weight layout and the remat policy.

  python -m experiments.tpu_compile_table [--rows=NAME,...] [--out=docs/results/tpu_compile.md]
Each row's JSON is kept in runs/tpu_compile/<row>.json; a row whose JSON exists is not compiled again
(delete it to redo). Takes about an hour on 2 CPU cores for every row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GIB = 1024 ** 3
Q7, Q14, SMALL = "configs/memagent_qwen2_5_7b.py", "configs/memagent_qwen2_5_14b.py", "configs/memagent_qwen2_5_small.py"
# name -> (config, topology, overrides, what the row shows)
ROWS = {
    "7b_v5p-64": (Q7, "v5p-64", [], "released 7B on its mesh (fsdp 8 x tensor 4), replicated rollout layout"),
    "7b_v5p-64_train_layout": (Q7, "v5p-64", ["--config.mesh.rollout=train", "--programs=rollout"],
                               "before: rollouts decode with the FSDP training layout"),
    "7b_v5p-64_remat_none": (Q7, "v5p-64", ["--config.model.remat=none", "--programs=update"], "remat none"),
    "7b_v5p-64_remat_dots": (Q7, "v5p-64", ["--config.model.remat=dots", "--programs=update"], "remat dots"),
    "14b_v5p-128": (Q14, "v5p-128", [], "released 14B on its mesh (fsdp 16 x tensor 4)"),
    "0.5b_v5e-8": (f"{SMALL}:0.5b", "v5e-8", [], "Qwen2.5-0.5B on one v5e host"),
    "0.5b_v5p-8": (f"{SMALL}:0.5b", "v5p-8", ["--config.mesh.fsdp=4"], "Qwen2.5-0.5B on one v5p host"),
    "1.5b_v5e-8": (f"{SMALL}:1.5b", "v5e-8", [], "Qwen2.5-1.5B on one v5e host"),
    "1.5b_v5p-8": (f"{SMALL}:1.5b", "v5p-8", ["--config.mesh.fsdp=4"], "Qwen2.5-1.5B on one v5p host"),
    "3b_v5e-8": (f"{SMALL}:3b", "v5e-8", [], "Qwen2.5-3B on one v5e host (tensor 2)"),
    "3b_v5p-8": (f"{SMALL}:3b", "v5p-8", ["--config.mesh.fsdp=2"], "Qwen2.5-3B on one v5p host (tensor 2)"),
}


def command(name: str, json_path: str) -> list[str]:
  cfg, topology, overrides, _ = ROWS[name]
  return ["memagent", "compile", f"--config={cfg}", f"--topology={topology}", *overrides, f"--json={json_path}"]


def run_row(name: str, folder: str) -> dict:
  path = os.path.join(folder, f"{name}.json")
  if not os.path.exists(path):
    cmd = command(name, path)
    t0 = time.perf_counter()
    print("$ " + " ".join(cmd), flush=True)
    code = subprocess.call([sys.executable, "-m", "memagent_jax.cli", *cmd[1:]])
    if code not in (0, 3) or not os.path.exists(path):
      raise SystemExit(f"row {name}: memagent compile exited {code}")
    with open(path) as f:
      report = json.load(f)
    report["wall_s"] = time.perf_counter() - t0
    with open(path, "w") as f:
      json.dump(report, f, indent=1)
  with open(path) as f:
    return json.load(f)


def table(reports: dict[str, dict]) -> list[str]:
  lines = ["| row | program | peak GiB / chip | % HBM | args | aliased | temp | TFLOP | collective GB | "
           "per-iteration collective MB (innermost loop) | roofline s | compile s |", "|---|" + "---|" * 11]
  for name, r in reports.items():
    for prog, p in r["programs"].items():
      lines.append(f"| {name} | {prog} | {p['peak_bytes'] / GIB:.1f} | {100 * p['hbm_share']:.0f}% | "
                   f"{p['argument_bytes'] / GIB:.2f} | {p['alias_bytes'] / GIB:.2f} | {p['temp_bytes'] / GIB:.1f} | "
                   f"{p['flops'] / 1e12:.0f} | {p['collective_bytes'] / 1e9:.1f} | "
                   f"{p['loop_collective_bytes_per_iteration'] / 1e6:.1f} | {p['roofline_s']:.3g} | {p['compile_s']:.0f} |")
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
  parser.add_argument("--out", default="docs/results/tpu_compile_rows.md")
  parser.add_argument("--folder", default="runs/tpu_compile")
  args = parser.parse_args(argv)
  os.makedirs(args.folder, exist_ok=True)
  reports = {name: run_row(name, args.folder) for name in args.rows.split(",")}
  lines = ["# Compiled for TPU on a 2-core CPU: one `memagent compile` per row", "",
           "Commands (from the repository root, after `make setup`):", ""]
  lines += [f"- `{name}` ({ROWS[name][3]}): `{' '.join(command(name, f'{args.folder}/{name}.json'))}` "
            f"({reports[name].get('wall_s', float('nan')):.0f} s)" for name in reports]
  lines += ["", *table(reports), ""]
  for name, r in reports.items():
    if r.get("step_estimate_s"):
      lines.append(f"- {name}: step estimate (roofline) {r['step_estimate_s']:.0f} s")
  with open(args.out, "w") as f:
    f.write("\n".join(lines) + "\n")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
