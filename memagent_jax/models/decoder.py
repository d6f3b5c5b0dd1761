"""Flax NNX decoder-only LM for the Llama, Qwen2 and Qwen3 families (RMSNorm, RoPE, GQA, SwiGLU;
Qwen2's q/k/v biases and Qwen3's q/k norms are config switches).

Hot paths use it functionally: `graphdef, state = nnx.split(model)` once, then
`nnx.merge(graphdef, state)` inside jitted code. Every parameter carries logical axis
names (`out_sharding` metadata) that `parallel.py` maps to mesh axes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.models.attention import AttentionSpec, attend, constrain_rows
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.kv_cache import KVCache, LayerCache


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
  """x [..., E] @ w [E, *out] -> [..., *out] as one 2-D matmul (tokens x E by E x out)."""
  lead, e = x.shape[:-1], x.shape[-1]
  out = w.shape[1:]
  return (x.reshape(-1, e) @ w.reshape(e, -1)).reshape(*lead, *out)


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
  """Grouped-query attention with optional q/k/v bias, optional q/k norms and a static-shape KV cache."""

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
    # Qwen3: RMSNorm over each head's D values of q and k, one scale [D] shared by all heads.
    self.q_norm = RMSNorm(d, cfg.rms_norm_eps, dtype, axis="head_dim") if cfg.qk_norm else None
    self.k_norm = RMSNorm(d, cfg.rms_norm_eps, dtype, axis="head_dim") if cfg.qk_norm else None

  def __call__(self, x, cos, sin, key_valid, cache: LayerCache | None, write_index, spec: AttentionSpec,
               out_slots: tuple[int, int] | None = None):
    """x [B, T, E]; key_valid [B, S]: key slots holding real tokens. Keys are the first S cache
    slots after writing this call's T keys at `write_index`; without a cache S == T. Queries sit
    at slots write_index.. and attend causally over slots (see attention.attend). out_slots (a, b):
    queries (and the output [B, b - a, E]) at this call's slots a..b-1 only."""
    a, b = out_slots or (0, x.shape[1])
    k = dense(x, self.k[...])  # [B, T, K, D]
    v = dense(x, self.v[...])
    q = dense(x[:, a:b], self.q[...])  # [B, b - a, H, D]
    if self.q_bias is not None:
      q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
    if self.q_norm is not None:  # before RoPE, as transformers' Qwen3Attention
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos[:, a:b], sin[:, a:b]), apply_rope(k, cos, sin)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, D]
    if cache is not None:
      idx = (0, 0, write_index, 0)
      cache = cache._replace(k=jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), idx),
                             v=jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), idx))
      k, v = cache.k, cache.v  # [B, K, S', D]: attend reads the first S = key_valid.shape[-1] slots
      if k.dtype != x.dtype:  # a cast copies anyway: only the attended slots
        s = key_valid.shape[-1]
        k, v = k[:, :, :s].astype(x.dtype), v[:, :, :s].astype(x.dtype)
    if cache is None and b < k.shape[2]:  # no query sees a key after its own slot
      k, v, key_valid = k[:, :, :b], v[:, :, :b], key_valid[:, :b]
    out = attend(q, k, v, key_valid, q_offset=write_index + a, spec=spec)
    return dense(out.reshape(*out.shape[:2], -1), self.o[...].reshape(-1, self.o.shape[-1])), cache


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

  def __call__(self, x, cos, sin, key_valid, cache, write_index, spec: AttentionSpec,
               out_slots: tuple[int, int] | None = None):
    """x [B, T, E] -> [B, T, E], or [B, b - a, E] at slots a..b-1 of out_slots (a, b)."""
    h, cache = self.attn(self.attn_norm(x), cos, sin, key_valid, cache, write_index, spec, out_slots)
    x = x if out_slots is None else x[:, out_slots[0]:out_slots[1]]
    x = x + h
    return x + self.mlp(self.mlp_norm(x)), cache


