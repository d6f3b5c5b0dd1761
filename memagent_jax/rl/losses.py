"""Token-level RL losses for Multi-Conv DAPO: clipped surrogate, KL, entropy, SFT.

Pure jax.numpy functions, jit-compatible; string/float knobs (`agg`, `kind`, `clip_c`)
are static Python values. Shapes: R rows (one conversation each), T response tokens,
V vocabulary. Definitions follow verl's `core_algos.py` (which MemAgent forks).

Loss registry (`get_policy_loss(cfg.loss)`): every registered loss has the one signature

  fn(logp, old_logp, advantages, mask, *, clip_low, clip_high, clip_c, agg, denominator)
      -> (loss scalar, metrics: dict[str, scalar])

so the update calls any of them the same way: "ppo_clip" is `policy_loss`, "sft" is
`sft_loss`. Losses that do not use an argument ignore it ("sft" ignores old_logp, advantages
and the clips). Metrics are masked means over the tokens of this call (local, not
mini-batch, stats). The knobs have no defaults here but in the documented public
`policy_loss` / `kl_penalty`; training passes the config's values (configs/base.py).

Gradient accumulation: pass `denominator=agg_denominator(minibatch_mask, agg)` to every
micro-batch's `aggregate` and SUM the micro-batch results; that equals the aggregate of
the whole mini-batch (a mean of micro-batch means would not).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from memagent_jax.runtime.registry import Registry

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
             "seq-mean-token-sum-norm")
KL_KINDS = ("kl", "mse", "low_var_kl", "abs")
KL_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
LOG_RATIO_CLAMP = 20.0  # verl clamps log-ratios before exp so one bad token cannot overflow.
K3_CLAMP = 10.0  # verl clamps the k3 estimate to keep rare huge values out of the gradient.


def _f32(x) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


def _check_agg(agg: str) -> None:
  if agg not in AGG_MODES:
    raise ValueError(f"unknown loss aggregation {agg!r}; modes: {list(AGG_MODES)}")


def _safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den, but 0 where den == 0 (an all-masked batch contributes nothing, not NaN)."""
  ok = den > 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  return _safe_div(jnp.sum(jnp.where(mask > 0, x, 0.0) * mask), jnp.sum(mask))


def agg_denominator(mask, agg: str) -> jax.Array:
  """The local normaliser of `aggregate`, so callers can compute it over a mini-batch.

  token-mean: number of masked tokens; seq-mean-*: number of rows with >= 1 token (sum
  these over micro-batches); seq-mean-token-sum-norm: the horizon T = mask.shape[-1],
  which is NOT additive: pass the same constant (e.g. the max response length) to every
  micro-batch.
  """
  _check_agg(agg)
  mask = _f32(mask)  # [R, T]
  if agg == "token-mean":
    return jnp.sum(mask)
  if agg == "seq-mean-token-sum-norm":
    return jnp.asarray(mask.shape[-1], jnp.float32)
  return jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))


def aggregate(loss_mat, mask, *, agg: str, denominator: Optional[jax.Array] = None) -> jax.Array:
  """Reduces a per-token loss [R, T] to a scalar the way verl's `agg_loss` does.

  Modes:
    token-mean: sum(loss * mask) / sum(mask)  (DAPO; the MemAgent default).
    seq-mean-token-mean: mean over non-empty rows of each row's token mean (GRPO).
    seq-mean-token-sum: mean over non-empty rows of each row's token sum.
    seq-mean-token-sum-norm: sum(loss * mask) / T (Dr.GRPO; verl divides by the padded
      horizon loss_mask.shape[-1], which should stay constant through training).
  Rows with no tokens are left out of the seq-mean modes (as current verl does).
  `denominator`, when given, replaces the local one (see `agg_denominator`).
  """
  _check_agg(agg)
  mask = _f32(mask)  # [R, T]
  loss = jnp.where(mask > 0, _f32(loss_mat), 0.0) * mask  # [R, T]; padding may hold inf/NaN
  den = agg_denominator(mask, agg) if denominator is None else _f32(denominator)
  if agg == "token-mean" or agg == "seq-mean-token-sum-norm":
    return _safe_div(jnp.sum(loss), den)
  row_sum = jnp.sum(loss, axis=-1)  # [R]
  if agg == "seq-mean-token-mean":
    row_sum = _safe_div(row_sum, jnp.sum(mask, axis=-1))  # [R] row token means
  return _safe_div(jnp.sum(row_sum), den)


