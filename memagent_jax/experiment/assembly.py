"""The assembly: a config -> the parts of a run (mesh, policy, reader, data, collector, evaluator,
trainer), built once and in one place.

Every entry point goes through here (experiments/train.py, sweeps, the toy reproduction, the
notebook, `memagent eval`, the tests), so a config key means the same thing everywhere and no
other module builds an agent from a config.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from memagent_jax.agent import DirectReader, MemAgent
from memagent_jax.data import curriculum, pipeline, tasks, toy_tokenizer
from memagent_jax.evaluation import Sampling, run_eval
from memagent_jax.experiment import phase_configs, specs, tfds_builders
from memagent_jax.experiment.config_checks import validate_config
from memagent_jax.policy.loading import load_policy
from memagent_jax.rl.rollout import RolloutCollector
from memagent_jax.rl.teacher_rows import TeacherCollector
from memagent_jax.rl.trainer import RunParts, StepPrograms, Trainer, TrainResult
from memagent_jax.runtime import parallel


TFDS_DIR = os.path.join("runs", "tfds")  # where data.tfds datasets are prepared unless data.tfds_dir says


def build_reader(agent_cfg, policy, *, training: bool, mesh=None, truncate: bool | None = None):
  """The reader `agent_cfg` (a config's `agent` section) describes, over `policy`.

  Centre truncation to agent.max_chunks applies to training rollouts only: evaluation reads whole
  documents. kind "direct" is the full-attention baseline (the whole document in one prompt, up to
  agent.context_tokens); it centre-truncates longer documents when evaluating, or when `truncate`
  says so. With a mesh, the MemAgent's rows split over its ("data", "fsdp") axes and processes."""
  a = agent_cfg
  if a.kind == "direct":
    return DirectReader(policy, answer_tokens=a.answer_tokens, question_tokens=a.question_tokens,
                        truncate=(not training) if truncate is None else truncate,
                        context_tokens=a.context_tokens or None)
  return MemAgent(policy, specs.reader_spec(a, training=training), mesh=mesh)


def load_policy_of(cfg, source: str | None = None):
  """The policy of `cfg.model` (or of `source`, e.g. an exported stage, with cfg's dtype and backend). A
  gated reader of a toy checkpoint saved before the gated words existed reads with the current toy tokenizer
  (toy_tokenizer.with_gated_words); an overwrite reader keeps the checkpoint's own."""
  m = cfg.model
  policy = load_policy(source or m.source, dtype=m.dtype, seed=m.seed, attention=m.attention,
                       scan_layers=m.scan_layers)
  if cfg.agent.memory == "gated":
    policy.tokenizer = toy_tokenizer.with_gated_words(policy.tokenizer)
  return policy


def load_reader(cfg, source: str | None = None, *, training: bool = False, mesh=None):
  """Policy + reader of a config in one call (evaluation, notebooks)."""
  return build_reader(cfg.agent, load_policy_of(cfg, source), training=training, mesh=mesh)


def sample_pool(data_cfg, *, chunk_tokens: int, size: int, seed: int, length: int, tokenizer,
                data_dir: str = "") -> list[dict]:
  """`size` samples of the config's task at `length` tokens; toy documents keep every fact inside
  one chunk of `chunk_tokens` (the config's agent.chunk_tokens: the chunks the agent reads)."""
  return tasks.make_samples(data_cfg.task, length, size, seed, tokenizer, data_dir or data_cfg.data_dir or None,
                            chunk_tokens=chunk_tokens, options=data_cfg.get("options") or {})


def training_source(data_cfg, *, chunk_tokens: int, tokenizer):
  """The random-access training data: the prepared TFDS dataset `data.tfds` (records read lazily by
  grain: corpora larger than memory), or `data.train_size` samples generated from `data.task`."""
  d = data_cfg
  if d.tfds:
    return tfds_builders.prepared_source(d.tfds, split=d.tfds_split, data_dir=d.tfds_dir or TFDS_DIR,
                                         manual_dir=d.data_dir)
  return sample_pool(d, chunk_tokens=chunk_tokens, size=d.train_size, seed=d.seed, length=d.length,
                     tokenizer=tokenizer)


def check_held_out(train, held_out: list[dict], task: str):
  """Evaluation questions must not be training questions (QA corpora: pass the dev file as
  eval.data_dir); synthetic tasks draw fresh samples from another seed."""
  if task not in tasks.QA_TASKS:
    return
  seen = {(s["question"], tuple(s["answers"])) for s in map(pipeline.to_python, train)}
  overlap = sum((s["question"], tuple(s["answers"])) in seen for s in held_out)
  if overlap and task in tasks.QA_TASKS:
    raise ValueError(f"{overlap} of the {len(held_out)} evaluation questions of {task!r} are also training "
                     "questions: set eval.data_dir to the held-out (dev) file and data.data_dir to the train file")


def row_widths(agent, question_tokens: int, document_tokens: int = 0) -> tuple[int, int]:
  """Static (prompt width P, response width N) covering every conversation of the config
  (a direct reader's prompt holds the whole training document of `document_tokens`)."""
  if isinstance(agent, DirectReader):
    return agent.segments.fixed_tokens + question_tokens + document_tokens, agent.answer_tokens
  agent.check_budget(question_tokens)  # ContextBudgetError naming every part if it cannot fit
  return max(agent.prompt_tokens(question_tokens).values()), max(agent.memory_tokens, agent.answer_tokens)


def enable_compilation_cache(directory: str):
  """Every compiled program (however quick to compile) goes to the persistent cache in directory."""
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.abspath(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def start_runtime(cfg):
  """Joins the processes of a multi-host run, turns on the compile cache, returns (mesh, rules)."""
  parallel.initialize_distributed(specs.distributed_spec(cfg))
  if cfg.train.compilation_cache_dir:
    enable_compilation_cache(cfg.train.compilation_cache_dir)
  mesh_spec = specs.mesh_spec(cfg)
  return parallel.make_mesh(mesh_spec), mesh_spec.axis_rules()


@dataclasses.dataclass
class Evaluator:
  """Accuracy of a reader on a fixed held-out set (the config's released validation sampling).
  On a multi-process mesh each process reads its share of every batch (the same scores as one
  process: each row keeps its sampling key)."""
  reader: object
  task: str
  samples: list[dict]
  eval_cfg: object

  def __post_init__(self):
    self.split = jax.process_count() > 1 and getattr(self.reader, "mesh", None) is not None
    procs, e = jax.process_count(), self.eval_cfg
    if self.split and (len(self.samples) % procs or min(e.batch_size, len(self.samples)) % procs):
      raise ValueError(f"eval.size={len(self.samples)} and eval.batch_size={e.batch_size} must be multiples "
                       f"of the {procs} processes: each process reads its share of every held-out batch")

  def __call__(self) -> dict[str, float]:
    e = self.eval_cfg
    summary = run_eval(self.reader, self.task, self.samples, None, batch_size=e.batch_size,
                       sampling=Sampling(e.temperature, e.top_p, e.seed), progress=False,
                       split_over_processes=self.split)
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and k != "n"}


@dataclasses.dataclass
class Experiment:
  """Everything one training run is made of; `trainer` owns the loop."""
  cfg: object
  mesh: object
  policy: object
  agent: object
  train_pool: object  # list[dict], or a TFDS array_record source
  evaluator: Evaluator | None
  trainer: Trainer


def build_experiment(cfg, workdir: str | None = None, *, programs: StepPrograms = StepPrograms()) -> Experiment:
  """The config turned into its parts, once: validate, start the runtime, load the policy, build
  the reader, draw the data, pick the collector (RL rollouts or teacher rows), the evaluator and
  the trainer (which restores the newest readable checkpoint of workdir; `programs`: what its steps run)."""
  validate_config(cfg)
  mesh, rules = start_runtime(cfg)
  policy = load_policy_of(cfg)
  agent = build_reader(cfg.agent, policy, training=True, mesh=mesh)  # rollouts: rows over data x fsdp
  prompt_width, response_width = row_widths(agent, cfg.agent.question_tokens, cfg.data.length)
  if cfg.train.source == "teacher":  # supervised warm start / baseline: teacher-forced rows, loss "sft"
    collector = TeacherCollector(agent, specs.teacher_spec(cfg), prompt_width=prompt_width,
                                 response_width=response_width)
  else:
    collector = RolloutCollector(agent, specs.rollout_spec(cfg), prompt_width=prompt_width,
                                 response_width=response_width)
  d = cfg.data
  tok = agent.tokenizer
  chunk = cfg.agent.chunk_tokens
  pool = training_source(d, chunk_tokens=chunk, tokenizer=tok)
  batches = pipeline.iterate(pipeline.make_dataset(pool, cfg.rl.questions_per_step, seed=d.seed, num_epochs=None,
                                                   drop_remainder=True).map(tasks.QuestionBatch.from_columns))
  evaluator = None
  if cfg.eval.every:
    e = cfg.eval
    held_out = sample_pool(d, chunk_tokens=chunk, size=e.size, seed=e.seed, length=e.length or d.length,
                           tokenizer=tok, data_dir=e.data_dir)
    check_held_out(pool, held_out, d.task)
    # multi-process params span hosts, so evaluation runs on the mesh too, each process reading its
    # share of every held-out batch (Evaluator); one process keeps any batch size
    reader = build_reader(cfg.agent, policy, training=False, mesh=mesh if jax.process_count() > 1 else None)
    evaluator = Evaluator(reader, d.task, held_out, e)
  # the loss starts at the response column; a teacher's prompt loss trains whole conversations
  loss_from = 1 if cfg.train.source == "teacher" and cfg.teacher.prompt_loss else prompt_width
  # the memory template's opening (the same in every memory-update row) runs once per update batch
  # where the agent reuses it in rollouts too (`agent.template_prefix_cache`), unless whole rows run a
  # fused kernel: through the prefix's cache, attention is plain XLA
  fused = policy.model.attention.whole_rows_fused(policy.dtype)
  shared = agent.memory_segments.pieces[0] if getattr(agent, "reuse_prefix", False) and not fused else None
  parts = RunParts(policy=policy, collector=collector, batches=batches, mesh=mesh, rules=rules, evaluate=evaluator,
                   shared_prefix=shared, config_json=cfg.to_json_best_effort())
  trainer = Trainer(specs.train_spec(cfg), parts, update=specs.update_spec(cfg, loss_from=loss_from),
                    optim=specs.optim_spec(cfg), workdir=workdir or cfg.train.workdir, programs=programs)
  return Experiment(cfg, mesh, policy, agent, pool, evaluator, trainer)


def build_trainer(cfg, workdir: str | None = None, *, programs: StepPrograms = StepPrograms()) -> Trainer:
  """`build_experiment(cfg, workdir).trainer`: what a training entry point needs."""
  return build_experiment(cfg, workdir, programs=programs).trainer


def train_phases(cfg, workdir: str | None = None, build=None) -> TrainResult:
  """Trains cfg phase by phase (`data.phases`, data/curriculum.py; one plain run without it) in one
  workdir, each phase resuming the last; returns the step reached, the history over the phases this
  call ran, and the last phase's trainer. `build`: the trainer factory (tests)."""
  build = build or build_trainer
  phases = curriculum.parse_phases(cfg.data.phases, cfg.data.options, cfg.train.steps)
  if not phases:
    trainer = build(cfg, workdir)
    return dataclasses.replace(trainer.train(), trainer=trainer)
  history = []
  for until, settings in phases:
    trainer = build(phase_configs.phase_config(cfg, settings), workdir)  # restores the newest readable checkpoint
    if trainer.state.step >= until and until != phases[-1][0]:
      trainer.close()  # finished in an earlier call: the next phase's trainer takes the workdir lock
      continue
    print(f"data phase to step {until}: " + (", ".join(f"{k}={v!r}" for k, v in settings.items()) or "data.options"),
          flush=True)
    out = trainer.train(until=until)
    history += out.history
  return TrainResult(step=out.step, history=history, trainer=trainer)
