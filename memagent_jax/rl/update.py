"""One jitted optimizer update: forward, response log-probs, loss, gradients, AdamW.

A mini-batch arrives as M micro-batches `[M, r, ...]`; gradients are summed over them in a
`lax.scan`, each micro-batch dividing its loss sum by the WHOLE mini-batch's denominator, so
the update equals the one computed on the mini-batch at once (token-mean over all its tokens,
not a mean of micro-batch means). A non-finite loss or gradient leaves params and optimizer
state untouched and is reported, so the trainer can count and stop.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from memagent_jax.models.decoder import positions_from_mask, remat_policy
from memagent_jax.policy.sampling import cache_with_prefix, prefix_cache
from memagent_jax.rl import losses


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpdateSpec:
  """Static settings of the update (hashable: a jit static argument); defaults live in the config."""
  prompt_width: int
  loss: str  # a losses.POLICY_LOSSES name
  agg: str
  clip_low: float
  clip_high: float
  clip_c: float | None  # None: no dual clip
  kl_coef: float
  kl_kind: str
  entropy_coef: float
  remat: str | bool  # models.decoder.REMAT_POLICIES (True/False: full/none)
  temperature: float  # the rollout temperature: log-probs of the distribution that sampled
  compute_dtype: str  # forward/backward dtype; params and AdamW state stay float32
  # the params that sampled are the ones being updated (a step's first mini-batch): the old
  # log-probs are the current ones without gradient (ratio 1), not a separate forward pass
  old_is_current: bool = False
  logits_chunk: int = 512  # response positions projected on the vocabulary at a time (`response_logprobs`)

  def __post_init__(self):
    losses.get_policy_loss(self.loss)  # unknown names raise, listing the known ones
    remat_policy(self.remat)
    if self.agg not in losses.AGG_MODES:
      raise ValueError(f"UpdateSpec.agg={self.agg!r}; choose one of {losses.AGG_MODES}")
    if losses.KL_ALIASES.get(self.kl_kind, self.kl_kind) not in losses.KL_KINDS:
      raise ValueError(f"UpdateSpec.kl_kind={self.kl_kind!r}; choose one of {losses.KL_KINDS}")
    if not (self.prompt_width >= 1 and self.clip_low >= 0 and self.clip_high >= 0 and self.kl_coef >= 0
            and self.temperature > 0 and (self.clip_c is None or self.clip_c > 1)):
      raise ValueError("UpdateSpec needs prompt_width >= 1, clip_low, clip_high, kl_coef >= 0, temperature > 0 "
                       f"and clip_c None or > 1; got {self}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class UpdateBatch:
  """One mini-batch as M micro-batches of r rows of P + N token columns (P: prompt, N: response)."""
  tokens: jax.Array  # [M, r, P + N] int32
  valid: jax.Array  # [M, r, P + N] bool: real tokens (attention mask)
  loss_mask: jax.Array  # [M, r, N] bool: response tokens that count in the loss
  old_logp: jax.Array  # [M, r, N] float32: log-probs of the policy that sampled
  ref_logp: jax.Array  # [M, r, N] float32: reference-policy log-probs (zeros when KL is off)
  advantages: jax.Array  # [M, r] float32

  def replace(self, **fields) -> "UpdateBatch":
    return dataclasses.replace(self, **fields)

  @property
  def prompt_width(self) -> int:
    """P: the first column the loss reads (1 for rows trained on whole conversations)."""
    return self.tokens.shape[-1] - self.loss_mask.shape[-1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class LossSums:
  """Per micro-batch sums the update turns into its metrics (token-weighted where a mean is wanted)."""
  pg_loss: jax.Array
  kl: jax.Array
  entropy: jax.Array
  clip_tokens: jax.Array  # tokens whose ratio was clipped
  dual_clip_tokens: jax.Array  # tokens the dual clip bounded
  approx_kl_old_tokens: jax.Array  # approximate KL to the sampling policy, summed over tokens
  tokens: jax.Array  # tokens in the loss

  @classmethod
  def zeros(cls) -> "LossSums":
    return cls(**{f.name: jnp.float32(0) for f in dataclasses.fields(cls)})


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class UpdateMetrics:
  """What one update reports (scalars, replicated)."""
  loss: jax.Array
  pg_loss: jax.Array
  kl: jax.Array
  entropy: jax.Array
  clip_frac: jax.Array
  dual_clip_frac: jax.Array
  approx_kl_old: jax.Array
  grad_norm: jax.Array
  tokens: jax.Array
  finite: jax.Array  # bool: the loss and gradients were finite, so the update was applied

  @classmethod
  def mean_names(cls) -> tuple[str, ...]:
    """The metrics a step averages over its updates (a count and a flag are not averaged)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("tokens", "finite"))


