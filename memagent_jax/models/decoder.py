"""Flax NNX decoder-only LM for the Llama and Qwen2 families (RMSNorm, RoPE, GQA, SwiGLU).

Hot paths use it functionally: `graphdef, state = nnx.split(model)` once, then
`nnx.merge(graphdef, state)` inside jitted code. Every parameter carries logical axis
names (`out_sharding` metadata) that `parallel.py` maps to mesh axes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.models.config import ModelConfig

# Prefill attention runs in query blocks of this many tokens, each against only the keys it
# can see (causal), which halves attention FLOPs and keeps score tensors small.
QUERY_BLOCK = 512
# Square (prefill) attention longer than this runs block by block in a loop (bounded memory).
SCAN_PREFILL_FROM = 8192
# A very negative (finite) score so fully masked rows give a uniform softmax, never NaN.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


class LayerCache(NamedTuple):
  """Static-shape key/value cache of one layer: k, v [B, K, S, D] (K = kv heads, S = slots)."""
  k: jax.Array
  v: jax.Array


def _param(rngs: nnx.Rngs | None, shape, axes, dtype, init: str = "normal") -> nnx.Param:
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class RMSNorm(nnx.Module):
  """RMSNorm computed in float32, scaled in the input dtype (as transformers does)."""

  def __init__(self, dim: int, eps: float, dtype, axis: str = "norm"):
    self.eps = eps
    self.scale = _param(None, (dim,), (axis,), dtype, init="ones")

  def __call__(self, x):  # [..., E]
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return self.scale[...] * xf.astype(x.dtype)


def dense(x, w):
  """x [..., E] @ w [E, *out] -> [..., *out] as ONE 2-D matmul: XLA on CPU runs the backward of
  a dot that contracts several batch dims (the weight gradient) about 2x slower."""
  lead, e = x.shape[:-1], x.shape[-1]
  out = w.shape[1:]
  y = x.reshape(-1, e) @ w.reshape(e, -1)
  return y.reshape(*lead, *out)


def rope_tables(positions, head_dim: int, theta: float, dtype):
  """cos, sin [B, T, D] for integer positions [B, T] (rotate-half layout, as in HF)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x, cos, sin):  # x [B, T, H, D]; cos, sin [B, T, D]
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


class Attention(nnx.Module):
  """Grouped-query attention with optional q/k/v bias and a static-shape KV cache."""

  def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
    e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.num_kv_heads = k
    self.q = _param(rngs, (e, h, d), ("embed", "q_heads", "head_dim"), dtype)
    self.k = _param(rngs, (e, k, d), ("embed", "kv_heads", "head_dim"), dtype)
    self.v = _param(rngs, (e, k, d), ("embed", "kv_heads", "head_dim"), dtype)
    self.o = _param(rngs, (h, d, e), ("q_heads", "head_dim", "embed"), dtype)
    if cfg.attention_bias:
      self.q_bias = _param(None, (h, d), ("q_heads", "head_dim"), dtype, init="zeros")
      self.k_bias = _param(None, (k, d), ("kv_heads", "head_dim"), dtype, init="zeros")
      self.v_bias = _param(None, (k, d), ("kv_heads", "head_dim"), dtype, init="zeros")
    else:
      self.q_bias = self.k_bias = self.v_bias = None

  def __call__(self, x, cos, sin, mask, cache: LayerCache | None, write_index):
    """x [B, T, E]; mask [B, T, S] (True = may attend). Keys are the first S cache slots
    after writing this call's T keys at `write_index`; without a cache S == T."""
    q = dense(x, self.q[...])  # [B, T, H, D]
    k = dense(x, self.k[...])  # [B, T, K, D]
    v = dense(x, self.v[...])
    if self.q_bias is not None:
      q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, D]
    if cache is not None:
      idx = (0, 0, write_index, 0)
      cache = LayerCache(jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), idx),
                         jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), idx))
      s = mask.shape[-1]
      k, v = cache.k[:, :, :s].astype(x.dtype), cache.v[:, :, :s].astype(x.dtype)
    t, s = q.shape[1], mask.shape[-1]
    if t == s and t > SCAN_PREFILL_FROM:  # long: bounded memory (all keys per block, 2x FLOPs)
      out = causal_attend_scan(q, k, v, mask[:, -1, :])
    elif t == s and t > QUERY_BLOCK:  # square masks are causal: skip key blocks after each query block
      out = jnp.concatenate([
          attend(q[:, i:i + QUERY_BLOCK], k[:, :, :i + QUERY_BLOCK], v[:, :, :i + QUERY_BLOCK],
                 mask[:, i:i + QUERY_BLOCK, :i + QUERY_BLOCK]) for i in range(0, t, QUERY_BLOCK)], axis=1)
    else:
      out = attend(q, k, v, mask)
    b, t = out.shape[:2]
    return dense(out.reshape(b, t, -1), self.o[...].reshape(-1, self.o.shape[-1])), cache


