"""The optimizer: AdamW with global-norm clipping and a warm-up + constant/cosine schedule.

The schedule advances once per rollout step (as verl steps its scheduler once per actor
update), not once per mini-batch: `warmup_steps=20` means 20 rollout steps.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "cosine")


def learning_rate_schedule(lr: float, schedule: str, warmup_steps: int, total_steps: int,
                           min_lr_ratio: float = 0.0, updates_per_step: int = 1):
  """optax schedule over optimizer updates: linear warm-up, then constant or cosine decay."""
  if schedule not in SCHEDULES:
    raise ValueError(f"optim.schedule={schedule!r}; choose one of {SCHEDULES}")
  if lr <= 0 or warmup_steps < 0 or total_steps < 1 or updates_per_step < 1:
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


def make_optimizer(optim_cfg, total_steps: int, updates_per_step: int) -> optax.GradientTransformation:
  """AdamW (+ weight decay) after clipping the global gradient norm (0 disables clipping)."""
  sched = learning_rate_schedule(optim_cfg.lr, optim_cfg.schedule, optim_cfg.warmup_steps, total_steps,
                                 optim_cfg.min_lr_ratio, updates_per_step)
  adamw = optax.adamw(sched, b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
                      weight_decay=optim_cfg.weight_decay)
  if optim_cfg.grad_clip and optim_cfg.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(optim_cfg.grad_clip), adamw)
  return adamw