def cast_params(params, dtype):
  """A copy of the (float32 master) params in the compute dtype; differentiable."""
  dt = jnp.dtype(dtype)
  return jax.tree_util.tree_map(lambda p: p.astype(dt) if p.dtype != dt else p, params)


def hidden_states(model, tokens, valid, *, remat: str | bool, prefix=None, slots: tuple[int, int] | None = None):
  """Final hidden states of rows [r, W] at row slots a..b-1 of `slots` (a, b) (default: all W)
  -> [r, b - a, E]. With a shared prefix [L] (one every row fits, as rl/device_rows.py checks; L <= a)
  its keys are computed once for all rows and only slots L.. run per row."""
  positions = positions_from_mask(valid)
  a, b = slots or (0, tokens.shape[1])
  if prefix is None:
    return model(tokens, positions, valid, remat=remat, out_slots=(a, b))[0]
  l = prefix.shape[0]
  cache = cache_with_prefix(model, prefix_cache(model, prefix), tokens, valid, tokens.shape[1])
  return model(tokens[:, l:], positions[:, l:], valid[:, l:], cache, remat=remat, out_slots=(a - l, b - l))[0]


def response_logprobs(model, tokens, valid, *, prompt_width: int, remat: str | bool, temperature: float,
                      prefix=None, logits_chunk: int = 512):
  """log p of each response token and the entropy of its distribution at the sampling
  temperature (as verl). tokens, valid [r, P+N] -> (logp [r, N], entropy [r, N]); only the N
  response positions are projected on the vocabulary, `logits_chunk` at a time, so [r, N, V] fp32
  logits never exist. prefix: see `hidden_states`."""
  n = tokens.shape[1] - prompt_width
  hidden = hidden_states(model, tokens, valid, remat=remat, prefix=prefix,
                         slots=(prompt_width - 1, prompt_width - 1 + n))  # [r, N, E]: states that predict responses
  target = tokens[:, prompt_width:]  # [r, N]

  def logp_entropy(h, t):  # [r, c, E], [r, c] -> ([r, c], [r, c]); logits [r, c, V] live only here
    logits = model.logits(h)
    if temperature != 1.0:
      logits = logits / temperature
    return losses.token_logp_entropy(logits, t)

  c = logits_chunk
  if n <= c:
    return logp_entropy(hidden, target)
  k = -(-n // c)  # chunks of c positions, each's fp32 logits recomputed in the backward pass
  pad = ((0, 0), (0, k * c - n))
  h = jnp.pad(hidden, pad + ((0, 0),)).reshape(hidden.shape[0], k, c, -1).swapaxes(0, 1)  # [k, r, c, E]
  t = jnp.pad(target, pad).reshape(target.shape[0], k, c).swapaxes(0, 1)  # [k, r, c]
  logp, ent = jax.lax.map(jax.checkpoint(lambda ht: logp_entropy(*ht)), (h, t))  # [k, r, c] each
  unchunk = lambda x: x.swapaxes(0, 1).reshape(x.shape[1], k * c)[:, :n]
  return unchunk(logp), unchunk(ent)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogprobSpec:
  """Static settings of a log-prob pass (hashable: a jit static argument)."""
  prompt_width: int  # P: the first response column
  temperature: float  # the rollout temperature: log-probs of the distribution that sampled
  compute_dtype: str
  logits_chunk: int = 512  # response positions projected on the vocabulary at a time


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def batch_logprobs(params, tokens, valid, *, graphdef, spec: LogprobSpec, prefix=None):
  """Log-probs of the response tokens, micro-batch by micro-batch: [M, r, L] -> [M, r, N]."""
  model = nnx.merge(graphdef, cast_params(params, spec.compute_dtype))
  return jax.lax.map(lambda tv: response_logprobs(model, tv[0], tv[1], prompt_width=spec.prompt_width, remat=False,
                                                  temperature=spec.temperature, prefix=prefix,
                                                  logits_chunk=spec.logits_chunk)[0], (tokens, valid))


def _micro_loss(params, mb, denominator, prefix, *, graphdef, spec: UpdateSpec):
  """Loss of one micro-batch (already divided by the mini-batch denominator) + metric sums."""
  model = nnx.merge(graphdef, cast_params(params, spec.compute_dtype))
  logp, entropy = response_logprobs(model, mb.tokens, mb.valid, prompt_width=mb.prompt_width,
                                    remat=spec.remat, temperature=spec.temperature, prefix=prefix,
                                    logits_chunk=spec.logits_chunk)
  mask = mb.loss_mask
  old_logp = jax.lax.stop_gradient(logp) if spec.old_is_current else mb.old_logp
  loss_fn = losses.get_policy_loss(spec.loss)  # "ppo_clip" is losses.policy_loss, "sft" losses.sft_loss
  pg, terms = loss_fn(logp, old_logp, mb.advantages, mask, clip=losses.ClipSpec(spec.clip_low, spec.clip_high, spec.clip_c),
                      agg=spec.agg, denominator=denominator)
  ent = losses.aggregate(entropy, mask, agg=spec.agg, denominator=denominator)
  total = pg - spec.entropy_coef * ent if spec.entropy_coef else pg
  kl = jnp.float32(0)
  if spec.kl_coef:
    kl_mat = losses.kl_penalty(logp, mb.ref_logp, kind=spec.kl_kind)  # [r, N]
    kl = losses.aggregate(kl_mat, mask, agg=spec.agg, denominator=denominator)
    total = total + spec.kl_coef * kl
  n = jnp.sum(mask.astype(jnp.float32))  # the loss's per-call means -> token-weighted sums
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  sums = LossSums(pg_loss=f32(pg), kl=f32(kl), entropy=f32(ent), clip_tokens=f32(terms.clip_frac * n),
                  dual_clip_tokens=f32(terms.dual_clip_frac * n), approx_kl_old_tokens=f32(terms.approx_kl_old * n),
                  tokens=n)
  return total, sums


# params and optimizer state are donated: the updated ones reuse their buffers, so a step holds one
# copy of each (the caller must not read the arrays it passed in again)
@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "spec"), donate_argnames=("params", "opt_state"))
def update_step(params, opt_state, batch: UpdateBatch | tuple[UpdateBatch, ...], *, graphdef,
                tx: optax.GradientTransformation, spec: UpdateSpec, prefix=None):
  """One optimizer update on a mini-batch given as micro-batches (every array [M, r, ...]), or as
  width groups (a tuple of such batches, each of its own prompt width and the same response width:
  rows with short prompts do not pay the long ones' columns); prefix: a template opening [L] every
  row shares (as rl/device_rows.py checks), run once per micro-batch (a tuple, one per group, with groups).

  Returns (params, opt_state, UpdateMetrics); when the loss or gradients are not finite the
  inputs come back unchanged and metrics.finite is False."""
  groups = batch if isinstance(batch, tuple) else (batch,)
  prefixes = prefix if isinstance(prefix, tuple) else (prefix,) * len(groups)
  denominator = group_denominator([g.loss_mask for g in groups], spec.agg)
  grad_fn = jax.value_and_grad(_micro_loss, has_aux=True)
  carry = (jax.tree_util.tree_map(jnp.zeros_like, params), jnp.float32(0), LossSums.zeros())
  for group, group_prefix in zip(groups, prefixes):  # each group's shapes: its own scan

    def accumulate(carry, mb, group_prefix=group_prefix):
      grads, loss, sums = carry
      (l, s), g = grad_fn(params, mb, denominator, group_prefix, graphdef=graphdef, spec=spec)
      grads = jax.tree_util.tree_map(jnp.add, grads, g)
      return (grads, loss + l, jax.tree_util.tree_map(jnp.add, sums, s)), None

    carry, _ = jax.lax.scan(accumulate, carry, group)
  grads, loss, sums = carry
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, new_opt_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
  tokens = jnp.maximum(sums.tokens, 1.0)
  metrics = UpdateMetrics(loss=loss, pg_loss=sums.pg_loss, kl=sums.kl, entropy=sums.entropy,
                          clip_frac=sums.clip_tokens / tokens, dual_clip_frac=sums.dual_clip_tokens / tokens,
                          approx_kl_old=sums.approx_kl_old_tokens / tokens, grad_norm=grad_norm,
                          tokens=sums.tokens, finite=finite)
  return keep(new_params, params), keep(new_opt_state, opt_state), metrics


def group_denominator(masks, agg: str) -> jax.Array:
  """`losses.agg_denominator` of a mini-batch given as width groups' loss masks (each [M, r, N], the
  same N): counts add up over groups; the horizon of seq-mean-token-sum-norm is their common N."""
  widths = {m.shape[-1] for m in masks}
  if len(widths) != 1:
    raise ValueError(f"width groups must share their response width; got {sorted(widths)}")
  parts = [losses.agg_denominator(m.reshape(-1, m.shape[-1]), agg) for m in masks]
  return parts[0] if agg == "seq-mean-token-sum-norm" else sum(parts[1:], parts[0])


def split_micro(rows, micro_batches: int) -> UpdateBatch:
  """Row arrays [R, ...] (the UpdateBatch fields, by name) -> an UpdateBatch of [M, R / M, ...]
  (R must divide)."""
  out = {}
  for f in dataclasses.fields(UpdateBatch):
    a = rows[f.name]
    if a.shape[0] % micro_batches:
      raise ValueError(f"{a.shape[0]} rows do not split into {micro_batches} micro-batches")
    out[f.name] = a.reshape((micro_batches, a.shape[0] // micro_batches) + a.shape[1:])
  return UpdateBatch(**out)
