"""docs/results/tpu_compile.md: the paper's configs and one-host configs compiled for real TPU
topologies on this CPU (`memagent compile`, one command per row), with before/after rows for the
rollout weight layout and the small models' activations pinned to their rows.

  python -m experiments.benchmarks.tpu_compile_table [--rows=NAME,...] [--out=docs/results/tpu_compile.md]
Each row's JSON is kept in docs/results/tpu_compile_rows/<row>.json (committed: the README's pod table reads
them); a row whose JSON exists is not compiled again (delete it to redo), so an interrupted run resumes.
Several hours on 2 CPU cores for every row; the released 7B and 14B (layers scanned) take about 6 minutes and
9 GiB of host memory each, the 7B unrolled 16 minutes and more than this host's 24 GiB (HOST_NOTES).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from configs import memagent_qwen2_5_small, memagent_qwen3
from experiments import toy_report
from memagent_jax.runtime import tpu_targets

GIB = 1024 ** 3
Q7, Q14, SMALL = "configs/memagent_qwen2_5_7b.py", "configs/memagent_qwen2_5_14b.py", "configs/memagent_qwen2_5_small.py"
QWEN3 = "configs/memagent_qwen3.py"
UNROLLED = "--config.model.scan_layers=false"  # the training forwards' layers as a Python loop (before scan_layers)
SCANNED = "--config.model.scan_layers=true"  # the one-host configs unroll them
# The one-host configs, each on the pod it names (configs' POD).
_ONE_HOST = {
    **{f"{size}_{pod}": (f"{SMALL}:{size}", pod, [], f"Qwen2.5-{size.upper()} on the one host it is sized for")
       for size, pod in memagent_qwen2_5_small.POD.items()},
    **{f"qwen3_{size}_{pod}": (f"{QWEN3}:{size}", pod, [], f"Qwen3-{size.upper()} on the one host it is sized for")
       for size, pod in memagent_qwen3.POD.items()},
}
# name -> (config, topology, overrides, what the row shows)
ROWS = {
    "7b_v5p-64": (Q7, "v5p-64", [], "released 7B on its mesh (fsdp 8 x tensor 4), replicated rollout layout"),
    "7b_v5p-64_train_layout": (Q7, "v5p-64", ["--config.mesh.rollout=train", "--programs=rollout"],
                               "before: rollouts decode with the FSDP training layout"),
    "14b_v5p-128": (Q14, "v5p-128", [], "released 14B on its mesh (fsdp 16 x tensor 4)"),
    "0.5b_v5p-8": (f"{SMALL}:0.5b", "v5p-8", ["--config.mesh.fsdp=4"], "Qwen2.5-0.5B on one v5p host"),
    "1.5b_v5p-8": (f"{SMALL}:1.5b", "v5p-8", ["--config.mesh.fsdp=2"], "Qwen2.5-1.5B on one v5p host (tensor 2)"),
    "1.5b_v5e-8_fsdp8": (f"{SMALL}:1.5b", "v5e-8", ["--config.mesh.fsdp=8", "--config.mesh.tensor=1"],
                         "Qwen2.5-1.5B on v5e-8 on its before row's mesh (fsdp 8; the config's is fsdp 4 x tensor 2)"),
    "3b_v5e-8": (f"{SMALL}:3b", "v5e-8", [], "Qwen2.5-3B on one v5e host (tensor 2)"),
    "3b_v5p-8": (f"{SMALL}:3b", "v5p-8", ["--config.mesh.fsdp=2"], "Qwen2.5-3B on one v5p host (tensor 2)"),
    "7b_v6e-64": (Q7, "v6e-64", [], "released 7B on 64 v6e chips (data 2 x fsdp 8 x tensor 4)"),
    "7b_tpu7x-32": (Q7, "tpu7x-32", [], "released 7B on 16 TPU7x (Ironwood) chips, 32 devices"),
    "7b_v5p-64_unrolled": (Q7, "v5p-64", [UNROLLED], "released 7B with its training forwards' layers unrolled"),
    "7b_v5p-64_mb32": (Q7, "v5p-64", ["--programs=update", UNROLLED, "--config.rl.micro_batches=32"],
                       "the released 7B's update, layers unrolled, in 32 micro-batches (3 memory rows per chip in "
                       "each, not 6)"),
    "7b_v5p-64_no_lhs": (Q7, "v5p-64", ["--programs=update", UNROLLED,
                                        "--xla-option=xla_tpu_enable_latency_hiding_scheduler=false"],
                         "the released 7B's update, layers unrolled, compiled without XLA's latency-hiding scheduler"),
    "0.5b_v5e-8_no_lhs": (f"{SMALL}:0.5b", "v5e-8", ["--programs=update", UNROLLED,
                                                     "--xla-option=xla_tpu_enable_latency_hiding_scheduler=false"],
                          "Qwen2.5-0.5B's update on v5e-8, layers unrolled, without XLA's latency-hiding scheduler"),
    "7b_v5p-64_gated": (Q7, "v5p-64", ["--programs=rollout", "--config.agent.memory=gated",
                                       "--config.agent.decode_buckets=3", "--assume.keep_rate=0.8"],
                        "released 7B's rollout re-costed for a gated memory keeping 80% of memory turns"),
    **_ONE_HOST,
    **{f"{name}_scanned": (config, pod, [SCANNED], f"{what}, the training forwards' layers scanned")
       for name, (config, pod, _, what) in _ONE_HOST.items()},
    **{f"qwen3_{size}_{pod}_dapo": (f"{QWEN3}:{size},dapo", pod, [],
                                    f"Qwen3-{size.upper()}'s DAPO variant (no KL: no reference weights) on the same host")
       for size, pod in memagent_qwen3.POD.items()},
}
# Rows this 2-core, 24 GiB host could not compile with the current report: why, as measured.
HOST_LIMITS: dict[str, str] = {}
# Rows compiled here only with help: how, as measured (printed beside the row's command).
_BESIDE_TOY_RUNS = ("compiled beside two toy RL runs (make gated) on the same 2 cores: its wall time is about three "
                    "times a quiet compile's (the released 7B's on v5p-64, alone: 392 s)")
HOST_NOTES = {
    "7b_v6e-64": _BESIDE_TOY_RUNS,
    "7b_v5p-64_unrolled": "its update programs fill the host's 24 GiB: compiled with a 32 GiB swap file added (`fallocate "
                 "-l 32G f && mkswap f && swapon f`; resident + swapped peaked at 25.6 GB, read from /proc every "
                 "10 s); without swap the kernel's OOM killer stopped it at 24.3 GB on 2026-12-02",
}
# Rows compiled before a change, kept as JSON in the folder: after row -> its before (the same config and mesh).
BEFORE_ROWS = {"0.5b_v5e-8": "0.5b_v5e-8_before", "1.5b_v5e-8_fsdp8": "1.5b_v5e-8_before", "3b_v5e-8": "3b_v5e-8_before"}


def _version(package: str) -> str:
  """An installed distribution's version (libtpu lives in .venv/libtpu, outside site-packages: see the Makefile)."""
  from importlib import metadata
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    found = list(metadata.distributions(name=package, path=[tpu_targets.LIBTPU_DIR]))
    return found[0].version if found else "unknown"


