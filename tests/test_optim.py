"""Optimizer knobs: the schedule by hand (per rollout step), weight decay, clipping, Adam betas;
and the mapping of every rl.* loss knob into the jitted update's spec."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy_cpu
from memagent_jax.experiment import specs
from memagent_jax.rl.optim import OptimSpec, learning_rate_schedule, lr_at, make_optimizer, set_learning_rate


def test_schedule_by_hand():
  # lr 1.0, warm-up 4 rollout steps, 2 updates per step, 10 steps in all
  const = learning_rate_schedule(lr=1.0, schedule="constant", warmup_steps=4, total_steps=10, min_lr_ratio=0.0,
                                 updates_per_step=2)
  assert [float(const(c)) for c in range(0, 10, 2)] == [0.25, 0.5, 0.75, 1.0, 1.0]
  assert float(const(1)) == 0.25  # both updates of a step share its rate
  cos = learning_rate_schedule(lr=1.0, schedule="cosine", warmup_steps=4, total_steps=10, min_lr_ratio=0.1,
                               updates_per_step=2)
  for step in range(4, 10):  # cosine over the 6 steps after warm-up, down to 0.1
    want = 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (step - 4) / 6))
    assert float(cos(2 * step)) == pytest.approx(want, rel=1e-6)
  assert float(cos(2 * 3)) == 1.0
  with pytest.raises(ValueError, match="schedule"):
    learning_rate_schedule(lr=1.0, schedule="linear", warmup_steps=0, total_steps=10, min_lr_ratio=0.0)


def _optim(**kw):
  return OptimSpec(**{**dict(lr=0.1, total_steps=10), **kw})


def _apply(optim_cfg, grads, params):
  """Params after one update per gradient in `grads` (varying gradients: Adam's betas and the
  clip only matter when gradients change from step to step)."""
  tx = make_optimizer(optim_cfg)
  state = tx.init(params)
  for step, g in enumerate(grads):
    state = set_learning_rate(state, lr_at(optim_cfg, step))  # as the trainer does per step
    updates, state = tx.update(g, state, params)
    params = {k: params[k] + updates[k] for k in params}
  return params


@pytest.mark.parametrize("field,value", [("weight_decay", 0.5), ("grad_clip", 0.01), ("b1", 0.0),
                                          ("b2", 0.5), ("eps", 1.0), ("lr", 0.01), ("warmup_steps", 5),
                                          ("schedule", "cosine")])
def test_each_optimizer_knob_changes_the_update(field, value):
  params = {"w": jnp.asarray([1.0, -2.0, 3.0])}
  grads = [{"w": jnp.asarray(g)} for g in ([0.5, 0.1, -3.0], [2.0, -1.0, 0.2], [-0.3, 0.4, 1.0])]
  base = _apply(_optim(), grads, params)["w"]
  other = _apply(_optim(**{field: value}), grads, params)["w"]
  assert float(jnp.max(jnp.abs(base - other))) > 1e-5


def test_learning_rate_follows_the_rollout_step_not_the_update_count():
  """Steps with fewer updates (dynamic sampling, skipped non-finite updates) do not shift the
  schedule: the rate is set from the step."""
  cfg = _optim(lr=1.0, warmup_steps=4)
  tx = make_optimizer(cfg)
  state = set_learning_rate(tx.init({"w": jnp.zeros(2)}), lr_at(cfg, 2))
  assert float(state.hyperparams["learning_rate"]) == 0.75


@pytest.mark.parametrize("field,value,attr", [
    ("loss", "sft", "loss"), ("agg", "seq-mean-token-sum", "agg"), ("clip_low", 0.1, "clip_low"),
    ("clip_high", 0.4, "clip_high"), ("clip_c", 5.0, "clip_c"), ("kl_coef", 0.3, "kl_coef"),
    ("kl_kind", "abs", "kl_kind"), ("entropy_coef", 0.01, "entropy_coef")])
def test_every_loss_knob_reaches_the_update_spec(field, value, attr):
  c = toy_cpu.get_config()
  before = specs.update_spec(c, loss_from=100)
  c.rl[field] = value
  after = specs.update_spec(c, loss_from=100)
  assert getattr(after, attr) == value and getattr(before, attr) != value


def test_clip_c_zero_disables_dual_clip():
  c = toy_cpu.get_config()
  c.rl.clip_c = 0.0
  assert specs.update_spec(c, loss_from=100).clip_c is None
