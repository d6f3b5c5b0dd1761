"""`memagent compile`: will this config's RL step fit my pod, and how long would it take?

Every program of one step is compiled by the real XLA TPU compiler for compile-only devices of a
topology (runtime/tpu_targets.py) at the config's shapes (compile_plan.py). Per chip it reports
memory (arguments, outputs, donated, temporaries, code: their peak against HBM), matmul FLOPs and
bytes with loop trip counts multiplied in, collectives (in total and per iteration of the innermost
loop: the decode loop for rollouts), and a roofline time. A compiler's estimate, not a measured run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from memagent_jax.experiment import compile_plan, gated_estimate, specs
from memagent_jax.experiment.config_checks import validate_config
from memagent_jax.runtime import hlo_stats, parallel, tpu_targets

GIB = 1024 ** 3


# What well-tuned JAX training reaches of a chip's peak: MaxText's published model FLOPs utilisation per TPU
# generation, the range over its reported dense runs on one slice. v5p: docs "Runtime Performance Results"
# (32B-1160B, v5p-128..7680: 64.0-71.5%); v5e: MaxText/configs/v5e/README.md (16B-128B on 1x v5e-256:
# 56.1-66.9%); v6e: docs/reference/models/tiering.md (Llama 3.1 8B and 70B, Llama 2 70B on 256 chips:
# 43.8-50.3%). A step estimate divides the roofline by it: the step at the share of peak such training
# reaches. No published figure for v4: its estimate stays the roofline alone.
MAXTEXT_MFU = {"v5p": (0.640, 0.715), "v5e": (0.561, 0.669), "v6e": (0.438, 0.503)}


class DoesNotFitError(RuntimeError):
  """A program needs more memory per chip than the chip has (exit code 3 in the CLI)."""


def tpu_mesh(cfg, topology: tpu_targets.Topology):
  """The config's ("data", "fsdp", "tensor") mesh over the topology's compile-only devices."""
  devices = tpu_targets.compile_only_devices(topology)
  try:
    return parallel.make_mesh(specs.mesh_spec(cfg), devices), devices
  except ValueError as e:
    raise ValueError(f"{e} of topology {topology.name} ({len(devices)} devices); set --config.mesh.data/"
                     "fsdp/tensor to fit it") from None


def program_report(compiled, chip: tpu_targets.Chip, *, backend: str) -> dict:
  """The JSON entry `P` of one compiled program (per chip)."""
  mem = compiled.memory_analysis()
  stats = hlo_stats.ProgramStats(compiled.as_text())
  args, out, alias = mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes
  temp, code = mem.temp_size_in_bytes, mem.generated_code_size_in_bytes
  peak = args + out - alias + temp + code
  t = stats.total
  times = {"compute": t.flops / chip.peak_flops, "hbm": t.bytes_accessed / chip.hbm_bandwidth,
           "ici": t.collective_bytes / chip.ici_bandwidth}
  return {"argument_bytes": args, "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp, "code_bytes": code,
          "peak_bytes": peak, "fits": peak <= chip.hbm_bytes, "hbm_share": peak / chip.hbm_bytes,
          "flops": t.flops, "bytes_accessed": t.bytes_accessed, "collective_bytes": t.collective_bytes,
          "collectives": {k: {"count": c, "bytes": b} for k, (c, b) in sorted(t.collectives.items())},
          "loop_collective_bytes_per_iteration": stats.max_loop_collective_bytes(),
          "loops": [{"trip_count": l.trip_count, "innermost": l.innermost,
                     "flops_per_iteration": l.per_iteration.flops, "bytes_per_iteration": l.per_iteration.bytes_accessed,
                     "collective_bytes_per_iteration": l.per_iteration.collective_bytes} for l in stats.loops],
          "roofline_s": max(times.values()), "bound_by": max(times, key=times.get),
          "xla_cost_flops_loop_bodies_once": float((compiled.cost_analysis() or {}).get("flops", 0.0)),
          "attention_backend": backend, "custom_calls": stats.custom_calls(),
          "uncounted_custom_calls": stats.uncounted_custom_calls(), "unknown_trip_counts": stats.unknown_trip_counts()}


_OOM = re.compile(r"Ran out of memory.*?required for HLO temporaries \(([0-9.]+)([KMGT])\)")


def out_of_memory_report(message: str, chip: tpu_targets.Chip, *, backend: str) -> dict:
  """The entry of a program the TPU compiler refused for lack of HBM (its temporaries alone exceed it):
  does not fit, with the temporaries it asked for; nothing else is known."""
  m = _OOM.search(message)
  if not m:
    raise RuntimeError(message)
  temp = float(m.group(1)) * 1024 ** "KMGT".index(m.group(2)) * 1024
  nan = float("nan")
  return {"argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": temp, "code_bytes": 0,
          "peak_bytes": temp, "fits": False, "hbm_share": temp / chip.hbm_bytes, "flops": nan, "bytes_accessed": nan,
          "collective_bytes": nan, "collectives": {}, "loop_collective_bytes_per_iteration": nan, "loops": [],
          "roofline_s": nan, "bound_by": "does not fit", "xla_cost_flops_loop_bodies_once": nan,
          "attention_backend": backend, "custom_calls": {}, "uncounted_custom_calls": {}, "unknown_trip_counts": 0,
          "compile_error": " ".join(message.split())[:500]}


def precheck(facts, chip: tpu_targets.Chip):
  """Fails before compiling when what the trainer holds through the whole step (weights, optimizer
  state, rollout copy, slots, update batches) alone exceeds a chip's HBM."""
  held = sum(facts["alive"].values())
  if held > chip.hbm_bytes:
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in facts["alive"].items())
    raise DoesNotFitError(f"the step holds {held / GIB:.1f} GiB per chip before any program runs ({parts}); "
                          f"{chip.name} has {chip.hbm_bytes / GIB:.1f} GiB")


