"""Up-front validation of a training config: every bad value or combination fails before any
work, with a message naming the key, the value and the allowed range."""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

from memagent_jax.agent import gates
from memagent_jax.agent.memagent import PREFIX_CACHE_CHOICES
from memagent_jax.models.decoder import REMAT_POLICIES
from memagent_jax.runtime.parallel import CLUSTER_CHOICES, ROLLOUT_LAYOUTS
from memagent_jax.data import curriculum
from memagent_jax.experiment import phase_configs
from memagent_jax.models import attention
from memagent_jax.rl import advantages, gate_signals, losses, rollout
from memagent_jax.rl.optim import SCHEDULES
from memagent_jax.rl.toy_teacher import TEACHERS


class Range(NamedTuple):
  """A numeric field's valid values: an integer (or a finite number) >= low, <= high (None: no
  bound), ends open where asked, or one of `allowed`; `why` ends the error message."""
  integer: bool
  low: float
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  allowed: tuple = ()
  why: str = ""

  def text(self) -> str:
    kind = "an integer" if self.integer else "a finite number"
    if self.high is None:
      return f"{kind} {'>' if self.low_open else '>='} {self.low}"
    return f"{kind} in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


# Every numeric field of configs/base.py. `_walk` also rejects a non-finite number under any other key.
RANGES: dict[str, Range] = {
    "model.seed": Range(True, 0),
    "agent.chunk_tokens": Range(True, 1),
    "agent.memory_tokens": Range(True, 1),
    "agent.answer_tokens": Range(True, 1),
    "agent.question_tokens": Range(True, 1),
    "agent.block_chunks": Range(True, 1),
    "agent.decode_buckets": Range(True, 1),  # batch sizes of row compaction (1: none)
    "agent.max_chunks": Range(True, 0, why=" (0 = read everything)"),
    "agent.context_tokens": Range(True, 0, why=" (0 = the model's window)"),
    "data.length": Range(True, 1),
    "data.train_size": Range(True, 1),
    "data.seed": Range(True, 0),
    "rl.group_size": Range(True, 1),
    "rl.questions_per_step": Range(True, 1),
    "rl.ppo_mini_batch": Range(True, 1),
    "rl.micro_batches": Range(True, 1),
    "rl.rollout_batch": Range(True, 1),
    "rl.temperature": Range(False, 0, low_open=True),
    "rl.top_p": Range(False, 0, high=1, low_open=True),
    "rl.eps": Range(False, 0),
    "rl.clip_low": Range(False, 0, high=1, high_open=True),
    "rl.clip_high": Range(False, 0),
    "rl.clip_c": Range(False, 1, low_open=True, allowed=(0,), why=" (or 0 to disable the dual clip)"),
    "rl.kl_coef": Range(False, 0),
    "rl.entropy_coef": Range(False, 0),
    "rl.max_extra_gen_batches": Range(True, 0),
    "rl.overlong.max_tokens": Range(True, 1),
    "rl.overlong.cache_tokens": Range(True, 0),
    "rl.gate_rewards.keep": Range(False, 0),
    "rl.gate_rewards.exit": Range(False, 0),
    "rl.gate_rewards.format": Range(False, 0),
    "rl.gate_rewards.evidence": Range(False, 0),
    "rl.turn_advantage_weight": Range(False, 0, high=1),
    "optim.lr": Range(False, 0, low_open=True),
    "optim.warmup_steps": Range(True, 0),
    "optim.min_lr_ratio": Range(False, 0, high=1),
    "optim.weight_decay": Range(False, 0),
    "optim.grad_clip": Range(False, 0, low_open=True, allowed=(0,), why=" (or 0 to disable clipping)"),
    "optim.b1": Range(False, 0, high=1, high_open=True),
    "optim.b2": Range(False, 0, high=1, high_open=True),
    "optim.eps": Range(False, 0, low_open=True, why=" (it guards AdamW's division by sqrt(nu))"),
    "train.steps": Range(True, 1),
    "train.seed": Range(True, 0),
    "train.save_every": Range(True, 1),
    "train.keep_checkpoints": Range(True, 1),
    "train.log_every": Range(True, 1),
    "train.max_nan_steps": Range(True, 1),
    "eval.every": Range(True, 0, why=" (0 = off)"),
    "eval.size": Range(True, 0),
    "eval.seed": Range(True, 0),
    "eval.length": Range(True, 0, why=" (0 = the training length)"),
    "eval.temperature": Range(False, 0, why=" (0 = greedy)"),
    "eval.top_p": Range(False, 0, high=1, low_open=True),
    "eval.batch_size": Range(True, 1),
    "mesh.data": Range(True, 1, allowed=(-1,), why=" (or -1 for the remaining devices)"),
    "mesh.fsdp": Range(True, 1, allowed=(-1,), why=" (or -1 for the remaining devices)"),
    "mesh.tensor": Range(True, 1, allowed=(-1,), why=" (or -1 for the remaining devices)"),
    "distributed.num_processes": Range(True, 0, why=" (0 = from JAX_NUM_PROCESSES)"),
    "distributed.process_id": Range(True, 0, allowed=(-1,), why=" (or -1 for JAX_PROCESS_ID)"),
}
BOOLS = ("rl.recompute_old_logprobs", "rl.dynamic_sampling", "rl.mask_truncated",
         "rl.overlong.enable", "teacher.prompt_loss", "train.async_checkpoint", "train.progress",
         "model.scan_layers")