def _commit() -> str:
  """The checkout's commit ("+" when the compiled tree differs from it: toy_report.current_commit)."""
  return toy_report.current_commit() or "unknown"


def command(name: str, json_path: str) -> list[str]:
  cfg, topology, overrides, _ = ROWS[name]
  return ["memagent", "compile", f"--config={cfg}", f"--topology={topology}", *overrides, f"--json={json_path}"]


def run_row(name: str, folder: str) -> dict:
  path = os.path.join(folder, f"{name}.json")
  if not os.path.exists(path):
    cmd = command(name, path)
    commit = _commit()  # the code compiled: read before, as later commits may land while it compiles
    t0 = time.perf_counter()
    print("$ " + " ".join(cmd), flush=True)
    child = subprocess.Popen([sys.executable, "-m", "memagent_jax.cli", *cmd[1:]])
    _, status, usage = os.wait4(child.pid, 0)  # the child's own peak resident memory (Linux: KiB)
    code = child.returncode = os.waitstatus_to_exitcode(status)
    if code not in (0, 3) or not os.path.exists(path):
      raise SystemExit(f"row {name}: memagent compile exited {code}")
    with open(path) as f:
      report = json.load(f)
    report["wall_s"] = time.perf_counter() - t0
    report["host_peak_rss_gib"] = usage.ru_maxrss * 1024 / GIB
    report["commit"] = commit
    with open(path, "w") as f:
      json.dump(report, f, indent=1)
  with open(path) as f:
    return json.load(f)


