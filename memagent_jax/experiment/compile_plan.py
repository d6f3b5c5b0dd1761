"""The programs of one RL step as abstract values: a config -> the shapes, shardings and static
specs of the rollout (`memory_block`, `answer_block`), the log-prob passes and the updates, asked of
the reader and the trainer's planner themselves (no second derivation of the shapes) at a worst-case
step, without reading weights, loading data or using device memory.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memagent_jax.agent.placement import RowPlacement
from memagent_jax.agent.results import ConversationSlots
from memagent_jax.experiment import specs
from memagent_jax.experiment.assembly import build_reader, row_widths
from memagent_jax.models.attention import resolve_backend
from memagent_jax.models.config import PRESETS, get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.hf_weights import read_hf_config
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.policy.loading import EMBEDDED_DEFAULT, load_tokenizer, tokenizer_source_for_preset
from memagent_jax.policy.policy import Policy
from memagent_jax.rl import device_rows
from memagent_jax.rl import update as upd
from memagent_jax.rl.optim import make_optimizer
from memagent_jax.rl.trainer import plan_updates
from memagent_jax.runtime import parallel


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


@dataclasses.dataclass
class Program:
  """One jitted function, the abstract arguments the trainer passes it, and what stays alive beside it."""
  name: str
  fn: object
  args: tuple
  kwargs: dict
  note: str  # what one call is, for the report
  calls_per_step: int  # how often a step runs it
  co_resident: dict = dataclasses.field(default_factory=dict)  # buffer -> bytes per device alive beside it
  live_share: float = 1.0  # share of its work a call does: a memory block skips chunks past a document's end


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRows:
  """How many rows of which widths one RL step's rollouts hold (from the config's rl and agent sections)."""
  prompt_width: int  # P of a conversation slot
  response_width: int  # N
  questions: int  # rl.questions_per_step
  group_size: int  # trajectories per question
  rollout_rows: int  # trajectories per agent call
  turns: int  # conversation slots per trajectory: whole memory blocks + the final answer
  memory_updates: int  # chunks per document at the worst case


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepShapes(StepRows):
  """The static sizes of one RL step of a config (worst case: every prompt at its width): its rows,
  and how the reader's calls and the trainer's planner split them."""
  rollout_calls: int  # agent calls per step
  block_chunks: int
  mini_batches: int  # optimizer updates per step
  width_groups: tuple[tuple[int, int], ...]  # (rows, prompt width) of each group of the first mini-batch
  micro_batches: int
  logprob_passes: int  # log-prob passes over a width group per step (recomputed old + reference)


def worst_case_rows(agent, counts: StepRows, *, mesh, loss_on_prompt: bool = False) -> device_rows.SlotRows:
  """A step's kept rows at the worst case (every group kept, every document `memory_updates` chunks,
  every prompt at its longest): abstract slot tables [S, ...] laid out as the agent's calls lay them
  out, and the host arrays the trainer plans from."""
  prompt_width, response_width, turns = counts.prompt_width, counts.response_width, counts.turns
  memory_updates, group_size = counts.memory_updates, counts.group_size
  prompts = agent.prompt_tokens(agent.question_tokens)
  lengths = np.array([prompts["memory update"]] * memory_updates + [prompts["final answer"]])  # [C]
  responses = np.array([agent.memory_tokens] * memory_updates + [agent.answer_tokens])
  turn = np.concatenate([np.arange(memory_updates), [turns - 1]])  # active turns of a trajectory's slots
  trajectories = counts.questions * group_size
  calls = -(-trajectories // counts.rollout_rows)
  s = calls * counts.rollout_rows * turns
  place = RowPlacement(mesh, s)
  i32 = np.int32
  slots = ConversationSlots(prompt=place.abstract((s, prompt_width), i32), prompt_len=place.abstract((s,), i32),
                            response=place.abstract((s, response_width), i32),
                            response_len=place.abstract((s,), i32),
                            logprobs=place.abstract((s, response_width), np.float32),
                            truncated=place.abstract((s,), np.bool_))
  traj = np.arange(trajectories)
  slot = (traj[:, None] * turns + turn[None, :]).ravel()  # [T x C]: trajectory-major, as the collector
  c = len(turn)
  return device_rows.SlotRows(slots=slots, slot=slot.astype(np.int32), question=np.repeat(traj // group_size, c).astype(i32),
                              advantages=np.zeros(len(slot), np.float32), tokens=np.tile(lengths + responses, trajectories),
                              prompt_len=np.tile(lengths, trajectories), pad_id=agent.pad_id,
                              loss_on_prompt=loss_on_prompt)


def abstract_policy(cfg, mcfg, tokenizer, *, platform: str) -> Policy:
  """The config's policy with abstract weights (shapes, dtypes): nothing is read or allocated."""
  dtype = jnp.dtype(cfg.model.dtype)
  model = nnx.eval_shape(lambda: Decoder(mcfg, dtype, attention=cfg.model.attention, platform=platform,
                                         scan_layers=cfg.model.scan_layers, rngs=nnx.Rngs(0)))
  return Policy(model, tokenizer, name=cfg.model.source)


