"""Table (markdown + JSON) and plot of the toy reproduction (experiments/toy_reproduction.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import platform
import subprocess

import numpy as np

from memagent_jax.runtime.atomic_io import atomic_write, save_figure
from memagent_jax.data import curriculum, toy
from memagent_jax.evaluation.length_sweep import SweepRow
from memagent_jax.rl.metrics import read_jsonl

LABELS = {"rl": "RL-MemAgent", "warm_start": "warm-start only", "full_attention": "full attention"}
COLOURS = {"rl": "C0", "warm_start": "C1", "full_attention": "C3"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyRun:
  """Which toy reproduction run (its flags): where it lives, how its stages train and how it is evaluated;
  one value for the sweep (pickled into its processes) and the report instead of the same arguments in every
  call. Defined here, as experiments/toy_reproduction.py imports this module (not the reverse)."""
  scale: str  # "full" or "demo" (toy_reproduction.SCALES)
  root: str  # the run directory: <root>/<stage>/{checkpoints,export,logs}, <root>/eval
  world: str = "one_key"  # configs/toy_memagent.py WORLDS: one_key or lookup
  n: int  # evaluation documents per length
  max_multiple: int  # the longest evaluated length / the training length (a power of 2)
  eval_seed: int = 1000  # seed of the evaluation documents (+ length) and of their sampling
  seed: int = 0  # training data and training seed of every trained stage
  perturb: float = 0.0  # RL starts from the warm start with every weight times 1 + perturb * N(0, 1)
  steps: dict = dataclasses.field(default_factory=dict)  # {stage: steps} overrides (--steps)
  memory: str = "overwrite"  # the warm start's and RL's memory (configs/toy_memagent.py MEMORIES): overwrite or gated


def _by(rows: list[SweepRow], method: str) -> list[SweepRow]:
  return sorted((r for r in rows if r.method == method), key=lambda r: r.length)


def _curve(root: str, stage: str, key: str) -> tuple[np.ndarray, np.ndarray]:
  path = os.path.join(root, stage, "logs", "metrics.jsonl")
  if not os.path.exists(path):
    return np.zeros(0), np.zeros(0)
  last = {}
  for line in read_jsonl(path):  # a resumed run may log a step twice: keep the last
    if key in line:
      last[line["step"]] = line[key]
  steps = np.array(sorted(last))
  return steps, np.array([last[s] for s in steps], float)


def training_summary(root: str, stages: dict) -> list[str]:
  lines = ["| stage | steps | time in steps | first 10 steps | last 10 steps |", "|---|---|---|---|---|"]
  for stage, info in stages.items():
    key = "train/accuracy" if stage == "rl" else "train/loss"
    _, v = _curve(root, stage, key)
    name = "rollout accuracy" if stage == "rl" else "SFT loss"
    first = f"{name} {v[:10].mean():.3f}" if v.size else "-"
    last = f"{name} {v[-10:].mean():.3f}" if v.size else "-"
    _, secs = _curve(root, stage, "train/step_seconds")  # summed per step: right for resumed runs too
    took = f"not retrained (from {info['base']})" if info.get("base") else f"{secs.sum() / 60:.1f} min"
    lines.append(f"| {stage} | {info['steps']} | {took} | {first} | {last} |")
  return lines


def plot(rows, root: str, path: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
  for method in LABELS:
    rs = _by(rows, method)
    if not rs:
      continue
    x = np.array([r.length / toy.TRAIN_TOKENS for r in rs])
    acc = np.array([r.accuracy for r in rs]) * 100
    ax[0].plot(x, acc, "o-", color=COLOURS[method], label=LABELS[method])
    ax[0].fill_between(x, [r.ci_low * 100 for r in rs], [r.ci_high * 100 for r in rs],
                       color=COLOURS[method], alpha=0.15)
    ax[1].plot(x, [r.seconds_per_doc for r in rs], "o-", color=COLOURS[method], label=LABELS[method])
  for a in ax[:2]:  # beyond it the full-attention model reads a centre-truncated document
    a.axvline(16, color="C3", ls=":", lw=1, label="full-attention context window")
  ax[0].set_xscale("log", base=2), ax[0].set_ylim(-2, 102)
  ax[0].set_xlabel(f"document length / training length ({toy.TRAIN_TOKENS} tokens)")
  ax[0].set_ylabel("accuracy (%), 95% interval"), ax[0].legend(), ax[0].set_title("accuracy vs length")
  ax[1].set_xscale("log", base=2), ax[1].set_yscale("log")
  ax[1].set_xlabel("document length / training length"), ax[1].set_ylabel("seconds per document")
  ax[1].set_title("time per document (batched, 2 CPU cores)"), ax[1].legend()
  steps, reward = _curve(root, "rl", "train/reward_mean")
  _, acc = _curve(root, "rl", "train/accuracy")
  if steps.size:
    ax[2].plot(steps, reward, alpha=0.4, color="C0", label="mean reward (with overlong shaping)")
    ax[2].plot(steps, acc, alpha=0.4, color="C2", label="accuracy of rollouts")
    w = min(5, len(reward))
    ax[2].plot(steps[w - 1:], np.convolve(reward, np.ones(w) / w, "valid"), color="C0", label=f"{w}-step mean")
  ax[2].set_xlabel("RL step"), ax[2].set_ylabel("reward"), ax[2].set_title("Multi-Conv DAPO from the warm start")
  ax[2].legend(fontsize=8)
  fig.tight_layout()
  save_figure(fig, path, dpi=110)
  plt.close(fig)


def _model_line(preset: str) -> str:
  from memagent_jax.models.config import get_preset
  c = get_preset(preset)
  shift = f", token shift {c.token_shift}" if c.token_shift else ""
  return (f"{preset} ({c.num_layers} layers, width {c.hidden_size}, {c.num_heads} heads{shift}, "
          f"{c.num_params / 1e6:.2f}M parameters, trained from scratch)")


def _asked_keys(world: str) -> tuple[str, ...]:
  """The keys the world's questions ask about (its toy task)."""
  from configs import toy_memagent
  return toy.ONE_KEY if toy_memagent.WORLDS[world][0] == toy.ONE_KEY_TASK else toy.ASKED_KEYS