def _fail(msg: str):
  raise ValueError(f"config: {msg}")


def _get(cfg, key: str):
  node = cfg
  for part in key.split("."):
    node = node[part]
  return node


def check_range(key: str, value, valid: Range):
  """Raises ValueError naming key, value and range unless value is a finite number in range."""
  text = valid.text() + valid.why
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    _fail(f"{key}={value!r} must be {text}")
  if value in valid.allowed:
    return
  if not math.isfinite(value) or (valid.integer and value != int(value)):
    _fail(f"{key}={value!r} must be {text}")
  below = value < valid.low or (valid.low_open and value == valid.low)
  above = valid.high is not None and (value > valid.high or (valid.high_open and value == valid.high))
  if below or above:
    _fail(f"{key}={value!r} must be {text}")


def _walk(node, prefix=""):
  """Every non-finite float anywhere in the config (teacher.options, sweeps' extra keys)."""
  items = node.items() if hasattr(node, "items") else ()
  for k, v in items:
    key = f"{prefix}{k}"
    if hasattr(v, "items"):
      _walk(v, key + ".")
    elif isinstance(v, float) and not math.isfinite(v):
      _fail(f"{key}={v!r} must be a finite number")


def check_numbers(cfg):
  """Every numeric key finite and in its range; booleans are booleans."""
  for key, valid in RANGES.items():
    check_range(key, _get(cfg, key), valid)
  for key in BOOLS:
    if not isinstance(_get(cfg, key), bool):
      _fail(f"{key}={_get(cfg, key)!r} must be True or False")
  _walk(cfg)
  mesh = [cfg.mesh[a] for a in ("data", "fsdp", "tensor")]
  if mesh.count(-1) > 1:
    _fail(f"mesh data={mesh[0]}, fsdp={mesh[1]}, tensor={mesh[2]}: at most one axis may be -1")
  d = cfg.distributed
  if d.num_processes and d.process_id >= d.num_processes:
    _fail(f"distributed.process_id={d.process_id} must be in [0, distributed.num_processes={d.num_processes})")
  if d.cluster not in CLUSTER_CHOICES:
    _fail(f"distributed.cluster={d.cluster!r}; choose one of {CLUSTER_CHOICES}")
  if cfg.eval.every and cfg.eval.size < 1:
    _fail(f"eval.size={cfg.eval.size} must be an integer >= 1 when eval.every={cfg.eval.every}")