def build_programs(cfg, mesh, rules, *, platform: str = "tpu") -> tuple[list[Program], StepShapes, dict]:
  """Every distinct program one RL step of cfg runs on `mesh`, with the abstract arguments the reader
  and the trainer pass it: the reader's own call (`MemAgent.rollout_programs`) and the trainer's own
  plan of mini-batches and width groups (`trainer.plan_updates`) over a worst-case step's rows."""
  mcfg, tok_source, notes = model_of(cfg.model.source)
  tokenizer = load_tokenizer(tok_source)
  policy = abstract_policy(cfg, mcfg, tokenizer, platform=platform)
  backend = resolve_backend(cfg.model.attention, policy.dtype, platform)
  state = policy.state
  f32 = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), tree)
  train_sh = parallel.param_shardings(state, mesh, rules)
  params = _abstract(f32(state), train_sh)  # fp32 master weights
  roll_sh = parallel.param_shardings(state, mesh, parallel.rollout_rules(rules, cfg.mesh.rollout))
  policy.state = _abstract(state, roll_sh)  # the trainer's rollout copy (`Trainer._sync_policy`)
  tx = make_optimizer(specs.optim_spec(cfg))
  opt = jax.eval_shape(tx.init, f32(state))
  opt_state = _abstract(opt, parallel.opt_state_shardings(opt, f32(state), train_sh, mesh))
  agent = build_reader(cfg.agent, policy, training=True, mesh=mesh)
  prompt_width, response_width = row_widths(agent, cfg.agent.question_tokens, cfg.data.length)

  rl, a = cfg.rl, cfg.agent
  chunks = math.ceil(cfg.data.length / a.chunk_tokens)
  chunks = min(chunks, a.max_chunks) if a.max_chunks else chunks
  blocks = math.ceil(chunks / a.block_chunks)
  rollout_calls = math.ceil(rl.questions_per_step * rl.group_size / rl.rollout_batch)
  teacher_prompt_loss = cfg.train.source == "teacher" and cfg.teacher.prompt_loss
  counts = StepRows(prompt_width=prompt_width, response_width=response_width, questions=rl.questions_per_step,
                    group_size=rl.group_size, rollout_rows=rl.rollout_batch, turns=blocks * a.block_chunks + 1,
                    memory_updates=chunks)
  rows = worst_case_rows(agent, counts, mesh=mesh, loss_on_prompt=teacher_prompt_loss)
  train = specs.train_spec(cfg)
  update = specs.update_spec(cfg, loss_from=1 if teacher_prompt_loss else prompt_width)
  calls = plan_updates(rows, num_questions=rl.questions_per_step, spec=train, update=update,
                       multiple=train.micro_batches * parallel.batch_shards(mesh))

  # what stays alive through the step (per device): the trainer's state, its rollout copy, the slots
  alive = {"fp32 weights": _per_device_bytes(params), "optimizer state": _per_device_bytes(opt_state)}
  if update.kl_coef:
    alive["reference weights (fp32)"] = _per_device_bytes(params)
  if not (jnp.dtype(cfg.model.dtype) == jnp.float32 and cfg.mesh.rollout == "train"):  # else shares the weights
    alive["rollout weights"] = _per_device_bytes(policy.state)
  alive[f"conversation slots ({rollout_calls} agent calls)"] = _per_device_bytes(rows.slots)
  batches = [[device_rows.abstract_update_batch(rows, g, micro_batches=train.micro_batches, mesh=mesh)
              for g in call.groups] for call in calls]
  alive["update batches (every mini-batch)"] = _per_device_bytes(batches)
  beside = lambda *own: {k: v for k, v in alive.items() if k not in own}

  programs = []
  decode = DecodeSpec(temperature=rl.temperature, top_p=rl.top_p)
  rollout = agent.rollout_programs(rl.rollout_batch, decode=decode)
  fn, args, kw = rollout["rollout"]
  programs.append(Program("rollout", fn, args, kw, f"memory_block: {a.block_chunks} memory updates of "
                          f"{rl.rollout_batch} rows (prompt <= {prompt_width}, {a.memory_tokens} new tokens each)",
                          rollout_calls * blocks, beside("rollout weights"),
                          live_share=chunks / (blocks * a.block_chunks)))
  fn, args, kw = rollout["answer"]
  programs.append(Program("answer", fn, args, kw, f"answer_block: the final answer of {rl.rollout_batch} rows "
                          f"({a.answer_tokens} new tokens)", rollout_calls, beside("rollout weights")))
  seen = {}

  def add(kind, fn, args, kw, note, weights):
    key = (kind, _signature(args, kw))
    if key in seen:
      seen[key].calls_per_step += 1
      return
    name = kind if not any(k[0] == kind for k in seen) else f"{kind}#{sum(k[0] == kind for k in seen) + 1}"
    seen[key] = Program(name, fn, args, kw, note, 1, beside(*weights, "update batches (every mini-batch)"))
    own = _per_device_bytes(args[-1] if kind == "update" else args[1:])
    seen[key].co_resident["update batches (every mini-batch)"] = alive["update batches (every mini-batch)"] - own
    programs.append(seen[key])

  for call, groups in zip(calls, batches):
    for plan, b in zip(call.groups, groups):
      kw = dict(graphdef=policy.graphdef, spec=call.logprob_spec(b.prompt_width), prefix=None)
      m, r, w = b.tokens.shape
      note = f"batch_logprobs: one width group, {m} x {r} rows x {w} tokens"
      if call.recompute_old:
        add("logprobs", upd.batch_logprobs, (params, b.tokens, b.valid), kw, note, ("fp32 weights",))
      if call.reference:
        add("logprobs", upd.batch_logprobs, (params, b.tokens, b.valid), kw, note, ("reference weights (fp32)",))
    shapes = " + ".join(f"{g.tokens.shape[0]} x {g.tokens.shape[1]} rows x {g.tokens.shape[2]} tokens" for g in groups)
    add("update", upd.update_step, (params, opt_state, tuple(groups)),
        dict(graphdef=policy.graphdef, tx=tx, spec=call.update, prefix=(None,) * len(groups)),
        f"update_step: one mini-batch as {len(groups)} width group(s), {shapes}"
        + (" (old log-probs = current)" if call.update.old_is_current else ""), ("fp32 weights", "optimizer state"))

  first = batches[0]
  shapes = StepShapes(**dataclasses.asdict(counts), rollout_calls=rollout_calls, block_chunks=a.block_chunks,
                      mini_batches=len(calls),
                      width_groups=tuple((g.tokens.shape[0] * g.tokens.shape[1], g.prompt_width) for g in first),
                      micro_batches=train.micro_batches,
                      logprob_passes=sum((c.recompute_old + c.reference) * len(c.groups) for c in calls))
  facts = dict(model=mcfg, params=mcfg.num_params, backend=backend, notes=notes,
               param_bytes=_per_device_bytes(params), opt_bytes=_per_device_bytes(opt_state),
               rollout_param_bytes=_per_device_bytes(policy.state), alive=alive)
  return programs, shapes, facts


def _signature(args, kwargs) -> tuple:
  """What makes jit compile a new program: every array's shape, dtype and sharding, and the static
  arguments (specs) by value; the graph and optimizer are the same objects for every call."""
  leaves, treedef = jax.tree.flatten((args, {k: v for k, v in kwargs.items() if k not in ("graphdef", "tx")}))
  described = tuple((tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None))) if hasattr(x, "shape") else x
                    for x in leaves)
  return described, str(treedef)


def _per_device_bytes(tree) -> int:
  """Bytes one device holds of an abstract tree (its shard of each array)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    total += int(np.prod(shard)) * jnp.dtype(x.dtype).itemsize
  return total
