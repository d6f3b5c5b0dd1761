"""The toy-world reproduction of MemAgent's headline curve: warm start -> Multi-Conv DAPO, two
baselines, accuracy / time / memory against document length, a table and a plot.

  python -m experiments.toy_reproduction --scale=full     # make reproduce (25 min from the committed base, 2 cores)
  python -m experiments.toy_reproduction --scale=demo     # make demo (<= 10 min)

Stages (each resumes from its checkpoints, eval from its finished lengths; --fresh starts over):
  pretrain        the base model: find and copy a fact in short plain texts (toy_recall teacher)
  warm_start      from the base, supervised on the imperfect memory teacher's conversations
  full_attention  from the base, supervised to answer from whole training documents
  rl              Multi-Conv DAPO from the exported warm start, final-answer reward only
  eval            1x .. max_multiple x the training length for the three policies, n per point
Everything is seeded: the same flags give the same table.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time

import jax
import numpy as np
from absl import app, flags, logging

from configs import toy_memagent
from experiments import toy_analysis, toy_report
from experiments.toy_report import ToyRun
from memagent_jax.runtime.atomic_io import atomic_write
from memagent_jax.data import curriculum, toy
from memagent_jax.evaluation.length_sweep import SweepRow, SweepSpec, sweep_lengths
from memagent_jax.experiment import config_overrides
from memagent_jax.experiment.assembly import enable_compilation_cache, load_reader, train_phases
from memagent_jax.models import safetensors_io
from memagent_jax.policy.export import export_checkpoint

SCALES = {  # eval samples per point, largest multiple of the training length, memagent eval batch
    "full": dict(n=200, max_multiple=256, batch=200),
    "demo": dict(n=200, max_multiple=16, batch=200),
}
METHODS = (("rl", "RL-MemAgent"), ("warm_start", "warm-start only"), ("full_attention", "full attention"))
DIRECT_BATCH = 8  # documents per full-attention call (its memory grows with the square of the length)

_SCALE = flags.DEFINE_enum("scale", "full", list(SCALES), "full (make reproduce) or demo (make demo)")
_WORLD = flags.DEFINE_enum("world", "one_key", list(toy_memagent.WORLDS),
                           "one_key (every question asks about oslo, toy-1m) or lookup (eight askable keys, "
                           "toy-1m-shift2)")
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (default runs/toy_<scale>[_<world>])")
_RESULTS = flags.DEFINE_string("results_dir", None, "table + plot directory (default: docs/results for "
                               "full, <workdir>/results for demo)")
_FRESH = flags.DEFINE_bool("fresh", False, "delete the workdir first (a full, deterministic re-run)")
# the order of a serial run (--eval_workers=1) and of stages.json; side by side, full attention trains
# first, in its own process, beside the warm start (see main)
TRAIN_STAGES = ("pretrain", "warm_start", "full_attention", "rl")
_STAGES = flags.DEFINE_list("stages", [*TRAIN_STAGES, "eval"], "stages to run")
_N = flags.DEFINE_integer("n", None, "evaluation documents per point (default per scale)")
_MAX_MULTIPLE = flags.DEFINE_integer("max_multiple", None, "largest length / training length (power of 2)")
_EVAL_SEED = flags.DEFINE_integer("eval_seed", 1000, "seed of the evaluation documents and sampling")
_EVAL_WORKERS = flags.DEFINE_integer("eval_workers", 2, "methods evaluated at once, each in its own process "
                                     "(1: one after another, in this process)")
_STEPS = flags.DEFINE_string("steps", "", "override training steps, e.g. 'pretrain=3,warm_start=3,rl=2'")
_MEMORY = flags.DEFINE_enum("memory", "overwrite", list(toy_memagent.MEMORIES),
                            "the warm start's and RL's memory: overwrite (MemAgent) or gated (a memory turn may "
                            "reply <keep>; make gated)")
_SEED = flags.DEFINE_integer("seed", 0, "training data and training seed of every trained stage (the base "
                             "model is the committed one whatever the seed)")
_PERTURB = flags.DEFINE_float("perturb", 0.0, "RL starts from the warm start with every weight times "
                              "1 + perturb * N(0, 1) (e.g. 1e-6: float rounding's size, as another machine gives)")
_EVAL_METHODS = flags.DEFINE_list("eval_methods", [m for m, _ in METHODS],
                                  "trained stages to sweep (e.g. rl: a seed run needs only RL's curve)")
_BASE = flags.DEFINE_string("base", None, "an exported base model of this world (a pretrain stage's export, "
                            "e.g. experiments/data/toy_base_lookup): used instead of training the pretrain stage")
_WARM_START = flags.DEFINE_string("warm_start", None, "an exported warm start of this world and scale (a warm_start "
                                  "stage's export, e.g. experiments/data/toy_warm_start_lookup_demo): used instead "
                                  "of training the warm_start stage")


@flags.validator("steps")
def _steps_name_trained_stages(text: str) -> bool:
  """--steps names stages that train, each with a step count: a mistyped stage would be ignored."""
  for item in filter(None, text.split(",")):
    stage, sep, steps = item.partition("=")
    if stage not in TRAIN_STAGES:
      near = config_overrides.nearest_choice(stage, TRAIN_STAGES)
      raise flags.ValidationError(f"no stage {stage!r}; " + (f"did you mean {near!r}?" if near else
                                                            f"the trained stages are {', '.join(TRAIN_STAGES)}"))
    if not sep or not steps.isdigit():
      raise flags.ValidationError(f"{item!r} must be <stage>=<steps>, e.g. rl=2")
  return True


BASE_META = "base.json"  # written into every pretrain and warm-start export: the world, scale and steps it was trained for


def steps_override() -> dict[str, str]:
  """--steps as {stage: steps} ({} when this module is imported without its flags parsed)."""
  if not flags.FLAGS.is_parsed():
    return {}
  return dict(kv.split("=") for kv in _STEPS.value.split(",") if kv)


def stage_config(stage: str, run: ToyRun):
  """The stage's config in this run: the run's seed is its training data and training seed, RL starts
  from the perturbed warm start when run.perturb (`perturbed_export`), run.steps overrides its steps."""
  cfg = toy_memagent.get_config(f"{stage},{run.scale},{run.world},{run.memory}")
  cfg.train.workdir = os.path.join(run.root, stage)
  cfg.train.seed = cfg.data.seed = run.seed
  cfg.train.compilation_cache_dir = compile_cache(run.root)
  if stage == "rl":
    cfg.model.source = (perturbed_export(run.root, run.perturb) if run.perturb
                        else os.path.join(run.root, "warm_start", "export"))
  elif stage in ("warm_start", "full_attention"):  # both start from the same pretrained base
    cfg.model.source = os.path.join(run.root, "pretrain", "export")
  if stage in run.steps:
    cfg.train.steps = int(run.steps[stage])
    cfg.data.phases = curriculum.with_steps(cfg.data.phases, cfg.train.steps)  # the curriculum's first steps
  return cfg


def compile_cache(root: str) -> str:
  """The run's persistent XLA cache: a sweep or a resumed stage loads the programs an earlier process
  of the run compiled (every MemAgent sweep runs the same shapes) instead of compiling them again.
  JAX_COMPILATION_CACHE_DIR, when set, wins."""
  return os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(root, "xla_cache")


def perturbed_export(root: str, perturb: float) -> str:
  """The warm start's export with every weight times 1 + perturb * N(0, 1) (numpy seed 0): how far
  another machine's float rounding may move a trained model, made on purpose. Written once, beside
  the export it perturbs."""
  src = os.path.join(root, "warm_start", "export")
  dst = os.path.join(root, "warm_start", f"export_perturbed_{perturb:g}")
  if os.path.isdir(dst):
    return dst
  if not os.path.isdir(src):
    raise FileNotFoundError(f"--perturb={perturb:g}: no warm-start export at {src} to perturb (train warm_start first)")
  tmp = dst + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(src, tmp)
  weights = os.path.join(tmp, "model.safetensors")
  rng = np.random.default_rng(0)
  tensors = {name: (a * (1 + perturb * rng.standard_normal(a.shape))).astype(a.dtype)
             if np.issubdtype(a.dtype, np.floating) else np.array(a)
             for name, a in sorted(safetensors_io.load_tensors(weights).items())}
  safetensors_io.save_tensors(weights, tensors, metadata={"format": "pt"})
  os.replace(tmp, dst)
  return dst


def train_stage(stage: str, run: ToyRun, *, progress: bool = True) -> dict:
  """Trains (or resumes) one stage of the run and exports its final params as an HF directory;
  progress: its progress bar (off beside another stage's)."""
  cfg = stage_config(stage, run)
  root, world, memory, seed, perturb = run.root, run.world, run.memory, run.seed, run.perturb
  cfg.train.progress = progress
  t0 = time.perf_counter()
  print(f"\n== {stage}: {cfg.train.steps} steps, logs in {cfg.train.workdir}/logs", flush=True)
  out = train_phases(cfg)  # the stage's data phases (RL's curriculum) one after another
  export = os.path.join(root, stage, "export")
  export_checkpoint(os.path.join(root, stage, "checkpoints"), export)
  if stage in ("pretrain", "warm_start"):  # what --base / --warm_start check before a later run starts from it
    with atomic_write(os.path.join(export, BASE_META)) as f:
      command = "python -m experiments.toy_reproduction " + " ".join(sys.argv[1:])
      json.dump({"world": world, "memory": memory, "steps": out.step, "model": cfg.model.source, "stage": stage,
                 "scale": run.scale, "seed": seed, "command": command}, f, indent=1)
  return {"stage": stage, "steps": out.step, "seconds": round(time.perf_counter() - t0, 1),
          "export": export, "seed": seed, **({"perturb": perturb} if stage == "rl" and perturb else {})}


def use_base(base: str, root: str, world: str) -> dict:
  """Copies a committed/earlier pretrain export in as this run's pretrain stage (no training), after
  checking it is a complete export made for this world."""
  return use_export("pretrain", base, root, world)


def use_export(stage: str, source: str, root: str, world: str, scale: str | None = None,
               memory: str = "overwrite") -> dict:
  """Copies a committed/earlier export of `stage` in as this run's stage (no training), after checking
  it is a complete export that stage made for this world (and scale and memory, when given: a warm start)."""
  flag = "--base" if stage == "pretrain" else f"--{stage}"
  missing = [n for n in ("config.json", "model.safetensors", BASE_META) if not os.path.isfile(os.path.join(source, n))]
  if missing:
    raise FileNotFoundError(f"{flag}={source} is not a {stage} export of toy_reproduction.py: no {', '.join(missing)}")
  meta = json.load(open(os.path.join(source, BASE_META)))
  if meta.get("stage", "pretrain") != stage:
    raise ValueError(f"{flag}={source} is a {meta.get('stage', 'pretrain')} export, not a {stage} one")
  if meta.get("world") != world:
    raise ValueError(f"{flag}={source} was trained for world {meta.get('world')!r}, this run is --world={world}")
  if scale and meta.get("scale", scale) != scale:
    raise ValueError(f"{flag}={source} was trained at scale {meta.get('scale')!r}, this run is --scale={scale}")
  if scale and meta.get("memory", "overwrite") != memory:
    raise ValueError(f"{flag}={source} was trained with memory {meta.get('memory', 'overwrite')!r}, this run is "
                     f"--memory={memory}")
  export = os.path.join(root, stage, "export")
  if os.path.abspath(source) != os.path.abspath(export):
    shutil.rmtree(export, ignore_errors=True)
    shutil.copytree(source, export)
  print(f"\n== {stage}: from {source} ({meta['steps']} steps, not retrained)", flush=True)
  return {"stage": stage, "steps": meta["steps"], "seconds": 0.0, "export": export, "base": source}


def reader_digest(stage: str, run: ToyRun) -> str:
  """sha256 of the stage's exported weights and its agent settings: evaluated lengths are reused
  only for the very same reader."""
  cfg = stage_config(stage, run)
  h = hashlib.sha256(json.dumps(cfg.agent.to_dict(), sort_keys=True).encode())
  with open(os.path.join(run.root, stage, "export", "model.safetensors"), "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def make_reader(stage: str, run: ToyRun):
  """The stage's exported policy as its config's evaluation reader (full attention centre-truncates
  documents beyond its context window, as the paper's baselines)."""
  return load_reader(stage_config(stage, run), os.path.join(run.root, stage, "export"), training=False)


def sweep_stage(stage: str, run: ToyRun, *, lengths: list[int], progress: bool = True, concurrent_sweeps: int = 1,
                warmup_length: int | None = None) -> list[SweepRow]:
  """One method's accuracy-against-length rows at `lengths` (all or part of the run's, `eval_lengths`), in
  its own process when sweeps run side by side; warmup_length: where a MemAgent reader compiles when
  `lengths` is only part of its sweep."""
  scale, root, world = run.scale, run.root, run.world
  enable_compilation_cache(compile_cache(root))  # before this process compiles anything
  rl_cfg = toy_memagent.get_config(f"rl,{scale},{world}")
  ev, agent = rl_cfg.eval, rl_cfg.agent
  reader = make_reader(stage, run)
  direct = stage == "full_attention"
  report = None if progress else lambda row: print(
      f"  {dict(METHODS)[stage]}, {row.length} tokens: {100 * row.accuracy:.1f}% "
      f"({row.seconds_per_doc:.3f} s/doc)", flush=True)
  # the same documents for every method: laid out in the MemAgent stages' chunk size
  spec = SweepSpec(task=rl_cfg.data.task, lengths=tuple(lengths), n=run.n, seed=run.eval_seed,
                   batch_size=DIRECT_BATCH if direct else SCALES[scale]["batch"], temperature=ev.temperature,
                   top_p=ev.top_p, chunk_tokens=agent.chunk_tokens, warmup_each_length=direct,
                   warmup_length=warmup_length)
  return sweep_lengths(reader, stage, spec, out_dir=os.path.join(root, "eval"),
                       reader_id=reader_digest(stage, run), progress=progress, on_row=report,
                       concurrent_sweeps=concurrent_sweeps)


def sweep_parts(stage: str, lengths: list[int], workers: int) -> list[list[int]]:
  """A method's lengths as pool tasks: with workers > 1 a MemAgent sweep's longest length is its own
  task, beside the rest (its cost grows with the length: 256x costs about what 1x..128x cost together);
  full attention, whose cost stops growing past its window, stays one task."""
  if workers <= 1 or stage == "full_attention" or len(lengths) < 2:
    return [lengths]
  return [lengths[-1:], lengths[:-1]]


def eval_lengths(max_multiple: int) -> list[int]:
  """1x, 2x, 4x .. max_multiple x the training length, in tokens."""
  lengths, m = [], 1
  while m <= max_multiple:
    lengths.append(toy.TRAIN_TOKENS * m)
    m *= 2
  return lengths


def sweep_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
  """Processes that sweep one method each, side by side; CPU only: an accelerator belongs to one process."""
  context = multiprocessing.get_context("spawn")  # a fresh JAX runtime per process (never fork one)
  # one process per method: its peak RSS is its own, not what an earlier method left behind
  return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=1)


def stop_processes(pool):
  """Terminates a pool's worker processes (ProcessPoolExecutor has no public way before Python 3.14)."""
  for process in list((getattr(pool, "_processes", None) or {}).values()):
    process.terminate()


def evaluate(run: ToyRun, trained: list[str], workers: int = 1, pools=None, started: dict | None = None,
             sweep=sweep_stage) -> list[SweepRow]:
  """The run's sweep of every trained stage of METHODS (make demo trains no full-attention baseline).

  workers > 1 runs that many sweep tasks at once, each in its own process (a MemAgent method is two
  tasks, `sweep_parts`): on 2 cores two sweeps take about 0.75x the time of one after the other (one
  sweep leaves a core half idle). pools: the executors the tasks are dealt to in turn (default: one
  pool of `workers` processes, made here). `started`: {stage: future} of sweeps submitted earlier
  (the baselines', run in a side process beside training). `sweep`: what sweeps one stage
  (`sweep_stage`; a module-level function when workers > 1, as the pool pickles it)."""
  stages = [stage for stage, _ in METHODS if stage in trained]
  if workers > 1 and jax.default_backend() != "cpu":
    print(f"--eval_workers={workers} ignored on {jax.default_backend()}: one process holds the device", flush=True)
    workers = 1
  lengths = eval_lengths(run.max_multiple)
  # a lone MemAgent method is still two tasks (`sweep_parts`): a seed run's RL sweep uses both cores
  workers = min(workers, sum(len(sweep_parts(stage, lengths, workers)) for stage in stages))
  print(f"\n== eval {', '.join(dict(METHODS)[s] for s in stages)}: {run.n} documents at {len(lengths)} lengths"
        + (f", {workers} at a time" if workers > 1 else ""), flush=True)
  if workers <= 1:
    return [row for stage in stages for row in sweep(stage, run, lengths=lengths)]
  started = started or {}
  own = pools is None
  pools = pools or [sweep_pool(workers)]
  try:
    futures, dealt = {}, 0  # stage -> its tasks (a baseline's, started beside training, is one)
    for stage in stages:
      if stage in started:
        futures[stage] = [started[stage]]
        continue
      futures[stage] = []
      for part in sweep_parts(stage, lengths, workers):
        futures[stage].append(pools[dealt % len(pools)].submit(
            sweep, stage, run, lengths=part, progress=False, concurrent_sweeps=workers,
            warmup_length=min(lengths)))
        dealt += 1
    return [row for stage in stages
            for row in sorted((r for f in futures[stage] for r in f.result()), key=lambda r: r.length)]
  finally:
    if own:
      for pool in pools:
        pool.shutdown()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  scale, world = _SCALE.value, _WORLD.value
  unknown = sorted(set(_EVAL_METHODS.value) - {m for m, _ in METHODS})
  if unknown:
    raise app.UsageError(f"--eval_methods: unknown {', '.join(unknown)}; choose from {', '.join(m for m, _ in METHODS)}")
  root = _WORKDIR.value or f"runs/toy_{scale}" + ("" if world == "one_key" else f"_{world}")
  results_dir = _RESULTS.value or ("docs/results" if scale == "full" else os.path.join(root, "results"))
  n = _N.value or SCALES[scale]["n"]
  max_multiple = _MAX_MULTIPLE.value or SCALES[scale]["max_multiple"]
  # --steps resolved here: a sweep's process has no parsed flags
  run = ToyRun(scale=scale, root=root, world=world, n=n, max_multiple=max_multiple, eval_seed=_EVAL_SEED.value,
               seed=_SEED.value, perturb=_PERTURB.value, steps=steps_override(), memory=_MEMORY.value)
  if _FRESH.value and os.path.isdir(root):
    shutil.rmtree(root)
  os.makedirs(os.path.join(root, "eval"), exist_ok=True)
  t0 = time.perf_counter()
  stages_path = os.path.join(root, "stages.json")
  stages = json.load(open(stages_path)) if os.path.exists(stages_path) else {}
  # With sweeps side by side, two processes share the 2 cores from start to end: this one trains the
  # warm start, then RL; one side process ("lane", one task at a time) trains full attention, then
  # sweeps it, then the warm start. RL's sweep ends the run: its longest length in a fresh process, the
  # rest in the lane once the baselines' sweeps are done. (Running both baseline sweeps beside RL
  # training, three processes on 2 cores, ran RL at a third of its speed.)
  workers = _EVAL_WORKERS.value if jax.default_backend() == "cpu" else 1
  early = "eval" in _STAGES.value and workers > 1 and "rl" in _STAGES.value
  lane, end = (sweep_pool(1), sweep_pool(1)) if early else (None, None)
  started, training = {}, {}  # stage -> future of its sweep / of its training in the lane
  order = ("pretrain", "full_attention", "warm_start", "rl") if early else TRAIN_STAGES
  baseline_sweep = lambda stage: lane.submit(sweep_stage, stage, run, lengths=eval_lengths(max_multiple),
                                             progress=False, concurrent_sweeps=workers)
  in_order = lambda: {s: stages[s] for s in TRAIN_STAGES if s in stages}  # as a serial run writes stages.json

  def report_failure(future, stage: str):  # at once: settle raises it only when the current stage ends
    if not future.cancelled() and future.exception() is not None:
      print(f"\n!! {stage} failed in the side process: {future.exception()!r}; the run stops when this "
            "process's current stage ends", flush=True)

  def settle(block: bool):
    """Lane training that has ended (block: all of it, waited for) goes into stages.json, and only then
    is its sweep queued; one that failed stops the run after the file is written."""
    error = None
    for stage, future in list(training.items()):
      if block or future.done():
        del training[stage]
        if future.exception() is not None:
          error = error or future.exception()
          continue
        stages[stage] = future.result()
        if stage in _EVAL_METHODS.value:
          print(f"\n== eval {dict(METHODS)[stage]}: in the side process", flush=True)
          started[stage] = baseline_sweep(stage)
    with atomic_write(stages_path) as f:
      json.dump(in_order(), f, indent=1)
    if error is not None:
      raise error

  try:
    for stage in order:
      if stage == "pretrain" and _BASE.value:
        stages[stage] = use_base(_BASE.value, root, world)
      elif stage == "warm_start" and _WARM_START.value:
        stages[stage] = use_export(stage, _WARM_START.value, root, world, scale, memory=_MEMORY.value)
      elif stage in _STAGES.value and early and stage == "full_attention":
        print(f"\n== {stage}: trained in a side process, beside the warm start and RL", flush=True)
        training[stage] = lane.submit(train_stage, stage, run, progress=False)
        training[stage].add_done_callback(functools.partial(report_failure, stage=stage))
      elif stage in _STAGES.value:
        stages[stage] = train_stage(stage, run)
      else:
        continue
      settle(block=False)
      if early and stage == "warm_start" and stage in _EVAL_METHODS.value:
        print(f"\n== eval {dict(METHODS)[stage]}: in the side process, after its earlier tasks", flush=True)
        started[stage] = baseline_sweep(stage)
    settle(block=True)
    stages = in_order()  # the report's order
    if "eval" not in _STAGES.value:
      return
    rows = evaluate(run, trained=[s for s in stages if s in _EVAL_METHODS.value], workers=workers, started=started,
                    pools=[end, lane] if early else None)
  except BaseException:
    for pool in (lane, end):  # a queued or running side task must not outlive the run's failure
      stop_processes(pool)
    raise
  finally:
    for pool in (lane, end):
      if pool is not None:
        pool.shutdown(cancel_futures=True)
  command = "python -m experiments.toy_reproduction " + " ".join(sys.argv[1:])
  paths = toy_report.write_report(rows, stages, run, results_dir, command=command.strip(),
                                  seconds=time.perf_counter() - t0)
  errors = os.path.join(results_dir, toy_report.report_name(scale, world).replace("toy_reproduction", "memory_errors")
                        + ".md")  # where the MemAgent memories went wrong
  with atomic_write(errors) as f:
    f.write("\n".join(toy_analysis.errors_markdown(toy_analysis.error_rows(root, stage, _EVAL_SEED.value, world), stage)
                      for stage in ("rl", "warm_start") if stage in _EVAL_METHODS.value))
  print(f"\nTable:       {paths['table']}\nErrors:      {errors}\nPlot:        {paths['plot']}\n"
        f"JSON:        {paths['json']}\n"
        f"TensorBoard: .venv/bin/tensorboard --logdir {root}  (train/ and eval/ scalars of every stage)\n"
        f"Checkpoints: {root}/<stage>/checkpoints (orbax), exports: {root}/<stage>/export (HF format)\n"
        f"Per-document answers: {root}/eval/<stage>_<length>.jsonl")


if __name__ == "__main__":
  app.run(main, flags_parser=config_overrides.absl_flags_parser("toy_reproduction"))