def _training_documents(world: str, scale: str, get_config=None) -> str:
  """A sentence on each stage's training documents where its config's data.options shapes them (the
  evaluated documents are always the world as it is). get_config: variant -> config (default
  configs/toy_memagent.py's)."""
  from configs import toy_memagent
  get_config = get_config or toy_memagent.get_config
  variant = "" if scale == "full" else f",{scale}"
  told = []
  defaults = {k: p.default for k, p in inspect.signature(toy.Makeup).parameters.items()}
  shaping = lambda options: ", ".join(f"{k}={v}" for k, v in sorted(options.items())  # what shapes them
                                     if k not in defaults or v != defaults[k])
  for stage in ("warm_start", "rl"):
    cfg = get_config(f"{stage}{variant},{world}")
    options = cfg.data.get("options") or {}
    phases = curriculum.parse_phases(cfg.data.get("phases", ""), options, cfg.train.steps)
    if phases:  # a curriculum: each step range's documents
      first = 1
      ranges = []
      for until, settings in phases:
        ranges.append(f"steps {first}-{until} {shaping({**options, **settings})}")
        first = until + 1
      told.append(f"{stage} on 1x documents generated with, in turn, " + "; ".join(ranges))
    elif shaping(options):
      told.append(f"{stage} on 1x documents generated with {shaping(options)}")
  if not told:
    return ""
  return f" Training documents: {'; '.join(told)}; every evaluated document is the world as described."


# Settings added after results were recorded, left out of the digest while they hold their no-op value, so
# that the runs recorded before them stay runs of their recipe: (the setting's keys, its no-op value).
LATER_SETTINGS = ((("rl", "gate_rewards", "evidence"), 0.0), (("rl", "dynamic_sampling_filter"), "score"))


