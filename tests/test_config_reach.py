"""Config reaches where it claims to (issue 15).

(a) Each agent / data / rl / teacher key, changed from configs/toy_cpu.py:tiny, changes what the run
does, seen at the cheapest place that shows it: the parts `assembly.build_experiment` builds (the
agent's compiled-block inputs, the row widths, the update's `UpdateSpec`, the training pool), one
rollout step of the built collector over a scripted agent (no model compile: the agent answers by a
fixed pattern, so rewards, advantages, dynamic sampling and overlong shaping have something to act
on), or a train step stopped at its first update.
(b) Every leaf key of configs/base.py is read by code other than validation while a few runs are
built, take a train step and evaluate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sys

import ml_collections
import numpy as np
import pytest

from configs import base, toy_cpu
from memagent_jax.agent.results import AgentResult, Conversation, slots_from_results
from memagent_jax.data import pipeline, toy
from memagent_jax.experiment import assembly
from memagent_jax.rl import losses, rollout, toy_teacher
from reference_rows import host_rows


def config(**overrides) -> ml_collections.ConfigDict:
  """configs/toy_cpu.py:tiny with dotted-key overrides (dict values become ConfigDicts)."""
  c = toy_cpu.get_config("tiny")
  for key, value in overrides.items():
    node = c
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    with node.ignore_type():
      node[leaf] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value
  return c


class _Stop(Exception):
  """Raised by a probe once it has seen what it came for."""


def _conv(prompt: int, response: int, *, truncated: bool, final: bool) -> Conversation:
  zeros = np.zeros(response, np.float32)
  return Conversation(prompt_ids=np.arange(1, prompt + 1, dtype=np.int32), response_ids=np.full(response, 7, np.int32),
                      response_logprobs=zeros, sample_logprobs=zeros, truncated=truncated, is_final=final)


class ScriptedAgent:
  """Stands for the MemAgent in rollouts: trajectory r answers right (plus one extra word, so
  containment and exact match differ) when r % 4 == 0, wrong otherwise; its memory update is
  truncated when r % 3 == 0; its final answer is 6 tokens; a gated agent's memory turn keeps when
  r % 3 == 1, stops when r % 3 == 2 (of a document of 3 chunks) and is invalid when r % 5 == 0.
  Records every call."""

  def __init__(self, agent):
    self.pad_id, self.stop_tokens, self.tokenizer = agent.pad_id, agent.stop_tokens, agent.tokenizer
    self.gated = getattr(agent, "gate", None) is not None
    self.calls = []

  def answer_batch(self, questions, documents, *, temperature=0.0, top_p=1.0, seed=0, row_ids=None, **_):
    row_ids = list(range(len(questions))) if row_ids is None else list(row_ids)
    self.calls.append((len(questions), temperature, top_p))
    out = []
    for q, doc, r in zip(questions, documents, row_ids):
      right = toy_teacher.latest_value(doc, toy_teacher.asked_key(q))
      other = next(v for v in toy.VALUES if v != right)
      pred = f"{right} {other}" if r % 4 == 0 else other
      convs = [_conv(10, 5, truncated=r % 3 == 0, final=False), _conv(12, 6, truncated=False, final=True)]
      out.append(AgentResult(question=q, answer=f"\\boxed{{ {pred} }}", boxed=f" {pred} ", prediction=pred,
                             memories=["memory"], conversations=convs, num_chunks=1,
                             document_tokens=len(doc.split()), decoded_tokens=11, seconds=0.0,
                             gates=[("invalid" if r % 5 == 0 else ("memory", "keep", "stop")[r % 3])]
                             if self.gated else None))
    return out

  def rollout_slots(self, questions, documents, *, decode, prompt_width, response_width, **kw):
    results = self.answer_batch(questions, documents, temperature=decode.temperature, top_p=decode.top_p, **kw)
    slots = slots_from_results(results, self.pad_id, prompt_width=prompt_width, response_width=response_width)
    return dataclasses.replace(slots, doc_chunks=np.full(len(results), 3, np.int32)) if self.gated else slots

  def chunk_texts(self, documents):
    """One chunk per document (its one memory turn): the whole text, which holds the answer."""
    return [[doc] for doc in documents]


class Run:
  """A built experiment and what it does, each probe from the same data position."""

  def __init__(self, exp):
    self.exp, self.trainer = exp, exp.trainer
    self.data_state = self.trainer.batches.get_state()
    self._memo = {}

  def _once(self, name, fn):
    if name not in self._memo:
      self.trainer.batches.set_state(self.data_state)
      self._memo[name] = fn()
    return self._memo[name]

  def rollout(self) -> dict:
    """One collect() of the built RolloutCollector with the scripted agent."""
    def go():
      c = self.trainer.collector
      real, c.agent = c.agent, ScriptedAgent(c.agent)
      try:
        roll = c.collect(self.trainer.batches, lambda gen, sub: 1000 + gen)
      except rollout.DynamicSamplingError:
        return {"calls": c.agent.calls, "outcome": "DynamicSamplingError"}
      finally:
        calls, c.agent = c.agent.calls, real
      rows, m = (None if roll.rows is None else host_rows(roll.rows)), roll.metrics
      return {"calls": calls, "outcome": f"{roll.num_questions} groups",
              "accuracy": m.accuracy, "reward_mean": round(m.reward_mean, 6), "gen_batches": m.gen_batches,
              "advantages": None if rows is None else np.round(rows.advantages, 6).tolist(),
              "loss_tokens": None if rows is None else int(rows.loss_mask.sum())}
    return self._once("rollout", go)

  def teacher(self) -> dict:
    """One collect() of the built TeacherCollector (teachers write rows without the model)."""
    def go():
      roll = self.trainer.collector.collect(self.trainer.batches, lambda gen, sub: 1000 + gen)
      rows = host_rows(roll.rows)
      return {"memories": [r.memories for r in roll.results], "prompt_width": rows.prompt_width,
              "tokens": hashlib.sha256(np.ascontiguousarray(rows.tokens).tobytes()).hexdigest()}
    return self._once("teacher", go)

  def step(self) -> dict:
    """train_step with the scripted agent, stopped at its first optimizer update: which log-prob
    passes ran before it (one per mini-batch when old log-probs are recomputed)."""
    def go():
      c, seen = self.trainer.collector, []
      saved = c.agent, self.trainer.programs

      def logprobs(params, tokens, valid, *, spec, **_):
        seen.append(tuple(tokens.shape))
        return np.zeros(tokens.shape[:2] + (tokens.shape[2] - spec.prompt_width,), np.float32)

      def update(*a, **k):
        raise _Stop
      c.agent = ScriptedAgent(c.agent)
      self.trainer.programs = dataclasses.replace(saved[1], batch_logprobs=logprobs, update_step=update)
      try:
        self.trainer.train_step()
      except _Stop:
        pass
      finally:
        c.agent, self.trainer.programs = saved
      return {"logprob_passes": seen}
    return self._once("step", go)

  def blocks(self) -> dict:
    """What the MemAgent hands its compiled memory block for two training documents (stopped there)."""
    def go():
      seen, agent = {}, self.exp.agent

      def block(graphdef, state, **kw):
        seen.update(chunks=tuple(kw["block"].chunks.shape), tokens_read=np.asarray(kw["block"].lengths).sum(1).tolist(),
                    memory=tuple(kw["rows"].memory.shape))
        raise _Stop
      agent.memory_block = block  # this agent's block only
      pool = self.exp.train_pool[:2]
      try:
        agent.answer_batch([s["question"] for s in pool], [s["context"] for s in pool], temperature=1.0)
      except _Stop:
        pass
      finally:
        del agent.memory_block
      return seen
    return self._once("blocks", go)


# ----- observables: Run -> a comparable value ------------------------------------------------------
def widths(run):  # static row widths: (prompt P, response N, first loss column)
  c = run.trainer.collector
  return c.prompt_width, c.response_width, run.trainer.update_spec.prompt_width


def spec(field):
  return lambda run: getattr(run.trainer.update_spec, field)


def probe(method, field=None):
  return lambda run: getattr(run, method)() if field is None else getattr(run, method)()[field]


def pool(run):
  return [(s["question"], s["context"], tuple(s["answers"]))
          for s in map(pipeline.to_python, run.exp.train_pool)]


def tfds_files(run):  # where the prepared array_record files of the training source live
  return sorted(str(p) for p in pathlib.Path(run.tfds_dir).rglob("*array_record*"))


def reader_kind(run):
  return type(run.exp.agent).__name__, widths(run)


def prefix_reuse(run):  # whether the compiled recurrence copies the template's first piece's keys in
  return run.exp.agent.reuse_prefix


def final_prompt(run):  # the fixed token pieces of the final-answer prompt the compiled answer block gets
  return [np.asarray(p).tolist() for p in run.exp.agent.final_segments.pieces]


def memory_prompt(run):  # the fixed token pieces of the memory-update prompt (gated: the forms' sentences)
  return [np.asarray(p).tolist() for p in run.exp.agent.memory_segments.pieces]


def gate_spec(run):  # the compiled recurrence's gate settings (None: overwrite)
  return run.exp.agent.gate


def decode_buckets(run):  # the batch sizes a memory turn's rows are compacted into
  return run.exp.agent._spec(keep_prompts=True).decode_buckets


def direct_budget(run):  # document tokens a direct reader keeps for a 10-token question
  return run.exp.agent.document_budget(10)


def kl_reference(run):
  return run.trainer.update_spec.kl_coef, run.trainer.state.ref_params is not None


def row_multiple(run):
  return run.trainer.row_multiple


TEACHER = {"train.source": "teacher", "rl.loss": "sft"}  # supervised rows (toy_memory teacher)
DIRECT = {**TEACHER, "agent.kind": "direct", "teacher.name": "toy_direct", "teacher.options": {}}
DYNAMIC = {"rl.dynamic_sampling": True, "rl.on_insufficient": "proceed"}
GATED = {"agent.memory": "gated"}  # the scripted agent's turns keep, stop or are invalid (ScriptedAgent)
GATED_STOP = {**GATED, "agent.gate_forms": "keep_stop"}
TURN_MIX = {**GATED, "rl.gate_rewards.keep": 1.0, "rl.advantage_mode": "turn_mix"}
OVERLONG = {"rl.overlong.enable": True}  # max_tokens 8, cache_tokens 4: a 6-token answer is penalised -0.5
SQUAD_A = {"data.task": "squad", "data.data_dir": "{squad_a}"}
TFDS = {"data.tfds": "memagent_toy_kv/x1", "data.tfds_split": "test", "data.tfds_dir": "{tfds_a}"}

# (key, new value, the setting it is changed in, observable). Notes on settings: context_tokens acts on
# the direct reader only; max_extra_gen_batches / on_insufficient act when dynamic sampling runs short;
# overlong max/cache act when overlong shaping is on; data_dir acts on the QA tasks (toy data is generated).
KNOBS = [
    ("agent.chunk_tokens", 32, {}, probe("blocks")),
    ("agent.memory_tokens", 12, {}, widths),
    ("agent.answer_tokens", 24, {}, widths),
    ("agent.question_tokens", 32, {}, widths),
    ("agent.final_template", "eval", {}, final_prompt),
    ("agent.block_chunks", 2, {}, probe("blocks", "chunks")),
    ("agent.template_prefix_cache", "off", {}, prefix_reuse),
    ("agent.max_chunks", 1, {}, probe("blocks", "tokens_read")),
    ("agent.kind", "direct", {**DIRECT, "agent.kind": "memagent"}, reader_kind),
    ("agent.context_tokens", 1024, DIRECT, direct_budget),
    ("agent.memory", "gated", {}, memory_prompt),
    ("agent.gate_forms", "keep_stop", GATED, memory_prompt),
    ("agent.invalid_gate", "keep", GATED, gate_spec),
    ("agent.decode_buckets", 3, GATED, decode_buckets),
    ("data.task", "squad", {"data.data_dir": "{squad_a}"}, pool),
    ("data.length", 128, {}, pool),
    ("data.train_size", 8, {}, pool),
    ("data.seed", 1, {}, pool),
    ("data.data_dir", "{squad_b}", SQUAD_A, pool),
    ("data.tfds", "memagent_toy_kv/x1", {"data.tfds_split": "test", "data.tfds_dir": "{tfds_a}"}, pool),
    ("data.tfds_dir", "{tfds_b}", TFDS, tfds_files),
    ("rl.group_size", 4, {}, probe("rollout", "calls")),
    ("rl.questions_per_step", 2, {}, probe("rollout", "calls")),
    ("rl.ppo_mini_batch", 4, {}, probe("step", "logprob_passes")),
    ("rl.micro_batches", 2, {}, row_multiple),
    ("rl.rollout_batch", 4, {}, probe("rollout", "calls")),
    ("rl.temperature", 0.7, {}, probe("rollout", "calls")),
    ("rl.top_p", 0.9, {}, probe("rollout", "calls")),
    ("rl.reward", "exact_match", {}, probe("rollout", "accuracy")),
    ("rl.advantage", "mean_centred", {}, probe("rollout", "advantages")),
    ("rl.eps", 1.0, {}, probe("rollout", "advantages")),
    ("rl.loss", "ppo_clip_alias", {}, spec("loss")),  # a second registered name (the only valid change)
    ("rl.agg", "seq-mean-token-mean", {}, spec("agg")),
    ("rl.clip_low", 0.1, {}, spec("clip_low")),
    ("rl.clip_high", 0.4, {}, spec("clip_high")),
    ("rl.clip_c", 0.0, {}, spec("clip_c")),
    ("rl.kl_coef", 0.01, {}, kl_reference),
    ("rl.kl_kind", "kl", {}, spec("kl_kind")),
    ("rl.entropy_coef", 0.01, {}, spec("entropy_coef")),
    ("rl.recompute_old_logprobs", False, {}, probe("step", "logprob_passes")),
    ("rl.dynamic_sampling", True, {}, probe("rollout", "outcome")),
    ("rl.max_extra_gen_batches", 1, DYNAMIC, probe("rollout", "gen_batches")),
    ("rl.on_insufficient", "proceed", {"rl.dynamic_sampling": True}, probe("rollout", "outcome")),
    ("rl.dynamic_sampling_filter", "score_or_gates", {**DYNAMIC, **GATED, "rl.gate_rewards.keep": 1.0},
     probe("rollout", "outcome")),
    ("rl.mask_truncated", True, {}, probe("rollout", "loss_tokens")),
    ("rl.overlong.enable", True, {}, probe("rollout", "reward_mean")),
    ("rl.overlong.max_tokens", 7, OVERLONG, probe("rollout", "reward_mean")),
    ("rl.overlong.cache_tokens", 2, OVERLONG, probe("rollout", "reward_mean")),
    ("rl.gate_rewards.keep", 1.0, GATED, probe("rollout", "reward_mean")),
    ("rl.gate_rewards.exit", 1.0, GATED_STOP, probe("rollout", "reward_mean")),
    ("rl.gate_rewards.format", 1.0, GATED, probe("rollout", "reward_mean")),
    ("rl.gate_rewards.evidence", 1.0, GATED, probe("rollout", "reward_mean")),
    ("rl.advantage_mode", "turn_mix", {**GATED, "rl.gate_rewards.keep": 1.0}, probe("rollout", "advantages")),
    ("rl.turn_advantage_weight", 1.0, TURN_MIX, probe("rollout", "advantages")),
    ("teacher.name", "toy_recall", DIRECT, probe("teacher", "tokens")),
    ("teacher.options", {"overwrite_prob": 1.0},  # documents of 6 chunks: some hold only other keys' facts
     {**TEACHER, "teacher.options": {"overwrite_prob": 0.0}, "data.length": 384}, probe("teacher", "memories")),
    ("teacher.prompt_loss", True, TEACHER, widths),
]


def _squad(path, pairs):
  """A SQuAD-format file in toy words (the toy tokenizer measures its paragraphs)."""
  paragraphs = [{"context": f"{toy.fact(k, v)} rain over the hill .",
                 "qas": [{"id": f"{k}-{v}", "question": toy.question(k), "answers": [{"text": v, "answer_start": 0}]}]}
                for k, v in pairs]
  with open(path, "w") as f:
    json.dump({"data": [{"title": "toy", "paragraphs": paragraphs}]}, f)
  return str(path)


@pytest.fixture(scope="module")
def squad_files(tmp_path_factory):
  d = tmp_path_factory.mktemp("squad")
  return {"squad_a": _squad(d / "a.json", zip(toy.KEYS[:16], toy.VALUES[:16])),
          "squad_b": _squad(d / "b.json", zip(toy.KEYS[8:], toy.VALUES[8:])),
          "tfds_a": str(d / "tfds_a"), "tfds_b": str(d / "tfds_b")}


@pytest.fixture(scope="module")
def build(tmp_path_factory, squad_files):
  """build(**overrides) -> Run, one build per distinct config (the shared baselines are built once)."""
  cache = {}

  def make(**overrides):
    overrides = {k: v.format(**squad_files) if isinstance(v, str) else v for k, v in overrides.items()}
    key = json.dumps(overrides, sort_keys=True)
    if key not in cache:
      workdir = tmp_path_factory.mktemp("run")
      cache[key] = Run(assembly.build_experiment(config(**overrides), workdir=str(workdir)))
      cache[key].tfds_dir = overrides.get("data.tfds_dir", "")
    return cache[key]
  return make


@pytest.fixture
def alias_loss():
  """'ppo_clip_alias': the ppo_clip loss under a second name, so rl.loss can change on its own."""
  with losses.POLICY_LOSSES.registered("ppo_clip_alias", losses.POLICY_LOSSES.get("ppo_clip")):
    yield


@pytest.mark.parametrize("key,value,setting,observe", KNOBS, ids=[k[0] for k in KNOBS])
def test_each_key_changes_what_the_run_does(build, alias_loss, key, value, setting, observe):
  before, after = observe(build(**setting)), observe(build(**{**setting, key: value}))
  assert before != after, f"{key}={value!r} changed nothing observable: {before!r}"


def test_every_toy_agent_rl_and_teacher_key_has_a_knob():
  c = base.get_config()
  keys = {k for k, _ in _leaves(c) if k.split(".")[0] in ("agent", "rl", "teacher")}
  keys = {"teacher.options" if k.startswith("teacher.options.") else k for k in keys}
  assert keys <= {k[0] for k in KNOBS}, sorted(keys - {k[0] for k in KNOBS})
  assert {"data.task", "data.length", "data.train_size", "data.seed", "data.data_dir"} <= {k[0] for k in KNOBS}


def test_chunk_size_reaches_the_toy_data(build):
  """agent.chunk_tokens shapes the generated documents: no fact across a boundary of the agent's chunks."""
  default, small = build(), build(**{"agent.chunk_tokens": 32})
  assert pool(default) != pool(small)
  for run, chunk in ((default, 64), (small, 32)):
    assert run.exp.agent.chunk_tokens == chunk
    starts = [st for s in run.exp.train_pool for st in s["fact_starts"]]
    assert all(st // chunk == (st + toy.FACT_TOKENS - 1) // chunk for st in starts)
  assert any(st // 32 != (st + toy.FACT_TOKENS - 1) // 32 for s in default.exp.train_pool for st in s["fact_starts"])


# ----- (b) every key of configs/base.py is read ----------------------------------------------------
def _leaves(node, prefix=""):
  for k in node.keys():
    v = node[k]
    if isinstance(v, ml_collections.ConfigDict):
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


class ReadRecorder:
  """Notes the leaf keys of `cfg` that code reads (cfg.x.y, cfg["x"], cfg.get), except reads by
  validation (rl/config_checks.py) and ml_collections' own bulk reads (items, to_json, repr)."""

  ML_DIR = os.path.dirname(ml_collections.__file__)
  DIRECT = ("__getitem__", "__getattr__", "get")

  def __init__(self):
    self.paths, self.read = {}, set()

  def watch(self, cfg, prefix=""):
    for k, v in cfg.items(preserve_field_references=True):  # ml_collections' own read: not recorded
      if isinstance(v, ml_collections.ConfigDict):
        self.watch(v, f"{prefix}{k}.")
    self.paths[id(cfg)] = prefix
    return cfg

  def _reader(self):
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(self.ML_DIR):
      if frame.f_code.co_name not in self.DIRECT:
        return None  # a bulk read inside ml_collections (items(), to_json_best_effort(), ...)
      frame = frame.f_back
    return frame

  def install(self, monkeypatch):
    real = ml_collections.ConfigDict.__getitem__

    def getitem(node, key):
      value = real(node, key)
      prefix = self.paths.get(id(node))
      if prefix is not None and not isinstance(value, ml_collections.ConfigDict):
        frame = self._reader()
        if frame is not None and os.path.basename(frame.f_code.co_filename) != "config_checks.py":
          self.read.add(f"{prefix}{key}")
      return value
    monkeypatch.setattr(ml_collections.ConfigDict, "__getitem__", getitem)


# keys no run of this test reaches, each with why (none today; add one only with its reason)
UNREAD_BY_DESIGN: dict[str, str] = {}


@pytest.mark.slow
def test_every_key_of_base_is_read_by_the_run(tmp_path, monkeypatch):
  """Three runs read every key: RL with held-out evaluation, dynamic sampling running short (so its
  fallbacks are read), overlong shaping (so its sizes are read), one real train step (the update
  reads rl/optim/train), saving and the workdir from the config; supervised rows (teacher.*);
  the direct reader (agent.context_tokens). Rollouts use the scripted agent: the reads are the same."""
  rec = ReadRecorder()
  rec.install(monkeypatch)
  rl_cfg = rec.watch(config(**{**DYNAMIC, **OVERLONG, "train.steps": 1, "eval.every": 1,
                               "train.workdir": str(tmp_path / "rl")}))
  exp = assembly.build_experiment(rl_cfg)  # no workdir argument: train.workdir is read
  exp.trainer.collector.agent = ScriptedAgent(exp.agent)
  exp.evaluator.reader = ScriptedAgent(exp.evaluator.reader)
  history = assembly.train_phases(rl_cfg, build=lambda c, w: exp.trainer).history  # reads data.phases
  assert history[0].updates == 1 and history[0].rollout.kept_groups == 2 and "score" in history[0].eval
  teacher_cfg = rec.watch(config(**{**TEACHER, "teacher.prompt_loss": True}))
  assembly.build_experiment(teacher_cfg, workdir=str(tmp_path / "teacher"))
  direct_cfg = rec.watch(config(**DIRECT))
  assembly.build_experiment(direct_cfg, workdir=str(tmp_path / "direct"))
  tfds_cfg = rec.watch(config(**{**TFDS, "data.tfds_dir": str(tmp_path / "tfds")}))
  assembly.build_experiment(tfds_cfg, workdir=str(tmp_path / "tfds_run"))
  monkeypatch.undo()
  unread = {k for k, _ in _leaves(base.get_config())} - rec.read - set(UNREAD_BY_DESIGN)
  assert not unread, f"keys of configs/base.py that no code reads: {sorted(unread)}"
