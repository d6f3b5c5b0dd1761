"""The optimizer: AdamW with global-norm clipping and a warm-up + constant/cosine schedule.

The schedule advances once per rollout step (as verl steps its scheduler once per actor
update), not once per optimizer update: `warmup_steps=20` means 20 rollout steps, whatever
number of updates each step makes (dynamic sampling may make fewer; a skipped non-finite
update makes none). The rate lives in the optimizer state (`optax.inject_hyperparams`) and
the trainer sets it from the step before each step's updates.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimSpec:
  """AdamW and its schedule over `total_steps` rollout steps; checks itself on construction."""
  lr: float
  schedule: str = "constant"
  warmup_steps: int = 0
  min_lr_ratio: float = 0.0
  total_steps: int = 1
  weight_decay: float = 0.0
  grad_clip: float = 0.0  # 0: no clipping
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8

  def __post_init__(self):
    learning_rate_schedule(lr=self.lr, schedule=self.schedule, warmup_steps=self.warmup_steps,
                           total_steps=self.total_steps, min_lr_ratio=self.min_lr_ratio)
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1 and self.eps > 0 and self.weight_decay >= 0
            and self.grad_clip >= 0):
      raise ValueError(f"OptimSpec needs 0 <= b1, b2 < 1, eps > 0, weight_decay >= 0, grad_clip >= 0; got {self}")


def learning_rate_schedule(*, lr: float, schedule: str, warmup_steps: int, total_steps: int,
                           min_lr_ratio: float, updates_per_step: int = 1):
  """optax schedule over optimizer updates: linear warm-up, then constant or cosine decay.

  updates_per_step 1: the count is the rollout step (as the trainer's `lr_at` reads it)."""
  if schedule not in SCHEDULES:
    raise ValueError(f"optim.schedule={schedule!r}; choose one of {SCHEDULES}")
  if not math.isfinite(lr) or lr <= 0 or warmup_steps < 0 or total_steps < 1 or updates_per_step < 1:
    raise ValueError(f"need lr > 0, warmup_steps >= 0, total_steps >= 1, updates_per_step >= 1; got "
                     f"{lr}, {warmup_steps}, {total_steps}, {updates_per_step}")
  decay_steps = max(1, total_steps - warmup_steps)

  def fn(count):
    step = count // updates_per_step  # rollout step
    warm = lr * jnp.minimum(1.0, (step + 1) / max(1, warmup_steps)) if warmup_steps else lr
    if schedule == "constant":
      return jnp.asarray(warm, jnp.float32)
    progress = jnp.clip((step - warmup_steps) / decay_steps, 0.0, 1.0)
    cosine = lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * progress)))
    return jnp.where(step < warmup_steps, warm, cosine).astype(jnp.float32)

  return fn


def lr_at(spec: OptimSpec, step: int) -> float:
  """The learning rate of rollout step `step` (0-based)."""
  schedule = learning_rate_schedule(lr=spec.lr, schedule=spec.schedule, warmup_steps=spec.warmup_steps,
                                    total_steps=spec.total_steps, min_lr_ratio=spec.min_lr_ratio)
  return float(schedule(step))


@functools.lru_cache(maxsize=None)
def make_optimizer(spec: OptimSpec) -> optax.GradientTransformation:
  """AdamW (+ weight decay) after clipping the global gradient norm (0 disables clipping); its
  learning rate is a state entry set per rollout step with `set_learning_rate`. One transform per
  spec: the update program takes it as a static argument (compared by identity), so trainers built
  from one spec (a curriculum's phases) reuse each other's compiled updates instead of recompiling."""
  adamw = optax.inject_hyperparams(optax.adamw)(
      learning_rate=lr_at(spec, 0), b1=spec.b1, b2=spec.b2, eps=spec.eps, weight_decay=spec.weight_decay)
  if spec.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(spec.grad_clip), adamw)
  return adamw


def set_learning_rate(opt_state, lr: float):
  """opt_state with its injected learning rate replaced (same shape and dtype: no recompile)."""
  def visit(node):
    if isinstance(node, optax.InjectStatefulHyperparamsState):
      old = node.hyperparams["learning_rate"]
      value = jax.device_put(jnp.asarray(lr, old.dtype), old.sharding) if hasattr(old, "sharding") else lr
      return node._replace(hyperparams={**node.hyperparams, "learning_rate": value})
    if isinstance(node, tuple) and not hasattr(node, "_fields"):
      return tuple(visit(n) for n in node)
    return node
  return visit(opt_state)