def step_estimate(reports: dict, shapes: compile_plan.StepShapes) -> tuple[float, list[str]]:
  """Roofline seconds of one whole step (each program x its calls per step) and the assumptions behind them."""
  s = shapes
  total = sum(p["calls_per_step"] * p["live_share"] * p["roofline_s"] for p in reports.values())
  assumptions = [
      f"{s.rollout_calls} agent calls of {s.rollout_rows} trajectories; each reads {s.memory_updates} chunks "
      f"(data.length / agent.chunk_tokens, capped by agent.max_chunks) in blocks of {s.block_chunks}, then answers; "
      "a block's chunks past the document's end are skipped (its roofline scaled by the live share)",
      "every memory update and answer decodes its full token cap (the decode loop's worst case; rows that stop "
      "early end a loop only when all rows of the batch have stopped)",
      f"every group kept and every prompt at its longest; the trainer's planner then makes {s.mini_batches} "
      f"optimizer updates, each of {len(s.width_groups)} width group(s) (rows, prompt width) "
      f"{', '.join(map(str, s.width_groups))} in {s.micro_batches} micro-batches",
      f"{s.logprob_passes} log-prob passes over a width group (recomputed old log-probs after the first update, "
      "reference log-probs when rl.kl_coef > 0)",
      "no shared template prefix in the update (the trainer runs it only where every row of a group starts with "
      "it; it saves work, so this is the costlier case); no dynamic-sampling regeneration (with "
      "rl.dynamic_sampling, the step at its cap is reported apart); no host time, checkpointing or evaluation",
      "roofline per program = max(FLOPs / peak bf16 FLOP/s, bytes / HBM bandwidth, bytes a chip sends over ICI "
      "(ring collectives) / its one-direction ICI bandwidth); programs do not overlap",
      "FLOPs count matmuls (dot, convolution) and attention kernels; loop bodies are multiplied by trip counts "
      "read from the compiled loop conditions"]
  return total, assumptions


def _kind(name: str) -> str:
  return name.split("#")[0]