def _host_cost(name: str, report: dict) -> str:
  """What the row's compile took on this 2-core host: wall time, and peak host memory where measured."""
  text = f"commit {report.get('commit', 'unknown')}, {report.get('wall_s', float('nan')):.0f} s wall on 2 cores"
  if "host_peak_rss_gib" in report:
    text += f", {report['host_peak_rss_gib']:.1f} GiB peak resident"
  if name.endswith("_unrolled") and "scan_layers" not in report["model"]:
    text += (f"; compiled as the {name.removesuffix('_unrolled')} row before `model.scan_layers` existed, when "
             "the training forwards' layers were unrolled: the programs of this row's command")
  return text + (f"; {HOST_NOTES[name]}" if name in HOST_NOTES else "")


def _row_note(p: dict) -> str:
  """A program refused by the compiler: only its temporaries are known."""
  return "" if p["flops"] is not None else " (refused by the compiler: temporaries only)"


def _fmt(x, fmt: str, scale: float = 1.0) -> str:
  return "-" if x is None else format(x / scale, fmt)


def table(reports: dict[str, dict]) -> list[str]:
  """Every distinct program of each row's step, per chip (per device on v4 / TPU7x, whose devices are cores)."""
  lines = ["| row | program | calls / step | own peak GiB | beside it GiB | step peak GiB | % HBM | temp GiB | "
           "TFLOP | collective GB sent | unknown loops | roofline s | compile s |", "|---|" + "---|" * 12]
  for name, r in reports.items():
    for prog, p in r["programs"].items():
      lines.append(f"| {name} | {prog}{_row_note(p)} | {p['calls_per_step']:g} | {p['peak_bytes'] / GIB:.2f} | "
                   f"{sum(p['co_resident'].values()) / GIB:.2f} | {p['step_peak_bytes'] / GIB:.2f} | "
                   f"{100 * p['hbm_share']:.0f}%{'' if p['fits'] else ' (does not fit)'} | {p['temp_bytes'] / GIB:.2f} | "
                   f"{_fmt(p['flops'], '.0f', 1e12)} | {_fmt(p['collective_bytes'], '.1f', 1e9)} | "
                   f"{p['unknown_trip_counts']} | {_fmt(p['roofline_s'], '.3g')} | {p['compile_s']:.0f} |")
  return lines


def matmul_step(r: dict) -> float:
  """The step's seconds if every program ran its FLOPs at the chip's peak and nothing else cost time."""
  peak = tpu_targets.CHIPS[r["chip"]].peak_flops
  return sum(p["calls_per_step"] * p["live_share"] * p["flops"] / peak for p in r["programs"].values())


def step_flops(r: dict) -> float:
  """FLOPs of one whole step over every device."""
  return r["devices"] * sum(p["calls_per_step"] * p["live_share"] * p["flops"] for p in r["programs"].values())


def steps(reports: dict[str, dict]) -> list[str]:
  """One line per row: whether the step fits, its largest step peak, the roofline, the step at MaxText's
  MFU range in wall and chip seconds, and its FLOPs at peak alone."""
  lines = ["| row | chips | fits | largest step peak (% HBM) | roofline s | at MaxText's MFU: wall s | chip-s | "
           "FLOPs at peak alone s |", "|---|---|---|---|---|---|---|---|"]
  for name, r in reports.items():
    worst_name, worst = max(r["programs"].items(), key=lambda kv: kv[1]["hbm_share"])
    fits = "yes" if all(p["fits"] for p in r["programs"].values()) else "no"
    head = f"| {name} | {r['chips']} | {fits} | {worst_name}: {100 * worst['hbm_share']:.0f}% |"
    if r.get("step_estimate_s") is None:
      lines.append(head + " - | - | - | - |")
      continue
    wall, chip_s = r.get("step_wall_s_range"), r.get("step_chip_s_range")
    regen = r.get("regeneration")  # dynamic sampling: the roofline at its cap of extra generation batches
    roofline = f"{r['step_estimate_s']:.0f}" + (f" (at {regen['max_extra_gen_batches']} extra generation batches: "
                                                 f"{regen['step_estimate_worst_s']:.0f})" if regen else "")
    lines.append(head + f" {roofline} | {f'{wall[0]:.0f}-{wall[1]:.0f}' if wall else '-'} | "
                 f"{f'{chip_s[0]:.3g}-{chip_s[1]:.3g}' if chip_s else '-'} | {matmul_step(r):.0f} |")
  return lines


