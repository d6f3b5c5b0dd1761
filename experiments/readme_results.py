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
_BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z0-9_]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


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
  from configs import toy_memagent
  from experiments import toy_report
  stale = ""
  if result.get("recipe") != toy_report.reproduce_recipe():  # make reproduce's recipe digest on this tree
    stale = (f" **This result is of an earlier recipe** (RL {result['stages']['rl']['steps']} steps); `make "
             "reproduce` has not been run on the current one (configs/toy_memagent.py, RL "
             f"{toy_memagent.get_config('rl,full,lookup').train.steps} steps) yet.")
  return "\n".join([
      *lines, "",
      f"RL-MemAgent falls at most {drop:.1f} points below its own 1x ({acc[('rl', 1)]:.1f}%) at any length to "
      f"{top}x (the largest drop at {at}x); the warm start it started from falls from {acc[('warm_start', 1)]:.1f}% "
      f"to {acc[('warm_start', top)]:.1f}%, full attention from {acc[('full_attention', 1)]:.1f}% to "
      f"{acc[('full_attention', top)]:.1f}%. n = {result['n']} per point; this run: {_ran(result)}.{stale}", ""])


def seeds(repo: str) -> str:
  result = _load(repo, "toy_reproduction_seeds.json")
  if result is None:
    return "`make seeds` has not been run on this tree yet (no docs/results/toy_reproduction_seeds.json).\n"
  runs = result["runs"]
  if not runs:
    return ("No `make seeds` run of the current recipe has finished yet (not run yet: "
            f"{'; '.join(result.get('not_run_yet') or [])}).\n")
  top = max(int(n) for n in runs[0]["accuracy"])
  last = [100 * r["accuracy"][str(top)] for r in runs]
  worst = max(r["largest_drop_points"] for r in runs)
  within = sum(r["largest_drop_points"] <= result["tolerance_points"] for r in runs)
  pending = result.get("not_run_yet") or []
  outside = [f"{r['label']} (down {r['largest_drop_points']:.1f} points; {last[i]:.1f}% at {top} tokens)"
             for i, r in enumerate(runs) if r["largest_drop_points"] > result["tolerance_points"]]
  return (f"Across seeds ({', '.join(r['label'] for r in runs)}): {within} of {len(runs)} runs stay within "
          f"{result['tolerance_points']:g} points of their own 1x at every length (the largest drop "
          f"{worst:.1f} points; {min(last):.1f}-{max(last):.1f}% at the longest length); commit "
          f"{result.get('commit') or 'not recorded'}."
          + (f" Outside: {'; '.join(outside)}." if outside else "")
          + (f" Not run yet: {'; '.join(pending)}." if pending else "") + "\n")


def demo(repo: str) -> str:
  result = _load(repo, "toy_reproduction_lookup_demo.json")
  if result is None:
    return "`make demo`'s committed result (docs/results/toy_reproduction_lookup_demo.json) is missing.\n"
  lines, _ = _accuracy_table(result["rows"], ("rl", "warm_start"))
  return "\n".join([*lines, "", f"n = {result['n']} per point; this run: {_ran(result)}.", ""])


# The configs a user sizes a pod by (tpu_compile_table's rows), and the length of the paper's RL runs.
def _pod_rows() -> list[str]:
  """Each one-host config on the pod it names (configs' POD; Qwen3's with its DAPO variant), then the released
  7B on its v5p-64 and on the newer chips' pods of the same mesh (v6e-64, TPU7x-32), and the 14B on v5p-128."""
  from configs import memagent_qwen2_5_small, memagent_qwen3
  return ([f"{size}_{pod}" for size, pod in memagent_qwen2_5_small.POD.items()]
          + [f"qwen3_{size}_{pod}{variant}" for size, pod in memagent_qwen3.POD.items() for variant in ("", "_dapo")]
          + ["7b_v5p-64", "7b_v6e-64", "7b_tpu7x-32", "14b_v5p-128"])
COMPILE_ROWS = os.path.join(RESULTS, "tpu_compile_rows")
PAPER_STEPS = (150, 400)
FREE_FRACTION = 0.10  # what a config should leave free of each chip's HBM