def compile_step(cfg, topology: tpu_targets.Topology, *, programs=("rollout", "answer", "logprobs", "update"),
                 progress: bool = True, assume: gated_estimate.GatedAssumption | None = None,
                 compiler_options: dict | None = None) -> dict:
  """Compiles the chosen kinds of cfg's step programs for `topology`; returns the report dict (JSON).
  A program's step peak is its own peak plus everything the trainer keeps alive beside it. assume: a gated
  memory's keep rate: the rollout is compiled as every turn writes, then re-costed (gated_estimate.py).
  compiler_options: XLA options every program is compiled with (recorded in the report)."""
  validate_config(cfg)
  if assume is not None:  # the uncompacted rollout: its one decode loop is what the estimate re-costs
    cfg = cfg.copy_and_resolve_references()
    cfg.agent.decode_buckets = 1
  jax.default_backend()  # this host's backend first, so the TPU plugin never becomes the default
  mesh, devices = tpu_mesh(cfg, topology)
  rules = specs.mesh_spec(cfg).axis_rules()
  chip = topology.chip
  built, shapes, facts = compile_plan.build_programs(cfg, mesh, rules, platform="tpu")
  precheck(facts, chip)
  reports = {}
  chosen = [p for p in built if _kind(p.name) in programs]
  bar = tqdm(chosen, desc="compile", unit="program", disable=not progress)
  for prog in bar:
    bar.set_postfix(program=prog.name)
    t0 = time.perf_counter()
    try:
      with parallel.trace_mesh(mesh):  # the splash kernel runs per shard of the mesh
        compiled = prog.fn.lower(*prog.args, **prog.kwargs).compile(compiler_options or None)
      report = program_report(compiled, chip, backend=facts["backend"])
    except jax.errors.JaxRuntimeError as e:  # the TPU compiler refuses a program over HBM
      report = out_of_memory_report(str(e), chip, backend=facts["backend"])
    reports[prog.name] = dict(report, call=prog.note, calls_per_step=prog.calls_per_step, live_share=prog.live_share,
                              compile_s=time.perf_counter() - t0, co_resident=prog.co_resident,
                              program_fits=report["fits"],
                              **step_fit(report["peak_bytes"], prog.co_resident, chip.hbm_bytes))
  complete = len(reports) == len(built) and all(p["fits"] for p in reports.values())
  total, assumptions = step_estimate(reports, shapes) if complete else (None, [])
  m = dict(zip(mesh.axis_names, mesh.devices.shape))
  gated = None
  if assume is not None and "rollout" in reports:
    rows = math.prod(m.get(a, 1) for a in parallel.BATCH_AXES)  # row shards: each compacts its own rows
    gated = gated_estimate.gated_rollout(reports["rollout"], assume=assume, memory_tokens=cfg.agent.memory_tokens,
                                         turns=shapes.block_chunks, group_rows=shapes.rollout_rows // rows,
                                         weight_bytes=facts["rollout_param_bytes"], chip=chip)
    if total is not None:
      p = reports["rollout"]
      gated["step_estimate_s"] = total - p["calls_per_step"] * p["live_share"] * (p["roofline_s"] - gated["roofline_s"])
  regeneration = dynamic_sampling_regeneration(cfg.rl, reports, total)
  mfu = MAXTEXT_MFU.get(chip.name)
  wall = [total / mfu[1], total / mfu[0]] if total is not None and mfu else None
  return {"topology": topology.name, "chip": chip.name, "chips": topology.chips, "devices": len(devices),
          "slices": topology.slices, "hbm_bytes_per_chip": chip.hbm_bytes, "mesh": m,
          "model": {"source": cfg.model.source, "params": facts["params"], "dtype": cfg.model.dtype,
                    "remat": cfg.model.remat, "scan_layers": cfg.model.scan_layers,
                    "rollout_layout": cfg.mesh.rollout},
          "shapes": dataclasses.asdict(shapes), "programs": reports, "step_estimate_s": total,
          "step_wall_s_range": wall, "step_chip_s_range": wall and [w * topology.chips for w in wall],
          "utilisation_range": mfu, "held_through_step": facts["alive"],
          "assumptions": assumptions + facts["notes"] + [
              f"{chip.name} per device: {chip.hbm_bytes / GIB:.1f} GiB HBM, {chip.peak_flops / 1e12:g} TFLOP/s bf16, "
              f"{chip.hbm_bandwidth / 1e9:g} GB/s HBM, {chip.ici_bandwidth / 1e9:g} GB/s ICI"],
          "per_device_weight_bytes": {"train": facts["param_bytes"], "rollout": facts["rollout_param_bytes"]},
          "compiler_options": dict(compiler_options or {}),
          **({"gated": gated} if gated is not None else {}),
          **({"regeneration": regeneration} if regeneration is not None else {})}