def _saved_block_inputs(r: dict) -> str:
  """What full remat keeps per chip for one micro-batch of the widest group: layers x [rows, T, E] bf16."""
  from memagent_jax.models.config import get_preset
  cfg, s = get_preset(r["model"]["source"]), r["shapes"]
  rows = s["width_groups"][-1][0] // s["micro_batches"] // (r["mesh"].get("data", 1) * r["mesh"].get("fsdp", 1))
  tokens = s["width_groups"][-1][1] + s["response_width"]
  layer = rows * tokens * cfg.hidden_size * 2
  return f"{cfg.num_layers} x {layer / GIB:.2f} GiB for {rows} rows of {tokens:,} tokens"


def _gathers(pairs) -> str:
  """" (<row>: X GB of all-gathers per update instead of Y)" for the pair whose all-gathers grow the most."""
  def gathered(r):
    return r["programs"]["update"].get("collectives", {}).get("all-gather", {}).get("bytes", 0.0)
  rows = [(gathered(s) / gathered(u), n, gathered(s), gathered(u)) for n, s, u in pairs if gathered(u)]
  if not rows:
    return ""
  _, name, scanned, unrolled = max(rows)
  return f" ({name}: {scanned / 1e9:.0f} GB of all-gathers per update instead of {unrolled / 1e9:.0f})"