def _pod_row(name: str, report: dict) -> str:
  """One line: config, pod, fits (with what is free), largest step peak, step seconds and the paper's run."""
  from experiments.benchmarks.tpu_compile_table import ROWS
  config, pod = ROWS[name][0], ROWS[name][1]
  worst_name, worst = max(report["programs"].items(), key=lambda kv: kv[1]["hbm_share"])
  free = 1 - worst["hbm_share"]
  fits = all(p["fits"] for p in report["programs"].values())
  verdict = (f"yes, {100 * free:.0f}% free" if fits and free >= FREE_FRACTION else
             f"tight, {100 * free:.0f}% free" if fits else "no")
  head = (f"| `{config}` | {pod} ({report['chips']} chips) | {verdict} | "
          f"{worst['step_peak_bytes'] / 1024 ** 3:.1f} GiB ({100 * worst['hbm_share']:.0f}%, {worst_name}) |")
  wall = report.get("step_wall_s_range")
  if not wall:  # no published MFU for the chip (TPU7x): the roofline alone, said so
    roofline = report.get("step_estimate_s")
    return head + (" - | - |" if roofline is None else f" roofline {roofline:.0f} (no published MFU) | - |")
  if report.get("regeneration"):  # dynamic sampling: up to its cap of extra generation batches
    wall = [wall[0], report["regeneration"]["step_estimate_worst_s"] / report["utilisation_range"][0]]
  lo, hi = PAPER_STEPS
  return head + f" {wall[0]:.0f}-{wall[1]:.0f} | {lo * wall[0] / 3600:.1f}-{hi * wall[1] / 3600:.1f} |"


def pods(repo: str) -> str:
  """The pod table: each config's compile row from docs/results/tpu_compile_rows/, or the command to make it."""
  lines = [f"| config | pod | fits ({100 * FREE_FRACTION:.0f}% free asked) | step peak / chip (largest) | "
           f"step s at MaxText's MFU | {PAPER_STEPS[0]}-{PAPER_STEPS[1]} steps, hours |", "|---|---|---|---|---|---|"]
  missing = []
  pod_rows = _pod_rows()
  for name in pod_rows:
    report = _load(repo, os.path.join("tpu_compile_rows", f"{name}.json"))
    if report is None:
      missing.append(name)
    else:
      lines.append(_pod_row(name, report))
  if len(missing) == len(pod_rows):
    lines = []
  if missing:
    lines += ["", f"Not compiled yet: {', '.join(missing)} (`python -m experiments.benchmarks.tpu_compile_table "
              f"--folder={COMPILE_ROWS} --rows={','.join(missing)}`)."]
  lines += ["", "Per chip, from the compile rows in docs/results/tpu_compile_rows/ (the compiler's estimate, not a "
            "measured run): the step peak is the largest program's own bytes plus what the trainer keeps beside it; "
            "step seconds are the roofline at MaxText's published MFU range for the chip; the hours are the paper's "
            f"{PAPER_STEPS[0]}-{PAPER_STEPS[1]} RL steps at this config's batch (the one-host Qwen2.5 and Qwen3 configs "
            "take 32 questions per step, the released 7B and 14B 128 and 256). A DAPO variant's range runs from every "
            "group kept from the first generation batch to its cap of extra batches (rl.max_extra_gen_batches), "
            "each re-running the rollout."]
  return "\n".join(lines) + "\n"


def released_7b(repo: str) -> str:
  """Whether the released 7B's update fits its pod as the trainer compiles it (layers scanned), and what the
  same update held with the layers unrolled: as compiled, without XLA's latency-hiding scheduler, and at
  twice the micro-batches (tpu_compile_table's 7b rows)."""
  names = ("7b_v5p-64", "7b_v5p-64_unrolled", "7b_v5p-64_no_lhs", "7b_v5p-64_mb32")
  rows = {n: _load(repo, os.path.join("tpu_compile_rows", f"{n}.json")) for n in names}
  if any(r is None for r in rows.values()):
    return (f"The released 7B's update rows ({', '.join(names)}) are not all compiled yet: "
            "docs/results/tpu_compile.md lists their commands.\n")
  from memagent_jax.experiment.compile_report import layer_loop
  from memagent_jax.models.config import get_preset
  base, unrolled, no_lhs, mb = (rows[n]["programs"]["update"] for n in names)
  layers = get_preset(rows["7b_v5p-64"]["model"]["source"]).num_layers
  hbm, gib = rows["7b_v5p-64"]["hbm_bytes_per_chip"], 1024 ** 3
  verdict = "fits v5p-64" if base["fits"] else "does not fit v5p-64 as the trainer compiles it today"
  return (f"**The released 7B {verdict}:** its update's step peak is {base['step_peak_bytes'] / gib:.1f} GiB per "
          f"chip of {hbm / gib:.0f} ({100 * base['hbm_share']:.0f}%; {base['temp_bytes'] / gib:.1f} GiB of "
          f"temporaries) with the training forwards' layers {layer_loop(rows['7b_v5p-64'])} (`model.scan_layers`, "
          f"one `lax.scan` over {layers - 1} of the {layers} layers' stacked weights, as MaxText runs them). "
          f"Unrolled, the same update needed {unrolled['step_peak_bytes'] / gib:.1f} GiB, "
          f"{unrolled['temp_bytes'] / gib:.1f} GiB of it temporaries that XLA's latency-hiding scheduler keeps "
          f"live across the layers ([jax#20763](https://github.com/jax-ml/jax/issues/20763); its temporaries without that "
          f"scheduler {no_lhs['temp_bytes'] / gib:.1f} GiB; {rows['7b_v5p-64_mb32']['shapes']['micro_batches']} "
          f"micro-batches instead of {rows['7b_v5p-64']['shapes']['micro_batches']}: still "
          f"{mb['step_peak_bytes'] / gib:.1f} GiB).\n")