def _row_advantages(advantages, shape) -> jax.Array:
  """[R] per-row advantages broadcast over T, or [R, T] passed through."""
  adv = _f32(advantages)
  if adv.ndim == 1:
    adv = adv[:, None]  # [R, 1]
  return jnp.broadcast_to(adv, shape)


class PolicyLossTerms(NamedTuple):
  """What a policy loss reports beside its scalar: token means over the loss mask (0 where the loss has
  no such term: the SFT loss clips nothing, the clipped surrogate's NLL is not computed)."""
  clip_frac: jax.Array | float = 0.0  # share of tokens where the clipped branch is active
  dual_clip_frac: jax.Array | float = 0.0  # share where the dual clip binds
  approx_kl_old: jax.Array | float = 0.0  # mean of old_logp - logp (clamped log-ratio, as verl)
  nll: jax.Array | float = 0.0  # mean negative log-likelihood (the SFT loss)


@dataclasses.dataclass(frozen=True)
class ClipSpec:
  """The clipped surrogate's ratio bounds [1 - low, 1 + high] and optional dual-clip constant."""
  low: float = 0.2
  high: float = 0.28  # DAPO's clip-higher
  dual: Optional[float] = None  # > 1: bounds the loss of negative-advantage tokens at -A * dual

  def __post_init__(self):
    if self.dual is not None and not self.dual > 1.0:
      raise ValueError(f"dual-clip constant clip_c must be > 1, got {self.dual}")


def policy_loss_terms(logp, old_logp, advantages, mask, *, clip_low: float, clip_high: float,
                      clip_c: Optional[float]):
  """Per-token PPO clipped surrogate (clip-higher, optional dual clip) and its diagnostics.

  Args:
    logp: [R, T] log-probs of the sampled tokens under the policy being trained.
    old_logp: [R, T] log-probs under the rollout (behaviour) policy.
    advantages: [R] per row, or [R, T].
    mask: [R, T] 1 on response tokens.
    clip_low, clip_high: ratio clipped to [1 - clip_low, 1 + clip_high] (DAPO: 0.2/0.28).
    clip_c: dual-clip constant (> 1); bounds the loss of negative-advantage tokens at
      -A * clip_c. None disables it.

  Returns:
    (loss_mat [R, T], PolicyLossTerms with clip_frac, dual_clip_frac and approx_kl_old).
  """
  if clip_c is not None and not clip_c > 1.0:
    raise ValueError(f"dual-clip constant clip_c must be > 1, got {clip_c}")
  logp, old_logp, mask = _f32(logp), _f32(old_logp), _f32(mask)
  adv = _row_advantages(advantages, logp.shape)  # [R, T]
  log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [R, T]
  ratio = jnp.exp(log_ratio)
  pg1 = -adv * ratio
  pg2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss = jnp.maximum(pg1, pg2)  # [R, T]
  clipfrac = _masked_mean((pg2 > pg1).astype(jnp.float32), mask)
  if clip_c is None:
    clipfrac_lower = jnp.zeros((), jnp.float32)
  else:
    pg3 = -adv * clip_c
    neg = adv < 0
    clipfrac_lower = _masked_mean((neg & (loss > pg3)).astype(jnp.float32), mask)
    loss = jnp.where(neg, jnp.minimum(loss, pg3), loss)
  return loss, PolicyLossTerms(clip_frac=clipfrac, dual_clip_frac=clipfrac_lower,
                               approx_kl_old=_masked_mean(-log_ratio, mask))


# Documented public API (DESIGN.md): its defaults are the paper's values (DAPO clip-higher, token-mean).
def policy_loss(logp, old_logp, advantages, mask, clip_low: float = 0.2, clip_high: float = 0.28,
                clip_c: Optional[float] = None, agg: str = "token-mean", *,
                denominator: Optional[jax.Array] = None, with_metrics: bool = False):
  """Scalar clipped-surrogate loss: `policy_loss_terms` reduced by `aggregate`.

  with_metrics=True returns (loss, PolicyLossTerms of `policy_loss_terms`)."""
  _check_agg(agg)
  loss, metrics = policy_loss_terms(logp, old_logp, advantages, mask, clip_low=clip_low,
                                    clip_high=clip_high, clip_c=clip_c)
  total = aggregate(loss, mask, agg=agg, denominator=denominator)
  return (total, metrics) if with_metrics else total


