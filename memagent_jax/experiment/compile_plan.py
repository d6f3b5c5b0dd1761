"""The programs of one RL step as abstract values: a config -> the shapes, shardings and static
specs of the rollout (`memory_block`, `answer_block`), the log-prob pass and the update, built
through the same rules as training but without reading weights, loading data or using device memory.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.agent.memagent import question_bucket
from memagent_jax.experiment import specs
from memagent_jax.agent.recurrence import ChunkBlock, MemoryRows, RecurrenceSpec, answer_block, memory_block
from memagent_jax.models.attention import resolve_backend
from memagent_jax.models.config import PRESETS, get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.hf_weights import read_hf_config
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.policy.loading import EMBEDDED_DEFAULT, load_tokenizer, tokenizer_source_for_preset
from memagent_jax.rl import update as upd
from memagent_jax.rl.device_rows import bucket_rows
from memagent_jax.rl.optim import make_optimizer
from memagent_jax.runtime import parallel
from memagent_jax.text.templates import FINAL_TEMPLATES, MEMORY_TEMPLATE, NO_MEMORY, TemplateSegments


def model_of(source: str):
  """(ModelConfig, tokenizer source, what was assumed) of a model.source, without reading weights."""
  key = source.lower()
  preset = key.split(":", 1)[1] if key.startswith("random:") else key
  if preset in PRESETS:
    tok = tokenizer_source_for_preset(preset)
    note = [] if tok else [f"template token counts from the {EMBEDDED_DEFAULT} tokenizer's chat template "
                           f"({preset} ships no tokenizer here; its own may differ by a few tokens)"]
    return get_preset(preset), tok or EMBEDDED_DEFAULT, note
  if key == EMBEDDED_DEFAULT:
    return get_preset(EMBEDDED_DEFAULT), EMBEDDED_DEFAULT, []
  try:
    cfg = read_hf_config(source)
  except (OSError, ValueError) as e:
    raise ValueError(f"model.source={source!r}: `memagent compile` needs a preset ({', '.join(sorted(PRESETS))}) "
                     f"or a local model directory with config.json ({e})") from None
  if any(os.path.isfile(os.path.join(source, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
    return cfg, source, []
  return cfg, EMBEDDED_DEFAULT, [f"template token counts from the {EMBEDDED_DEFAULT} tokenizer's chat template "
                                 f"({source} has no tokenizer files)"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepShapes:
  """The static sizes of one RL step of a config (worst case: every prompt at its width)."""
  rollout_rows: int  # rl.rollout_batch: trajectories per agent call
  block_chunks: int
  chunk_tokens: int
  question_width: int  # padded question slots (the agent's bucket of agent.question_tokens)
  memory_width: int
  pieces: tuple[int, ...]  # memory template pieces' lengths
  final_pieces: tuple[int, ...]
  memory_updates: int  # per trajectory: chunks of data.length, capped by agent.max_chunks
  prompt_width: int  # P of a training row: the longest prompt of either conversation
  response_width: int  # N
  micro_rows: int  # rows per micro-batch (bucketed as the trainer pads them)
  micro_batches: int
  mini_batches: int  # optimizer updates per step
  logprob_passes: int  # log-prob forward passes over one mini-batch per step (old + reference)
  rollout_calls: int  # agent calls per step

  @property
  def conversations(self) -> int:
    """Conversations per trajectory: the memory updates + the final answer."""
    return self.memory_updates + 1


def step_shapes(cfg, tokenizer, *, batch_shards: int = 1) -> StepShapes:
  """Shapes of cfg's step. Conversations per trajectory = ceil(data.length / chunk_tokens) capped by
  agent.max_chunks, + 1; rows per micro-batch = group_size x ppo_mini_batch x that / micro_batches,
  bucketed as `rl.device_rows.bucket_rows` pads them (to multiples of micro_batches x batch_shards)."""
  a, rl, d = cfg.agent, cfg.rl, cfg.data
  mem = TemplateSegments.build(tokenizer, MEMORY_TEMPLATE)
  fin = TemplateSegments.build(tokenizer, FINAL_TEMPLATES[a.final_template])
  q = question_bucket(a.question_tokens)
  m = max(a.memory_tokens, len(tokenizer.encode(NO_MEMORY)))
  chunks = math.ceil(d.length / a.chunk_tokens)
  if a.max_chunks:
    chunks = min(chunks, a.max_chunks)
  p = max(mem.fixed_tokens + q + m + a.chunk_tokens, fin.fixed_tokens + q + m)
  rows = rl.group_size * rl.ppo_mini_batch * (chunks + 1)
  shards = rl.micro_batches * batch_shards
  mini = math.ceil(rl.questions_per_step / rl.ppo_mini_batch)
  recompute = rl.recompute_old_logprobs and rl.loss != "sft"
  passes = (mini - 1 if recompute else 0) + (mini if rl.kl_coef else 0)
  return StepShapes(rollout_rows=rl.rollout_batch, block_chunks=a.block_chunks, chunk_tokens=a.chunk_tokens,
                    question_width=q, memory_width=m, pieces=tuple(len(x) for x in mem.pieces),
                    final_pieces=tuple(len(x) for x in fin.pieces), memory_updates=chunks, prompt_width=p,
                    response_width=max(a.memory_tokens, a.answer_tokens),
                    micro_rows=bucket_rows(rows, shards) // rl.micro_batches, micro_batches=rl.micro_batches,
                    mini_batches=mini, logprob_passes=passes,
                    rollout_calls=math.ceil(rl.questions_per_step * rl.group_size / rl.rollout_batch))


@dataclasses.dataclass
class Program:
  """One jitted function and the abstract arguments it is lowered with."""
  name: str
  fn: object
  args: tuple
  kwargs: dict
  note: str  # what one call is, for the report


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _rows(mesh, shape, dtype, row_axis: int = 0):
  """An abstract row array with rows split over ("data", "fsdp") (replicated when they do not divide)."""
  spec = [None] * len(shape)
  if shape[row_axis] % parallel.batch_shards(mesh) == 0:
    spec[row_axis] = parallel.BATCH_AXES
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))


def _replicated(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))


def build_programs(cfg, mesh, rules, *, platform: str = "tpu") -> tuple[list[Program], StepShapes, dict]:
  """The rollout, log-prob and update programs of cfg at its real shapes on `mesh`, and facts for
  the report (param counts, attention backend, assumptions)."""
  mcfg, tok_source, notes = model_of(cfg.model.source)
  tokenizer = load_tokenizer(tok_source)
  shapes = step_shapes(cfg, tokenizer, batch_shards=parallel.batch_shards(mesh))
  dtype = jnp.dtype(cfg.model.dtype)
  backend = resolve_backend(cfg.model.attention, dtype, platform)
  abstract = nnx.eval_shape(lambda: Decoder(mcfg, dtype, attention=cfg.model.attention, platform=platform,
                                            rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  master = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), state)  # fp32 master weights
  train_sh = parallel.param_shardings(state, mesh, rules)
  roll_sh = parallel.param_shardings(state, mesh, parallel.rollout_rules(rules, cfg.mesh.rollout))
  params = _abstract(master, train_sh)
  rollout_params = _abstract(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), state), roll_sh)
  tx = make_optimizer(specs.optim_spec(cfg))
  opt = jax.eval_shape(tx.init, master)
  opt_state = _abstract(opt, parallel.opt_state_shardings(opt, master, train_sh, mesh))

  rl, a, s = cfg.rl, cfg.agent, shapes
  b = s.rollout_rows
  stops = tuple(tokenizer.stop_token_ids)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  spec = RecurrenceSpec(memory_tokens=a.memory_tokens, answer_tokens=a.answer_tokens, stop_tokens=stops,
                        pad_id=pad, keep_prompts=True, reuse_prefix=a.template_prefix_cache == "on")
  i32, f32 = jnp.int32, jnp.float32
  rows = MemoryRows(question=_rows(mesh, (b, s.question_width), i32), q_len=_rows(mesh, (b,), i32),
                    memory=_rows(mesh, (b, s.memory_width), i32), mem_len=_rows(mesh, (b,), i32),
                    keys=_rows(mesh, (b, 2), jnp.uint32))
  decode = jax.tree.map(lambda _: _replicated(mesh, (), f32),  # temperature, top-p: traced leaves
                        DecodeSpec(temperature=rl.temperature, top_p=rl.top_p))
  row = dict(rows=rows, decode=decode)
  block = ChunkBlock(chunks=_rows(mesh, (b, s.block_chunks, s.chunk_tokens), i32),
                     lengths=_rows(mesh, (b, s.block_chunks), i32), first=_replicated(mesh, (), i32))
  memory = Program("rollout", memory_block, (graphdef, rollout_params), dict(
      pieces=tuple(_replicated(mesh, (n,), i32) for n in s.pieces), block=block, spec=spec, **row),
      f"memory_block: {s.block_chunks} memory updates of {b} rows (prompt <= {s.prompt_width}, "
      f"{a.memory_tokens} new tokens each)")
  answer = Program("answer", answer_block, (graphdef, rollout_params), dict(
      pieces=tuple(_replicated(mesh, (n,), i32) for n in s.final_pieces), spec=spec, **row),
      f"answer_block: the final answer of {b} rows ({a.answer_tokens} new tokens)")
  m, r, w, n = s.micro_batches, s.micro_rows, s.prompt_width + s.response_width, s.response_width
  tokens, valid = _rows(mesh, (m, r, w), i32, 1), _rows(mesh, (m, r, w), jnp.bool_, 1)
  logprobs = Program("logprobs", upd.batch_logprobs, (params, tokens, valid), dict(
      graphdef=graphdef, spec=upd.LogprobSpec(prompt_width=s.prompt_width, temperature=float(rl.temperature),
                                              compute_dtype=cfg.model.dtype)), f"batch_logprobs: one mini-batch, {m} x {r} rows x {w} tokens")
  batch = upd.UpdateBatch(tokens=tokens, valid=valid, loss_mask=_rows(mesh, (m, r, n), jnp.bool_, 1),
               old_logp=_rows(mesh, (m, r, n), f32, 1), ref_logp=_rows(mesh, (m, r, n), f32, 1),
               advantages=_rows(mesh, (m, r), f32, 1))
  uspec = specs.update_spec(cfg, loss_from=s.prompt_width)
  update = Program("update", upd.update_step, (params, opt_state, batch), dict(graphdef=graphdef, tx=tx, spec=uspec),
                   f"update_step: one mini-batch, {m} micro-batches of {r} rows x {w} tokens")
  facts = dict(model=mcfg, params=mcfg.num_params, backend=backend, notes=notes,
               param_bytes=_per_device_bytes(params), opt_bytes=_per_device_bytes(opt_state),
               rollout_param_bytes=_per_device_bytes(rollout_params))
  return [memory, answer, logprobs, update], shapes, facts


def _per_device_bytes(tree) -> int:
  """Bytes one device holds of an abstract tree (its shard of each array)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape)
    total += int(np.prod(shard)) * jnp.dtype(x.dtype).itemsize
  return total