def check_gates(cfg):
  """agent.memory and its gate keys, and the gate signals of rl: known names, used where they act."""
  a, rl = cfg.agent, cfg.rl
  if a.memory not in gates.MEMORY_KINDS:
    _fail(f"agent.memory={a.memory!r}; choose one of {gates.MEMORY_KINDS}")
  if a.gate_forms not in gates.GATE_FORMS:
    _fail(f"agent.gate_forms={a.gate_forms!r}; choose one of {sorted(gates.GATE_FORMS)}")
  if a.invalid_gate not in gates.INVALID_GATES:
    _fail(f"agent.invalid_gate={a.invalid_gate!r}; choose one of {gates.INVALID_GATES}")
  if a.memory == "gated" and a.kind != "memagent":
    _fail(f"agent.memory='gated' needs agent.kind='memagent' (got {a.kind!r}): the direct reader has no memory")
  if set(rl.gate_rewards.keys()) != set(gate_signals.GATE_TERMS):
    _fail(f"rl.gate_rewards has keys {sorted(rl.gate_rewards.keys())}; expected {sorted(gate_signals.GATE_TERMS)}")
  weighted = sorted(k for k, w in rl.gate_rewards.items() if w)
  if weighted and a.memory != "gated":
    _fail(f"rl.gate_rewards {weighted} weigh gate terms, but agent.memory={a.memory!r} has no gates")
  if rl.gate_rewards.exit and a.gate_forms != "keep_stop":
    _fail(f"rl.gate_rewards.exit={rl.gate_rewards.exit} rewards stopping, but agent.gate_forms={a.gate_forms!r} "
          "has no stop form; use 'keep_stop'")
  if rl.advantage_mode not in gate_signals.ADVANTAGE_MODES:
    _fail(f"rl.advantage_mode={rl.advantage_mode!r}; known: {sorted(gate_signals.ADVANTAGE_MODES)}")