# Documented public API (DESIGN.md): its default is the released MemAgent's estimator (k3).
def kl_penalty(logp, ref_logp, kind: str = "low_var_kl") -> jax.Array:
  """Per-token KL estimate [R, T] between the policy and the reference (verl's estimators).

  kl (k1): logp - ref; mse (k2): 0.5 (logp - ref)^2; abs: |logp - ref|;
  low_var_kl (k3, released MemAgent): kl = clamp(ref - logp, +-20), clamp(e^kl - kl - 1, +-10).
  """
  name = KL_ALIASES.get(kind, kind)
  if name not in KL_KINDS:
    raise ValueError(f"unknown KL kind {kind!r}; kinds: {list(KL_KINDS)} "
                     f"(aliases {sorted(KL_ALIASES)})")
  diff = _f32(logp) - _f32(ref_logp)  # [R, T]
  if name == "kl":
    return diff
  if name == "mse":
    return 0.5 * jnp.square(diff)
  if name == "abs":
    return jnp.abs(diff)
  kl = jnp.clip(-diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.clip(jnp.exp(kl) - kl - 1.0, -K3_CLAMP, K3_CLAMP)


def entropy_from_logits(logits) -> jax.Array:
  """Entropy [R, T] of softmax(logits [R, T, V]) in float32; -inf logits are allowed."""
  logits = _f32(logits)
  logp = jax.nn.log_softmax(logits, axis=-1)  # [R, T, V]
  p = jnp.exp(logp)
  return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


@jax.custom_vjp
def token_logp_entropy(logits, target):
  """log p of target [...] under softmax(logits [..., V]) and the entropy [...], float32; -inf
  logits are allowed. One exp pass forward and one backward (autodiff of log_softmax +
  `entropy_from_logits` makes four): the vocabulary head of tiny-smollm2's update 2.6x faster."""
  return _token_logp_entropy_fwd(logits, target)[0]


def _token_logp_entropy_fwd(logits, target):
  logits = _f32(logits)
  m = jnp.max(logits, axis=-1, keepdims=True)
  z = logits - m  # <= 0
  e = jnp.exp(z)
  s = jnp.sum(e, axis=-1)
  log_s = jnp.log(s)
  entropy = log_s - jnp.sum(jnp.where(e > 0, e * z, 0.0), axis=-1) / s
  logp = jnp.take_along_axis(z, target[..., None], axis=-1)[..., 0] - log_s
  return (logp, entropy), (z, target, log_s, entropy)


def _token_logp_entropy_bwd(res, g):
  z, target, log_s, entropy = res
  g_logp, g_entropy = g  # d logp / d z = onehot - p; d entropy / d z = -p (log p + entropy)
  logp_all = z - log_s[..., None]
  p = jnp.exp(logp_all)
  pull = jnp.where(p > 0, p * (g_logp[..., None] + g_entropy[..., None] * (logp_all + entropy[..., None])), 0.0)
  onehot = jnp.arange(z.shape[-1]) == target[..., None]
  return jnp.where(onehot, g_logp[..., None], 0.0) - pull, None


token_logp_entropy.defvjp(_token_logp_entropy_fwd, _token_logp_entropy_bwd)


def sft_loss(logp, mask, *, agg: str, denominator: Optional[jax.Array] = None) -> jax.Array:
  """Negative log-likelihood of the response tokens, for supervised warm starts (the "sft" loss)."""
  return aggregate(-_f32(logp), mask, agg=agg, denominator=denominator)


# ---------------------------------------------------------------------------------------
# Registry.

# fn(logp, old_logp, advantages, mask, *, clip: ClipSpec, agg, denominator) -> (scalar, PolicyLossTerms)
PolicyLossFn = Callable[..., tuple[jax.Array, PolicyLossTerms]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.get


@register_policy_loss("ppo_clip")
def _ppo_clip(logp, old_logp, advantages, mask, *, clip: ClipSpec, agg: str, denominator: Optional[jax.Array]):
  """`policy_loss` (clip-higher, optional dual clip) with its clip diagnostics."""
  return policy_loss(logp, old_logp, advantages, mask, clip.low, clip.high, clip.dual, agg,
                     denominator=denominator, with_metrics=True)


@register_policy_loss("sft")
def _sft(logp, old_logp, advantages, mask, *, clip: ClipSpec, agg: str, denominator: Optional[jax.Array]):
  """`sft_loss`; the RL-only arguments are accepted for the uniform signature and ignored."""
  del old_logp, advantages, clip
  nll = _masked_mean(-_f32(logp), _f32(mask))
  return sft_loss(logp, mask, agg=agg, denominator=denominator), PolicyLossTerms(nll=nll)