def dynamic_sampling_regeneration(rl, reports: dict, total: float | None) -> dict | None:
  """Dynamic sampling draws up to rl.max_extra_gen_batches more generation batches when too few groups
  carry a reward signal (rl/rollout.py's collect): each costs the rollout and answer programs again. -> the
  roofline of one extra batch and the step at the cap (None without dynamic sampling or a step estimate)."""
  if not (rl.dynamic_sampling and rl.max_extra_gen_batches) or total is None:
    return None
  per_batch = sum(p["calls_per_step"] * p["live_share"] * p["roofline_s"] for name, p in reports.items()
                  if _kind(name) in ("rollout", "answer"))
  return {"max_extra_gen_batches": rl.max_extra_gen_batches, "roofline_s_per_extra_batch": per_batch,
          "step_estimate_worst_s": total + rl.max_extra_gen_batches * per_batch}


def layer_loop(report: dict) -> str:
  """How the report's training programs ran the layers: "scanned" or "unrolled" (reports made before
  model.scan_layers existed ran them unrolled)."""
  return "scanned" if report["model"].get("scan_layers", False) else "unrolled"


def _gib(x) -> str:
  return f"{x / GIB:.2f}"


def format_table(report: dict) -> str:
  """The report as a Markdown table, one row per distinct program, per chip: its own peak, what the
  trainer keeps alive beside it, and their sum (the step's peak while it runs)."""
  lines = [f"{report['topology']} ({report['devices']} devices of {report['chip']}, mesh "
           + " x ".join(f"{k} {v}" for k, v in report["mesh"].items())
           + f"), {report['model']['source']} ({report['model']['params'] / 1e9:.2f}B params, "
           f"{report['model']['dtype']}, remat {report['model']['remat']}, layers "
           f"{layer_loop(report)}, rollout layout "
           f"{report['model']['rollout_layout']}"
           + "".join(f", XLA option {k}={v}" for k, v in report.get("compiler_options", {}).items())
           + "); per chip, GiB unless said",
           "", "| program | calls / step | args | out | aliased | temp | own peak | beside it | step peak | % HBM | "
           "TFLOP | GB moved | collective GB | per-iteration collective MB | unknown loops | roofline s | bound | "
           "attention | compile s |",
           "|---|" + "---|" * 18]
  for name, p in report["programs"].items():
    lines.append(f"| {name} | {p['calls_per_step']:g} | {_gib(p['argument_bytes'])} | {_gib(p['output_bytes'])} | "
                 f"{_gib(p['alias_bytes'])} | {_gib(p['temp_bytes'])} | {_gib(p['peak_bytes'])} | "
                 f"{_gib(sum(p['co_resident'].values()))} | {_gib(p['step_peak_bytes'])} | {100 * p['hbm_share']:.0f}% | "
                 f"{p['flops'] / 1e12:.2f} | {p['bytes_accessed'] / 1e9:.1f} | {p['collective_bytes'] / 1e9:.2f} | "
                 f"{p['loop_collective_bytes_per_iteration'] / 1e6:.1f} | {p['unknown_trip_counts']} | "
                 f"{p['roofline_s']:.3g} | {p['bound_by']} | {p['attention_backend']} | {p['compile_s']:.0f} |")
  w = report["per_device_weight_bytes"]
  held = ", ".join(f"{k} {_gib(v)}" for k, v in report["held_through_step"].items())
  lines += ["", f"held through the step, per chip (GiB): {held}; 'beside it' is what of this is not the program's "
            f"own argument; weights per chip: training {_gib(w['train'])} GiB (fp32 master), rollout "
            f"{_gib(w['rollout'])} GiB"]
  for name, p in report["programs"].items():
    lines.append(f"- {name}: {p['call']}")
  if report["step_estimate_s"] is not None:
    line = f"step estimate: roofline {report['step_estimate_s']:.0f} s"
    if report.get("step_wall_s_range"):
      (lo, hi), (clo, chi), (ulo, uhi) = (report["step_wall_s_range"], report["step_chip_s_range"],
                                          report["utilisation_range"])
      line += (f"; at {100 * ulo:.0f}-{100 * uhi:.0f}% of peak (MaxText's training MFU on {report['chip']}) "
               f"{lo:.0f}-{hi:.0f} s wall, {clo:.3g}-{chi:.3g} chip-seconds on {report['chips']} chips")
    lines.append(line)
  if report.get("regeneration"):
    r = report["regeneration"]
    lines.append(f"dynamic sampling: each extra generation batch adds {r['roofline_s_per_extra_batch']:.0f} s of "
                 f"roofline; at rl.max_extra_gen_batches={r['max_extra_gen_batches']} the step is "
                 f"{r['step_estimate_worst_s']:.0f} s (the estimate above: every group kept from the first batch)")
  if report.get("gated"):
    g = report["gated"]
    line = (f"gated memory at keep rate {g['keep_rate']:g} (a {g['form_tokens']}-token keep form, the writing rows "
            f"in {100 * g['bucket_share']:.0f}% of the batch, agent.decode_buckets {g['buckets']}): rollout roofline "
            f"{g['overwrite_roofline_s']:.3g} -> {g['roofline_s']:.3g} s per call ({g['bound_by']})")
    if g.get("step_estimate_s") is not None:
      line += f"; step roofline {report['step_estimate_s']:.0f} -> {g['step_estimate_s']:.0f} s"
    lines.append(line)
  return "\n".join(lines)