# model.remat: what a training forward keeps for the backward pass, per transformer block.
#   none: everything (fastest, most memory); full: only each block's input (jax.checkpoint with
#   nothing_saveable); dots: matmul outputs without batch dims (dots_with_no_batch_dims_saveable), so
#   the backward pass recomputes norms, RoPE, attention softmax and SwiGLU but no projection.
REMAT_POLICIES = ("none", "dots", "full")


def remat_policy(remat: str | bool):
  """A model.remat value -> the jax checkpoint policy (None: no remat). True/False mean full/none."""
  name = {True: "full", False: "none"}.get(remat, remat) if isinstance(remat, bool) else remat
  if name not in REMAT_POLICIES:
    raise ValueError(f"model.remat={remat!r}; choose one of {', '.join(REMAT_POLICIES)}")
  return {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
          "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[name]


def _attention_spec(attention: str | AttentionSpec, platform: str | None) -> AttentionSpec:
  """A backend name or spec -> a checked spec whose platform is set (default: this process's)."""
  spec = AttentionSpec(backend=attention) if isinstance(attention, str) else attention
  return dataclasses.replace(spec, platform=platform or spec.platform or jax.default_backend()).check()


class Decoder(nnx.Module):
  """Token ids -> final hidden states; `logits` projects them onto the vocabulary."""

  def __init__(self, cfg: ModelConfig, dtype=jnp.float32, *, attention: str | AttentionSpec = "auto",
               platform: str | None = None, scan_layers: bool = True, rngs: nnx.Rngs):
    self.config = cfg
    self.dtype = jnp.dtype(dtype)
    # How attention is traced (backend auto | xla | cudnn | splash, the platform the programs are
    # compiled for: this process's backend, or "tpu" for compile-only TPU devices from a CPU host,
    # the xla tiling; see attention.AttentionSpec). Static, checked here so an unavailable choice
    # fails at load time. Set it on a built model with `set_attention`.
    self.attention = _attention_spec(attention, platform)
    # Forwards that do not decode (training, log-probs) run layers 0..L-2 as one lax.scan over stacked
    # weights (`_scan_layers`); False unrolls them. Static; the parameter tree is per layer either way.
    self.scan_layers = scan_layers
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
    self.layers = nnx.List([Block(cfg, dtype, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype))
    # [N, V, E] embeddings of the token d = 1..N slots back, zero at init (the plain model).
    self.token_shift = (_param(None, (cfg.token_shift, cfg.vocab_size, cfg.hidden_size),
                               (None, "vocab", "embed"), dtype, init="zeros") if cfg.token_shift else None)

  def weight_bytes(self) -> int:
    """Bytes of the model's weights (every Param): what a decode step reads."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(self, nnx.Param)))

  @property
  def platform(self) -> str:
    """The platform the model's programs are compiled for."""
    return self.attention.platform

  def set_attention(self, attention: str | AttentionSpec, platform: str | None = None):
    """Switches the attention backend or the whole spec (after loading weights into a model built
    with the default), and the target platform when given."""
    if isinstance(attention, str):
      attention = dataclasses.replace(self.attention, backend=attention)
    self.attention = _attention_spec(attention, platform or attention.platform)

  def __call__(self, tokens, positions, valid, cache: KVCache | None = None, remat: str | bool = "none",
               out_slots: tuple[int, int] | None = None, attend_slots: int | None = None):
    """tokens, positions, valid [B, T] -> (hidden [B, T, E], the cache after the write, or None).

    valid marks real tokens. Without a cache it is the key mask (S == T). With one, the T tokens
    are written at slots cache.cursor.. and the queries attend over the cache slots that hold real
    tokens: all S, or the first attend_slots (`KVCache`). Attention is causal over slots, so no
    [B, T, T] mask is ever built.
    remat (training; see REMAT_POLICIES): "full" (or True) recomputes each block's activations in the
    backward pass instead of storing them: memory per layer drops to its input (and its cache, when a
    shared prefix is read); "dots" keeps the matmul outputs and recomputes only what lies between.
    out_slots (a, b), static: hidden states of slots a..b-1 only, [B, b - a, E]; the last block
    runs its queries, MLP and norms at those slots only (a training forward reads no others).
    attend_slots, static: keys are the cache's first attend_slots slots only (default all S; this
    call's tokens must be written within them), so a prefill fills a cache already sized for
    decoding, with no copy to grow it, and still attends over the prompt's slots alone."""
    policy = remat_policy(remat)
    b, t = tokens.shape
    if valid.shape != (b, t):
      raise ValueError(f"valid {valid.shape} must match tokens {(b, t)}")
    if cache is not None and not (cache.valid.shape[0] == b and t <= cache.size):
      raise ValueError(f"a cache of {cache.valid.shape} (rows, slots) cannot take tokens {(b, t)}")
    spec = self.attention
    key_valid, write_index = (valid, 0) if cache is None else (cache.valid_after(valid), cache.cursor)  # [B, S]
    seen = key_valid  # [B, S'] the keys attended
    if attend_slots is not None:
      _check_attend_slots(attend_slots, t, cache)
      seen = key_valid[:, :attend_slots]
    x = jnp.take(self.embed[...], tokens, axis=0)
    history = None
    if self.token_shift is not None:
      shifted, history = self._shifted_embeddings(tokens, key_valid, cache, write_index)
      x = x + shifted
    x = constrain_rows(x)  # [B, T, E] rows over (data, fsdp), as between every two blocks
    cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta, self.dtype)  # [B, T, D]
    last = len(self.layers) - 1
    # fused backends take whole rows only: their last block runs every slot, sliced after
    cut = out_slots if out_slots is not None and spec.resolve(self.dtype) == "xla" else None
    run = lambda blk, h, c, slots: blk(h, cos, sin, seen, c, write_index, spec, slots)
    scanned = self._scans(cache, policy)  # layers 0..last-1 under one lax.scan, else none
    layers = []
    if scanned:
      x, layers = self._scan_layers(run, x, cache, policy)
    for i in range(scanned, last + 1):
      layer, layer_cache = self.layers[i], None if cache is None else cache.layer(i)
      slots = cut if i == last else None
      if policy is not None:
        x, layer_cache = nnx.remat(lambda blk, h, c: run(blk, h, c, slots), policy=policy)(layer, x, layer_cache)
      else:
        x, layer_cache = run(layer, x, layer_cache, slots)
      x = constrain_rows(x)
      layers.append(layer_cache)
    if out_slots is not None and cut is None:
      x = x[:, out_slots[0]:out_slots[1]]
    if cache is not None:
      cache = cache.after_write(layers, valid=key_valid, count=t, tokens=history)
    return self.final_norm(x), cache

  def _scans(self, cache: KVCache | None, policy) -> int:
    """How many leading layers run under one lax.scan: all but the last (whose queries may be cut to
    out_slots) when `scan_layers` is on and the call is not a decode (no cache, or a training forward
    over a shared prefix's cache); a decode keeps unrolled layers that update their cache in place."""
    if not self.scan_layers or (cache is not None and policy is None) or len(self.layers) < 2:
      return 0
    return len(self.layers) - 1

  def _scan_layers(self, run, x, cache: KVCache | None, policy):
    """Layers 0..L-2 as one lax.scan over their weights stacked on a leading [L-1] axis, each
    iteration rematerialised by `policy`. XLA then schedules one block, so the backward's recomputed
    activations of one layer are live at a time (unrolled, its latency-hiding scheduler starts many
    layers' recomputations early: jax-ml/jax#20763). -> (x [B, T, E], L-1 LayerCaches or Nones)."""
    n = len(self.layers) - 1
    graphdef, _ = nnx.split(self.layers[0])
    stacked = jax.tree.map(lambda *w: jnp.stack(w), *(nnx.state(self.layers[i]) for i in range(n)))
    caches = None if cache is None else LayerCache(jnp.stack(cache.k[:n]), jnp.stack(cache.v[:n]))  # [L-1, B, K, S, D]

    def block(h, weights_and_cache):  # h [B, T, E]; one layer's weights (and cache) -> (h, its cache)
      weights, layer_cache = weights_and_cache
      h, layer_cache = run(nnx.merge(graphdef, weights), h, layer_cache, None)
      return constrain_rows(h), layer_cache

    if policy is not None:
      block = jax.checkpoint(block, policy=policy, prevent_cse=False)  # inside a scan CSE cannot hoist it
    x, new = jax.lax.scan(block, x, (stacked, caches))
    if new is None:
      return x, [None] * n
    return x, [LayerCache(new.k[i], new.v[i]) for i in range(n)]

  def _shifted_embeddings(self, tokens, key_valid, cache, write_index):
    """Sum over d = 1..N of token_shift[d-1][token d slots back] for each of the T tokens, where
    that slot holds a real token (key_valid), else nothing. Slots are contiguous per row (left
    padding, then generation), so d slots back is d tokens back. With a cache, the T tokens are
    written at `write_index` into its token history first. -> ([B, T, E], history [B, S] or None)."""
    n, t = self.config.token_shift, tokens.shape[1]
    if cache is None:
      history, start, new_history = tokens, 0, None  # [B, T]
    else:
      history = jax.lax.dynamic_update_slice(cache.tokens, tokens.astype(jnp.int32), (0, write_index))
      start, new_history = write_index, history  # [B, S]
    padded = jnp.pad(history, ((0, 0), (n, 0)))  # slot s at s + n
    real = jnp.pad(key_valid, ((0, 0), (n, 0)))
    out = 0.0
    for d in range(1, n + 1):
      prev = jax.lax.dynamic_slice_in_dim(padded, start + n - d, t, axis=1)  # [B, T]
      ok = jax.lax.dynamic_slice_in_dim(real, start + n - d, t, axis=1)
      out = out + jnp.take(self.token_shift[...][d - 1], prev, axis=0) * ok[..., None].astype(self.dtype)
    return out, new_history

  def logits(self, hidden):
    """hidden [..., E] -> float32 logits [..., V]."""
    if self.lm_head is None:  # tied: contract with the embedding [V, E] directly, never transpose it
      return jnp.einsum("...e,ve->...v", hidden, self.embed[...]).astype(jnp.float32)
    return dense(hidden, self.lm_head[...]).astype(jnp.float32)


def _check_attend_slots(attend_slots: int, t: int, cache: KVCache | None):
  """Clear errors for an attended window that cannot hold this call's tokens; the cursor is checked
  where it is concrete (outside jit), since a write past the window would be silently unseen."""
  if cache is None:
    raise ValueError(f"attend_slots={attend_slots} needs a cache; without one the keys are this call's tokens")
  if not t <= attend_slots <= cache.size:
    raise ValueError(f"attend_slots={attend_slots} must lie between this call's {t} tokens and the "
                     f"cache's {cache.size} slots")
  if not isinstance(cache.cursor, jax.core.Tracer) and int(cache.cursor) + t > attend_slots:
    raise ValueError(f"attend_slots={attend_slots}: this call writes slots {int(cache.cursor)}.."
                     f"{int(cache.cursor) + t - 1}, past the attended ones")


def positions_from_mask(valid):
  """Left-padded rows: position of each real token counts real tokens before it. [B, T]."""
  return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)


def forward_logits(model: Decoder, tokens, valid=None):
  """Full forward without cache: tokens [B, T] -> float32 logits [B, T, V]."""
  if valid is None:
    valid = jnp.ones(tokens.shape, bool)
  hidden, _ = model(tokens, positions_from_mask(valid), valid)
  return model.logits(hidden)