def gated(repo: str) -> str:
  """Gated against overwrite memory (make gated; its demo scale where the full one has not run), and row
  compaction's wall-time effect (bench_compaction)."""
  def seeds_paired(result) -> list[int]:  # the seeds with both memories finished
    memories = {(r["seed"], r["memory"]) for r in result["runs"]}
    return sorted(s for s, m in memories if m == "gated" and (s, "overwrite") in memories)
  full, demo = _load(repo, "toy_gated.json"), _load(repo, "toy_gated_demo.json")
  result = full if full and seeds_paired(full) else demo or full  # a full run still going: the demo's
  if result is None:
    return "`make gated` has not written docs/results/toy_gated.json (or its demo scale, toy_gated_demo.json) yet.\n"
  runs = {(r["seed"], r["memory"]): r["rows"] for r in result["runs"]}
  paired = seeds_paired(result)
  lines = ["| seed | length | overwrite acc % | gated acc % | decoded tokens / doc (overwrite -> gated) | "
           "s / doc (overwrite -> gated) | gated keep share |", "|---|---|---|---|---|---|---|"]
  for seed in sorted({s for s, _ in runs}):
    ow, gt = runs.get((seed, "overwrite")), runs.get((seed, "gated"))
    if not ow or not gt:
      continue
    base = ow[0]["length"]
    for o, g in zip(ow, gt):
      lines.append(f"| {seed} | {o['length'] // base}x | {100 * o['accuracy']:.1f} | {100 * g['accuracy']:.1f} | "
                   f"{o['reading']['decoded_tokens_per_doc']:.0f} -> {g['reading']['decoded_tokens_per_doc']:.0f} | "
                   f"{o['seconds_per_doc']:.3f} -> {g['seconds_per_doc']:.3f} | "
                   f"{100 * g['reading'].get('keep_frac', 0.0):.0f}% |")
  below = [f"seed {seed} {o['length'] // ow[0]['length']}x" for seed in sorted({s for s, _ in runs})
           if (ow := runs.get((seed, "overwrite"))) and (gt := runs.get((seed, "gated")))
           for o, g in zip(ow, gt) if g["accuracy"] < o.get("ci_low", o["accuracy"])]
  lines += ["", "Gated below overwrite's 95% interval at: " + (", ".join(below) or "no length") + ". Seconds per "
            "document come from runs that shared the 2 cores with other work; only bench_compaction (below) times "
            "one setting against another in one process."]
  if result.get("where_gating_loses"):  # how gated went wrong at the longest length (toy_gated.loss_sentence)
    lines += ["", result["where_gating_loses"] + " (docs/results/toy_gated.md, \"Where gating loses\")"]
  scale = result["scale"]
  text = [*lines, "", f"Scale {scale} (`python -m experiments.toy_gated --scale={scale}`"
          + (", make gated" if scale == "full" else "; `make gated` runs the full recipe") + "), n = "
          f"{runs[(paired[0], 'gated')][0]['n'] if paired else '-'} per point, commit {result.get('commit') or 'not recorded'}; "
          "docs/results/toy_gated" + ("" if scale == "full" else f"_{scale}") + ".md has chunks read and the plot."]
  bench = _load(repo, "bench_compaction.json")
  if bench:
    speed = ", ".join(f"{r['multiple']}x {r['speedup']:.2f}x" for r in bench["rows"])
    text += ["", f"Row compaction alone (the gated policy with agent.decode_buckets 1 against 3, same documents, "
             f"docs/results/bench_compaction.md): seconds per document {speed}; same scores: "
             f"{'yes' if all(r['same_scores'] for r in bench['rows']) else 'no'}."]
  return "\n".join(text) + "\n"


BLOCKS = {"toy_reproduction": toy_reproduction, "seeds": seeds, "demo": demo, "pods": pods, "gated": gated,
          "released_7b": released_7b}


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