def step_fit(own_peak: int, co_resident: dict[str, int], hbm_bytes: int) -> dict:
  """A program's step peak (its own peak plus every buffer the trainer keeps alive beside it) and whether
  that fits a chip of hbm_bytes: what "fits" means in a report."""
  step_peak = own_peak + sum(co_resident.values())
  return dict(step_peak_bytes=step_peak, fits=step_peak <= hbm_bytes, hbm_share=step_peak / hbm_bytes)


def on_chip_with(report: dict, hbm_bytes: int) -> dict:
  """The report's fit decisions redone for a chip of hbm_bytes (what would fit a smaller or larger part)."""
  programs = {name: dict(p, **step_fit(p["peak_bytes"], p["co_resident"], hbm_bytes))
              for name, p in report["programs"].items()}
  return dict(report, hbm_bytes_per_chip=hbm_bytes, programs=programs)


def check_fits(report: dict):
  """Raises DoesNotFitError naming the first program whose step peak (its own peak plus what the trainer
  keeps alive beside it, each named) exceeds the chip's HBM."""
  for name, p in report["programs"].items():
    if not p["fits"]:
      beside = ", ".join(f"{k} {v / GIB:.2f}" for k, v in p["co_resident"].items())
      raise DoesNotFitError(f"{name} needs {p['step_peak_bytes'] / GIB:.1f} GiB per chip ({p['peak_bytes'] / GIB:.2f} "
                            f"its own + {beside}), {report['chip']} has {report['hbm_bytes_per_chip'] / GIB:.1f} GiB")


def _plain(x):
  """JSON-safe: numpy floats as floats, NaN (unknown: a program that did not compile) as null."""
  if isinstance(x, dict):
    return {k: _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  if isinstance(x, (float, np.floating)):
    return None if x != x else float(x)
  return x


def write_json(report: dict, path: str):
  with open(path, "w") as f:
    json.dump(_plain(report), f, indent=1, default=str)
  print(f"wrote {path}", file=sys.stderr)