def causal_attend_scan(q, k, v, key_valid):
  """Causal attention one query block at a time inside `lax.map`, each block against all keys
  with its mask built from key_valid [B, S]: memory O(block x S) instead of O(S^2), since XLA
  keeps every unrolled block's scores alive at once (2.6 GB at 16K tokens for a tiny model)."""
  b, t, h, d = q.shape
  n = -(-t // QUERY_BLOCK)
  qp = jnp.pad(q, ((0, 0), (0, n * QUERY_BLOCK - t), (0, 0), (0, 0)))  # rows past t are dropped
  qb = qp.reshape(b, n, QUERY_BLOCK, h, d).swapaxes(0, 1)  # [n, B, QB, H, D]

  def block(args):
    i, qi = args
    rows = i * QUERY_BLOCK + jnp.arange(QUERY_BLOCK)
    m = (rows[:, None] >= jnp.arange(t)[None, :])[None] & key_valid[:, None, :]  # [B, QB, S]
    return attend(qi, k, v, m)

  out = jax.lax.map(block, (jnp.arange(n), qb))  # [n, B, QB, H, D]
  return out.swapaxes(0, 1).reshape(b, n * QUERY_BLOCK, h, d)[:, :t]


def attend(q, k, v, mask):
  """Softmax attention. q [B, T, H, D]; k, v [B, K, S, D]; mask [B, T, S] -> [B, T, H, D].

  The G = H / K query heads that share a key head are stacked along the query axis, so each
  key head is one large matmul (about 4x faster on CPU than G small ones)."""
  b, t, h, d = q.shape
  kh = k.shape[1]
  g = h // kh
  qm = q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, d)  # [B, K, G*T, D]
  scores = jnp.einsum("bkmd,bksd->bkms", qm, k).astype(jnp.float32) * (d ** -0.5)  # [B, K, G*T, S]
  scores = jnp.where(jnp.tile(mask, (1, g, 1))[:, None], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = jnp.einsum("bkms,bksd->bkmd", probs, v)  # [B, K, G*T, D]
  return out.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(x @ gate) * (x @ up))."""

  def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
    e, f = cfg.hidden_size, cfg.intermediate_size
    self.gate = _param(rngs, (e, f), ("embed", "mlp"), dtype)
    self.up = _param(rngs, (e, f), ("embed", "mlp"), dtype)
    self.down = _param(rngs, (f, e), ("mlp", "embed"), dtype)

  def __call__(self, x):  # [B, T, E]
    h = jax.nn.silu(dense(x, self.gate[...])) * dense(x, self.up[...])  # [B, T, F]
    return dense(h, self.down[...])


class Block(nnx.Module):
  """Pre-norm transformer block."""

  def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.attn = Attention(cfg, dtype, rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.mlp = MLP(cfg, dtype, rngs)

  def __call__(self, x, cos, sin, mask, cache, write_index):
    h, cache = self.attn(self.attn_norm(x), cos, sin, mask, cache, write_index)
    x = x + h
    return x + self.mlp(self.mlp_norm(x)), cache


class Decoder(nnx.Module):
  """Token ids -> final hidden states; `logits` projects them onto the vocabulary."""

  def __init__(self, cfg: ModelConfig, dtype=jnp.float32, *, rngs: nnx.Rngs):
    self.config = cfg
    self.dtype = jnp.dtype(dtype)
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
    self.layers = nnx.List([Block(cfg, dtype, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype))

  def __call__(self, tokens, positions, mask, cache=None, write_index=0, remat: bool = False):
    """tokens, positions [B, T]; mask [B, T, S] -> (hidden [B, T, E], new cache list or None).

    remat=True (training, no cache) recomputes each block's activations in the backward pass
    instead of storing them: memory per layer drops to its input."""
    x = jnp.take(self.embed[...], tokens, axis=0)
    cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta, self.dtype)
    new_cache = [] if cache is not None else None
    for i, layer in enumerate(self.layers):
      if remat and cache is None:
        x = nnx.remat(lambda blk, h: blk(h, cos, sin, mask, None, 0)[0])(layer, x)
        continue
      x, layer_cache = layer(x, cos, sin, mask, None if cache is None else cache[i], write_index)
      if cache is not None:
        new_cache.append(layer_cache)
    return self.final_norm(x), new_cache

  def logits(self, hidden):
    """hidden [..., E] -> float32 logits [..., V]."""
    if self.lm_head is None:  # tied: contract with the embedding directly, never transpose it
      lead = hidden.shape[:-1]
      flat = jnp.einsum("ne,ve->nv", hidden.reshape(-1, hidden.shape[-1]), self.embed[...])
      return flat.reshape(*lead, -1).astype(jnp.float32)
    return dense(hidden, self.lm_head[...]).astype(jnp.float32)


def init_cache(cfg: ModelConfig, batch: int, size: int, dtype) -> list[LayerCache]:
  """Zeroed cache of `size` slots per row for every layer."""
  shape = (batch, cfg.num_kv_heads, size, cfg.head_dim)
  return [LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers)]


def causal_mask(valid):
  """valid [B, T] (False = padding) -> [B, T, T]: causal and no attention to padding keys."""
  t = valid.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  return causal[None] & valid[:, None, :]


def positions_from_mask(valid):
  """Left-padded rows: position of each real token counts real tokens before it. [B, T]."""
  return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)


def forward_logits(model: Decoder, tokens, valid=None):
  """Full forward without cache: tokens [B, T] -> float32 logits [B, T, V]."""
  if valid is None:
    valid = jnp.ones(tokens.shape, bool)
  hidden, _ = model(tokens, positions_from_mask(valid), causal_mask(valid))
  return model.logits(hidden)