def validate_config(cfg):
  """Raises ValueError for bad values or settings that cannot work together (model-dependent
  checks, such as the context budget, happen when the agent is built)."""
  check_numbers(cfg)
  rl, t = cfg.rl, cfg.train
  if rl.advantage not in advantages.ADVANTAGES:
    _fail(f"rl.advantage={rl.advantage!r}; known: {sorted(advantages.ADVANTAGES)}")
  if t.source not in ("rollout", "teacher"):
    _fail(f"train.source={t.source!r}; choose 'rollout' (RL) or 'teacher' (supervised)")
  if (t.source == "teacher") != (rl.loss == "sft"):
    _fail(f"train.source={t.source!r} with rl.loss={rl.loss!r}: teacher rows train with the 'sft' loss "
          "and only they do (a policy-gradient loss needs rollouts and rewards)")
  if cfg.model.remat not in REMAT_POLICIES:
    _fail(f"model.remat={cfg.model.remat!r}; choose one of {list(REMAT_POLICIES)}")
  if cfg.mesh.rollout not in ROLLOUT_LAYOUTS:
    _fail(f"mesh.rollout={cfg.mesh.rollout!r}; choose one of {list(ROLLOUT_LAYOUTS)}")
  if cfg.model.attention not in attention.BACKENDS:  # the platform check comes with load_policy
    _fail(f"model.attention={cfg.model.attention!r}; choose one of {list(attention.BACKENDS)}")
  if cfg.agent.kind not in ("memagent", "direct"):
    _fail(f"agent.kind={cfg.agent.kind!r}; choose 'memagent' or 'direct'")
  if cfg.agent.template_prefix_cache not in PREFIX_CACHE_CHOICES:
    _fail(f"agent.template_prefix_cache={cfg.agent.template_prefix_cache!r}; choose one of {PREFIX_CACHE_CHOICES}")
  check_gates(cfg)
  if cfg.agent.kind == "direct" and t.source != "teacher":
    _fail("agent.kind='direct' (the full-attention baseline) trains only supervised: set train.source='teacher'")
  if cfg.data.get("phases", ""):
    for _, settings in curriculum.parse_phases(cfg.data.phases, cfg.data.options, t.steps):
      phase_configs.phase_config(cfg, settings)  # each phase's values fit data.options' types
  if t.source == "teacher":
    if cfg.teacher.name not in TEACHERS:
      _fail(f"teacher.name={cfg.teacher.name!r}; known: {sorted(TEACHERS)}")
  if rl.advantage == "grpo" and rl.group_size < 2 and t.source == "rollout":
    _fail(f"rl.advantage='grpo' divides by the group's std, which needs rl.group_size >= 2 "
          f"(got {rl.group_size}); use rl.advantage='mean_centred' or a larger group")
  if rl.questions_per_step % rl.ppo_mini_batch:
    _fail(f"rl.questions_per_step={rl.questions_per_step} is not a multiple of rl.ppo_mini_batch="
          f"{rl.ppo_mini_batch}")
  if rl.rollout_batch % rl.group_size:
    _fail(f"rl.rollout_batch={rl.rollout_batch} must be a multiple of rl.group_size={rl.group_size}")
  if rl.loss not in losses.POLICY_LOSSES:
    _fail(f"rl.loss={rl.loss!r}; known: {sorted(losses.POLICY_LOSSES)}")
  if rl.agg not in losses.AGG_MODES:
    _fail(f"rl.agg={rl.agg!r}; known: {list(losses.AGG_MODES)}")
  if rl.kl_coef and rl.kl_kind not in losses.KL_KINDS + tuple(losses.KL_ALIASES):
    _fail(f"rl.kl_kind={rl.kl_kind!r}; known: {list(losses.KL_KINDS) + list(losses.KL_ALIASES)}")
  if rl.temperature != 1.0 and not rl.recompute_old_logprobs:
    _fail(f"rl.temperature={rl.temperature} needs rl.recompute_old_logprobs=True: the sampler reports "
          "temperature-1 log-probs, not those of the distribution that sampled")
  if rl.advantage in ("grpo", "batch_std") and rl.eps <= 0:
    _fail(f"rl.eps={rl.eps} must be > 0 with rl.advantage={rl.advantage!r} (it guards the division by the std)")
  if rl.reward not in rollout.REWARD_FNS:
    _fail(f"rl.reward={rl.reward!r}; known: {sorted(rollout.REWARD_FNS)}")
  if rl.on_insufficient not in ("fail", "proceed"):
    _fail(f"rl.on_insufficient={rl.on_insufficient!r}; choose 'fail' or 'proceed'")
  if rl.dynamic_sampling_filter not in rollout.DYNAMIC_SAMPLING_FILTERS:
    _fail(f"rl.dynamic_sampling_filter={rl.dynamic_sampling_filter!r}; choose one of "
          f"{rollout.DYNAMIC_SAMPLING_FILTERS}")
  if rl.overlong.enable and not 0 < rl.overlong.cache_tokens <= rl.overlong.max_tokens:
    _fail(f"rl.overlong needs 0 < cache_tokens <= max_tokens; got {rl.overlong.cache_tokens}, "
          f"{rl.overlong.max_tokens}")
  if rl.overlong.enable and rl.overlong.max_tokens > cfg.agent.answer_tokens:
    _fail(f"rl.overlong.max_tokens={rl.overlong.max_tokens} exceeds agent.answer_tokens="
          f"{cfg.agent.answer_tokens}: no answer can be that long, so the penalty could never reach -1")
  if cfg.optim.schedule not in SCHEDULES:
    _fail(f"optim.schedule={cfg.optim.schedule!r}; choose one of {SCHEDULES}")
  if cfg.data.train_size < rl.questions_per_step:
    _fail(f"data.train_size={cfg.data.train_size} is smaller than one step's rl.questions_per_step="
          f"{rl.questions_per_step}")