def recipe(run: ToyRun) -> str:
  """12 hex digits naming what the run's trained stages train with (each stage config's steps, data,
  teacher, agent, optimizer and RL settings; not its paths or seed): a result of another recipe is not a
  run of this one (toy_seeds)."""
  from configs import toy_memagent
  parts = {}
  for stage in ("warm_start", "rl"):
    cfg = toy_memagent.get_config(f"{stage},{run.scale},{run.world},{run.memory}")
    parts[stage] = {"steps": int(run.steps.get(stage, cfg.train.steps)),
                    **{k: cfg[k].to_dict() for k in ("data", "teacher", "agent", "optim", "rl") if k in cfg}}
    for (*keys, name), no_op in LATER_SETTINGS:
      group = parts[stage]
      for key in keys:
        group = group.get(key, {})
      if group.get(name, no_op) == no_op:
        group.pop(name, None)
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:12]


def finished_rl_rows(paths: list[str], recipe_digest: str) -> tuple[list[SweepRow], dict, str] | None:
  """RL-MemAgent's rows by length, the whole result and its path, from the first of `paths` that exists and is of
  `recipe_digest` (a result without a recipe is of an older one); None where none is."""
  for path in paths:
    if os.path.isfile(path):
      with open(path) as f:
        data = json.load(f)
      if data.get("recipe") == recipe_digest:
        return sorted((SweepRow.from_json(r) for r in data["rows"] if r["method"] == "rl"), key=lambda r: r.length), data, path
  return None


def reproduce_recipe() -> str:
  """make reproduce's recipe (full scale, lookup world), which make seeds repeats."""
  return recipe(ToyRun(scale="full", root="", world="lookup", n=200, max_multiple=256))


def report_name(scale: str, world: str) -> str:
  """Results file stem: toy_reproduction[_<world>][_<scale>] (the default world and full scale bare)."""
  return "toy_reproduction" + ("" if world == "one_key" else f"_{world}") + ("" if scale == "full" else f"_{scale}")


def acc_cell(r: SweepRow) -> str:
  """A row's accuracy in % with its 95% Wilson interval."""
  return f"{r.accuracy * 100:.1f} [{r.ci_low * 100:.0f}, {r.ci_high * 100:.0f}]"


def _sharing(rows) -> str:
  """How the evaluation shared the cores, when methods were swept side by side."""
  k = max((r.concurrent_sweeps for r in rows), default=1)
  if k <= 1:
    return ""
  return (f" Sweeps ran in their own processes, at most {k} busy processes at a time on the {os.cpu_count()} "
          "cores (a sweep beside training or beside another sweep), so a time measured then (JSON rows with "
          "concurrent_sweeps) is that of a shared machine (one sweep alone runs about 1.5x faster; two side "
          "by side finish about 1.3x sooner than one after the other).")