def layer_loops(reports: dict[str, dict]) -> list[str]:
  """Each config compiled with its training forwards' layers scanned and unrolled (its row and a `_scanned` or
  `_unrolled` twin): the update's temporaries, collectives and roofline, the step's largest peak and roofline."""
  from memagent_jax.experiment.compile_report import layer_loop
  pairs = []
  for name, r in reports.items():  # a config's row and its twin with the other layer loop
    twin = reports.get(f"{name}_unrolled") or reports.get(f"{name}_scanned")
    if twin is not None:
      pairs.append((name, *sorted((r, twin), key=lambda x: layer_loop(x) == "unrolled")))  # scanned first
  if not pairs:
    return []
  out = ["## Layers scanned or unrolled", "",
         "Each config's step with the training and log-prob forwards' layers under one lax.scan (`model.scan_layers`, "
         "the default, and the released 7B's and 14B's) and unrolled (`false`, the one-host configs'; decoding is "
         "unrolled either way). Scanned, "
         "XLA holds one layer's recomputed activations at a time, which is what lets the released 7B fit; the "
         "weights are stacked for the scan in every forward (one more bf16 copy, and its gradient, per chip), and "
         f"the scanned update moves more bytes: more all-gathers of the FSDP-sharded weights{_gathers(pairs)} and "
         "more HBM traffic, which costs the one-host configs' HBM-bound updates time (the roofline columns); on few "
         "chips the stacked copy of a large model costs memory too (Qwen3-8B on 4 v5p chips). Hence the one-host "
         "configs unroll; storing the weights stacked (no copy per forward) is open work. Per chip; update = the "
         "largest update program; the row column names the config's own row.", "",
         "| row | update temp GiB scanned | unrolled | update collective GB scanned | unrolled | update roofline s "
         "scanned | unrolled | largest step peak scanned | unrolled | step roofline s scanned | unrolled |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
  cell = lambda x, f: "-" if x is None else format(x, f)
  for name, scanned, unrolled in pairs:
    cols = []
    for key, scale, f in (("temp_bytes", GIB, ".2f"), ("collective_bytes", 1e9, ".0f"), ("roofline_s", 1, ".2f")):
      for r in (scanned, unrolled):
        update = max((p for n, p in r["programs"].items() if n.startswith("update")), key=lambda p: p["temp_bytes"])
        cols.append(cell(None if update[key] is None else update[key] / scale, f))
    for r in (scanned, unrolled):
      worst_name, worst = max(r["programs"].items(), key=lambda kv: kv[1]["hbm_share"])
      cols.append(f"{worst['step_peak_bytes'] / GIB:.1f} GiB ({100 * worst['hbm_share']:.0f}%, {worst_name})")
    cols += [cell(r.get("step_estimate_s"), ".0f") for r in (scanned, unrolled)]
    out.append(f"| {name} | " + " | ".join(cols) + " |")
  return out + [""]


def _mesh(report: dict) -> str:
  """The row's mesh as the configs write it (axes of size 1 left out)."""
  return " x ".join(f"{axis} {size}" for axis, size in report["mesh"].items() if size > 1) or "one device"


def comparisons(reports: dict[str, dict]) -> list[str]:
  """The before/after sections (small models' activations pinned to rows, rollout layout) and the 7B step beside
  the reference's on a common basis."""
  from memagent_jax.experiment.compile_report import layer_loop  # lazy: jax only when the page is written
  out = []
  pairs = [(n, b) for n, b in BEFORE_ROWS.items() if n in reports and b in reports]
  if pairs:
    out += ["## Small models on one host: before and after pinning activations to their rows", "",
            "The after rows as last compiled (their layers column: a row recompiled since `model.scan_layers` also "
            "runs the training forwards' layers scanned).", "",
            "| row | mesh | layers after | program | temp GiB before | after | step peak GiB before | after | "
            "collective GB before | after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for after_name, before_name in pairs:
      a, b = reports[after_name], reports[before_name]
      for prog, pa in a["programs"].items():
        pb = b["programs"].get(prog)
        if pb and prog.startswith(("update", "logprobs")):
          out.append(f"| {after_name} | {_mesh(a)} | {layer_loop(a)} | {prog} | {pb['temp_bytes'] / GIB:.2f} | {pa['temp_bytes'] / GIB:.2f} | "
                     f"{pb['step_peak_bytes'] / GIB:.2f} | {pa['step_peak_bytes'] / GIB:.2f} | "
                     f"{_fmt(pb['collective_bytes'], '.1f', 1e9)} | {_fmt(pa['collective_bytes'], '.1f', 1e9)} |")
    out.append("")
  after, before = reports.get("7b_v5p-64"), reports.get("7b_v5p-64_train_layout")
  if after and before:
    w_after, w_before = after["per_device_weight_bytes"]["rollout"], before["per_device_weight_bytes"]["rollout"]
    a, b = after["programs"]["rollout"], before["programs"]["rollout"]
    out += ["## Rollout weight layout (7B, v5p-64, one memory block)", "",
            "| layout | rollout weights / chip GiB | collective bytes sent per decoded token MB | % of the weights / chip | "
            "collective GB per block | own peak GiB | roofline s |", "|---|---|---|---|---|---|---|"]
    for name, p, w in (("train (FSDP)", b, w_before), ("replicated (the configs')", a, w_after)):
      out.append(f"| {name} | {w / GIB:.2f} | {p['loop_collective_bytes_per_iteration'] / 1e6:.1f} | "
                 f"{100 * p['loop_collective_bytes_per_iteration'] / w:.1f}% | {p['collective_bytes'] / 1e9:.0f} | "
                 f"{p['peak_bytes'] / GIB:.1f} | {p['roofline_s']:.1f} |")
    out.append("")
  variants = [(n, reports[n]) for n in ("7b_v5p-64", "7b_v5p-64_unrolled", "7b_v5p-64_mb32", "7b_v5p-64_no_lhs")
              if n in reports]
  if after and len(variants) > 1:
    out += ["## What fills the released 7B's update (v5p-64)", "",
            "The update's temporaries, per chip, as the trainer runs it (layers scanned) and with the training "
            "forwards' layers unrolled, as compiled before `model.scan_layers`, in that form and in two variants of "
            f"one knob each. Full remat keeps one [rows, T, E] block input per layer ({_saved_block_inputs(after)}); "
            "the rest is what XLA holds at once. Unrolled, XLA's latency-hiding scheduler (the default) keeps the "
            "recomputed activations of several layers live together (jax-ml/jax#20763); halving the rows per "
            "micro-batch barely moves them. Under one lax.scan it schedules one layer's body, so one layer's are.", "",
            "| row | layers | micro-batches | XLA options | temp GiB | own peak GiB | step peak GiB | % HBM | fits | "
            "roofline s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in variants:
      p = r["programs"]["update"]
      opts = ", ".join(f"{k}={v}" for k, v in r.get("compiler_options", {}).items()) or "-"
      out.append(f"| {name} | {layer_loop(r)} | {r['shapes']['micro_batches']} | {opts} | {p['temp_bytes'] / GIB:.1f} | "
                 f"{p['peak_bytes'] / GIB:.1f} | "
                 f"{p['step_peak_bytes'] / GIB:.1f} | {100 * p['hbm_share']:.0f}% | {'yes' if p['fits'] else 'no'} | "
                 f"{p['roofline_s']:.1f} |")
    out.append("")
  out += layer_loops(reports)
  gated_row = reports.get("7b_v5p-64_gated", {})
  gated = gated_row.get("gated")
  if gated:
    p = gated_row["programs"]["rollout"]  # compiled as every turn writes: the overwrite rollout
    step = after.get("step_estimate_s") if after else None
    ours = after["programs"]["rollout"] if after else p
    gated_step = step - ours["calls_per_step"] * ours["live_share"] * (p["roofline_s"] - gated["roofline_s"]) if step else None
    cell = lambda x: "-" if x is None else f"{x:.0f}"
    out += ["## Gated memory at pod scale (7B, v5p-64)", "",
            f"The released 7B's rollout re-costed for a gated memory that keeps {100 * gated['keep_rate']:.0f}% of "
            f"memory turns (a {gated['form_tokens']}-token keep form; the writing rows compacted into "
            f"{100 * gated['bucket_share']:.0f}% of each device's batch, agent.decode_buckets {gated['buckets']}; "
            "experiment/gated_estimate.py): a model on top of the compiled decode loop, not a compiled gated program. "
            "The step column needs the 7b_v5p-64 row.", "",
            "| | TFLOP / chip | HBM GB / chip | roofline s per memory block | bound | step roofline s |",
            "|---|---|---|---|---|---|",
            f"| overwrite | {p['flops'] / 1e12:.0f} | {p['bytes_accessed'] / 1e9:.0f} | {p['roofline_s']:.1f} | "
            f"{p['bound_by']} | {cell(step)} |",
            f"| gated, keep {gated['keep_rate']:g} | {gated['flops'] / 1e12:.0f} | {gated['bytes_accessed'] / 1e9:.0f} | "
            f"{gated['roofline_s']:.1f} | {gated['bound_by']} | {cell(gated_step)} |", ""]
  if after and after.get("step_estimate_s"):
    flops = step_flops(after)
    gpus, peak, step_s, update_s = REFERENCE
    tpu_peak = after["chips"] * tpu_targets.CHIPS["v5p"].peak_flops
    out += ["## The released 7B step beside the reference, on a common basis", "",
            f"Our count of one step's FLOPs over every chip: **{flops / 1e15:,.0f} PFLOP**. The reference trains the "
            f"same config on {gpus} H100-class GPUs ({peak / 1e12:g} TFLOP/s dense bf16 each, {gpus * peak / 1e15:.1f} "
            f"PF/s together) in about {step_s} s per step, {update_s} s of it in the update, as a user measured it "
            f"(github.com/BytedTsinghua-SIA/MemAgent/issues/31): at that step time these FLOPs would use "
            f"{100 * flops / (gpus * peak * step_s):.0f}% of its peak; at the authors' figure as that issue quotes it "
            f"(issues/8: 150 steps in about 32 GPU-days, {AUTHORS_STEP_S:.0f} s per step on 32 GPUs) "
            f"{100 * flops / (gpus * peak * AUTHORS_STEP_S):.0f}%. {after['chips']} v5p chips have {tpu_peak / 1e15:.1f} PF/s of bf16 peak, so the step needs "
            f"at least {flops / tpu_peak:.0f} s there at 100% and the range above at MaxText's MFU. This compares "
            "FLOP counts and hardware peaks, not measured speed: neither side was run on the same basis.", ""]
  return out


# The released 7B trainer's step as its users measured it: github.com/BytedTsinghua-SIA/MemAgent/issues/31 (its
# run_memory_7B.sh settings on 32 H100s, 4 nodes x 8: about 2,400 s per step, about 2,100 s of it in the actor
# update); the authors' figure as that issue quotes it (issues/8: 150 steps in about 32 GPU-days; on 32 GPUs)
# is about 580 s per step, 4x less (the issue's own arithmetic: its run takes about 128 GPU-days). H100 SXM dense bf16 peak 989 TFLOP/s.
REFERENCE = (32, 989e12, 2400, 2100)
AUTHORS_STEP_S = 32 * 24 * 3600 / 32 / 150  # 32 GPU-days over 32 GPUs, 150 steps: 576 s


def define_flags():
  """The command line's flags, defined only when run as a script: experiments.readme_results imports ROWS
  beside other scripts' flags of the same names (--out)."""
  flags.DEFINE_string("rows", ",".join(ROWS), "comma-separated row names")
  flags.DEFINE_string("out", "docs/results/tpu_compile.md", "the markdown written")
  flags.DEFINE_string("folder", "docs/results/tpu_compile_rows",
                      "each row's JSON (a row whose JSON exists is not compiled again)")
  flags.DEFINE_bool("compile", True, "compile the rows whose JSON is missing (--nocompile: the page from the JSON "
                    "there is, the missing rows listed with their commands)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  os.makedirs(args.folder, exist_ok=True)
  names = args.rows.split(",")
  missing = [n for n in names if not args.compile and not os.path.exists(os.path.join(args.folder, f"{n}.json"))]
  reports = {name: run_row(name, args.folder) for name in names if name not in missing}
  for before in [BEFORE_ROWS[n] for n in names if n in BEFORE_ROWS and n in reports]:  # compiled earlier: never here
    path = os.path.join(args.folder, f"{before}.json")
    if os.path.exists(path):
      with open(path) as f:
        reports[before] = json.load(f)
  lines = ["# The RL step compiled for TPU pods on a 2-core CPU", "",
           f"Every number below comes from the real XLA TPU compiler (libtpu {_version('libtpu')}, jax "
           f"{_version('jax')}) run on this CPU for compile-only devices: `memagent compile`, one command per row, "
           f"each at the commit named beside it under Commands (page regenerated at {_commit()}). A compiler's estimate, not a measured run (README, \"Will it fit my pod?\"). "
           "Regenerate with `python -m experiments.benchmarks.tpu_compile_table`.", "",
           "- **Programs:** every distinct program the step runs, as the reader and the trainer's planner make them "
           "(memory block, final answer; per width group a log-prob pass; per mini-batch an update, the first with "
           "old log-probs = current), at a worst-case step (every group kept, every prompt at its longest).",
           "- **Memory, per chip** (per device on TPU7x, a chip's two dies): a program's own peak (arguments + "
           "outputs - aliased + temporaries + code), what the trainer keeps alive beside it (fp32 weights, "
           "optimizer state, rollout copy, conversation slots, every mini-batch's rows), and their sum, the step "
           "peak, which decides \"fits\".",
           "- **FLOPs:** matmuls and the splash attention kernels (from their shapes, causal), loop bodies times "
           "their trip counts. **Collectives:** the bytes each chip sends in a ring over its group (all-reduce "
           "2(n-1)/n, gathers and scatters (n-1)/n), every operand of combined ones; over Google's per-chip "
           "one-direction ICI figure (runtime/tpu_targets.py).",
           "- **Step:** each program's roofline (max of FLOPs / peak, bytes / HBM bandwidth, collective bytes / "
           "ICI) times its calls per step; then at MaxText's published training MFU for the chip family "
           "(compile_report.MAXTEXT_MFU) as a range, in wall and chip seconds.", "",
           "## Steps", "", *steps(reports), "",
           "## Every program of a step, per chip", "", *table(reports), ""]
  lines += comparisons(reports)
  if missing:
    lines += ["## Not compiled on this version yet", "",
              *[f"- `{name}` ({ROWS[name][3]}): `{' '.join(command(name, f'{args.folder}/{name}.json'))}`"
                + (f"; {HOST_LIMITS[name]}" if name in HOST_LIMITS else "") for name in missing], ""]
  lines += ["## Commands", ""]
  lines += [f"- `{name}` ({ROWS[name][3]}): `{' '.join(command(name, f'{args.folder}/{name}.json'))}` "
            f"({_host_cost(name, reports[name])})" for name in reports if name in ROWS]
  lines += [f"- `{name}`: the row's command at commit {reports[name].get('commit', 'unknown')}, before activations "
            f"were pinned to their rows between blocks (models/attention.constrain_rows; `{args.folder}/{name}.json`, "
            "kept)" for name in reports if name not in ROWS]
  with open(args.out, "w") as f:
    f.write("\n".join(lines) + "\n")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