def current_commit() -> str | None:
  """The checkout's commit (with "+" when files differ from it), None outside a git checkout."""
  run = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, timeout=30,
                                  cwd=os.path.dirname(os.path.abspath(__file__)))
  try:
    head = run("rev-parse", "--short=12", "HEAD")
    dirty = run("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return None
  if head.returncode:
    return None
  return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def write_report(rows, stages, run: ToyRun, results_dir: str, *, command: str, seconds: float) -> dict:
  """The run's table (markdown + JSON) and plot in results_dir; their paths."""
  from configs import toy_memagent
  root, scale, world, n, eval_seed, seed, perturb = (run.root, run.scale, run.world, run.n, run.eval_seed,
                                                      run.seed, run.perturb)
  os.makedirs(results_dir, exist_ok=True)
  base = os.path.join(results_dir, report_name(scale, world))
  paths = {"table": base + ".md", "plot": base + ".png", "json": base + ".json"}
  with atomic_write(paths["json"]) as f:
    json.dump({"scale": scale, "world": world, "n": n, "eval_seed": eval_seed, "seed": seed, "perturb": perturb,
               "command": command, "minutes": round(seconds / 60, 1), "commit": current_commit(),
               "cpu_cores": os.cpu_count(), "recipe": recipe(run), "rows": [r.to_json() for r in rows],
               "stages": {k: {"steps": v["steps"]} for k, v in stages.items()}}, f, indent=1)
  plot(rows, root, paths["plot"])
  lengths = sorted({r.length for r in rows})
  get = {(r.method, r.length): r for r in rows}
  methods = [m for m in LABELS if any(r.method == m for r in rows)]
  acc = ["| length (tokens) | × training | " + " | ".join(LABELS[m] for m in methods) + " |",
         "|---|---|" + "---|" * len(methods)]
  cost = ["| length (tokens) | " + " | ".join(f"{LABELS[m]} s/doc" for m in methods) + " | "
          + " | ".join(f"{LABELS[m]} peak RSS MiB" for m in methods) + " |",
          "|---|" + "---|" * (2 * len(methods))]
  for length in lengths:
    cells = [acc_cell(get[(m, length)]) if (m, length) in get else "-" for m in methods]
    acc.append(f"| {length} | {length // toy.TRAIN_TOKENS}x | " + " | ".join(cells) + " |")
    t = [f"{get[(m, length)].seconds_per_doc:.4f}" if (m, length) in get else "-" for m in methods]
    mem = [f"{get[(m, length)].peak_rss_mib:.0f}" if (m, length) in get else "-" for m in methods]
    cost.append(f"| {length} | " + " | ".join(t) + " | " + " | ".join(mem) + " |")
  text = [
      f"# Toy-world reproduction of MemAgent's extrapolation curve ({scale}, world {world})", "",
      f"Command: `{command}` ({seconds / 60:.1f} min in all on {os.cpu_count()} CPU cores, "
      f"{platform.processor() or platform.machine()}).", "",
      f"World: {toy.CHUNK_TOKENS}-token chunks, {toy.MEMORY_TOKENS}-token memory, training documents of "
      f"{toy.TRAIN_TOKENS} tokens (1x), {toy.DISTRACTOR_DENSITY:g} distractor facts per 1000 tokens, up to "
      f"{toy.MAX_OVERRIDES} overrides of the asked key (questions ask about {', '.join(_asked_keys(world))}). "
      f"Policy: {_model_line(toy_memagent.WORLDS[world][1])}, the same for every method. Stages (`configs/toy_memagent.py`): "
      "pretrain (base model: find and copy a fact in short plain texts) -> warm_start (supervised on the "
      "imperfect memory teacher) -> rl (Multi-Conv DAPO, final-answer reward only); full_attention "
      "(supervised on whole training documents) from the same base." + _training_documents(world, scale), "",
      f"Seeds: training data {seed}, model init 0, training {seed}"
      + (f"; RL started from the warm start with every weight times 1 + {perturb:g} N(0, 1)" if perturb else "")
      + f"; evaluation documents {eval_seed} + length, "
      f"sampling {eval_seed}. Evaluation sampling: temperature 0.7, top-p 0.95 (the paper's). "
      f"n = {n} documents per point; accuracy is exact match of the boxed answer, in % with a 95% "
      "Wilson interval. The full-attention model reads whole documents up to its context window of "
      f"{16 * toy.TRAIN_TOKENS + 128} tokens (16x); longer ones are centre-truncated to it, as the "
      "paper's long-context baselines are.", "",
      "## Training", "", *training_summary(root, stages), "",
      "## Accuracy against document length", "", *acc, "",
      "## Time and memory per length", "",
      "Seconds per document: wall time of the whole batched evaluation at that length divided by n "
      "(compilation excluded by a warm-up). Peak RSS: the evaluating process's resident memory, "
      "sampled every 5 ms (it includes the loaded models and earlier allocations)." + _sharing(rows), "", *cost, "",
      f"![accuracy, time and reward]({os.path.basename(paths['plot'])})", "",
      "The learnability probe behind the world's design: `probe_recall.md`.", ""]
  with atomic_write(paths["table"]) as f:
    f.write("\n".join(text))
  return paths
