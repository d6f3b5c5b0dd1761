"""`KVCache`: every layer's keys and values, the write cursor and the slots' validity, as one pytree.

Slots fill left to right: a forward call writes its T tokens at `cursor` and moves it T slots on.
Queries attend causally over the slots, masked by `valid`: all S, or the first P where the call
says so (`Decoder(attend_slots=P)`), which is how a prefill fills the first P slots of a cache sized
for decoding and still runs the square path (where the fused kernels run) over the prompt alone.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from memagent_jax.models.config import ModelConfig


class LayerCache(NamedTuple):
  """One layer's view of the cache, what `Attention` reads and writes: k, v [B, K, S, D]."""
  k: jax.Array
  v: jax.Array


@struct.dataclass
class KVCache:
  """Static-shape cache of all L layers (a tuple of layers: the decode loop updates each in place)."""
  k: tuple[jax.Array, ...]  # L x [B, K, S, D] (K kv heads, S slots, D head dim)
  v: tuple[jax.Array, ...]  # L x [B, K, S, D]
  valid: jax.Array  # [B, S] bool: the slot holds a real token (False: padding or not yet written)
  cursor: jax.Array  # [] int32: the next slot to write; every slot before it is written
  tokens: jax.Array | None = None  # [B, S] int32 each slot's token id (token-shift models), else None

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, size: int, dtype) -> KVCache:
    """An empty cache of `size` slots per row: zeros, nothing valid, cursor at slot 0."""
    zeros = lambda: tuple(jnp.zeros((batch, cfg.num_kv_heads, size, cfg.head_dim), dtype)
                          for _ in range(cfg.num_layers))
    return cls(k=zeros(), v=zeros(), valid=jnp.zeros((batch, size), bool), cursor=jnp.int32(0),
               tokens=jnp.zeros((batch, size), jnp.int32) if cfg.token_shift else None)

  @property
  def size(self) -> int:
    """S, the slots per row (static)."""
    return self.valid.shape[1]

  def layer(self, i: int) -> LayerCache:
    return LayerCache(self.k[i], self.v[i])

  def valid_after(self, valid) -> jax.Array:
    """The key mask once T new tokens sit at the cursor: valid [B, T] -> [B, S]."""
    return jax.lax.dynamic_update_slice(self.valid, valid.astype(bool), (0, self.cursor))

  def after_write(self, layers, *, valid, count: int, tokens=None) -> KVCache:
    """The cache once a forward wrote `count` tokens at the cursor: each layer's new buffers
    (LayerCache per layer), the key mask from `valid_after` [B, S], the token history [B, S] of a
    token-shift model, and the cursor `count` slots on."""
    return self.replace(k=tuple(c.k for c in layers), v=tuple(c.v for c in layers), valid=valid,
                        cursor=self.cursor + count, tokens=self.tokens if tokens is None else tokens)

  def grow(self, size: int) -> KVCache:
    """The same cache with `size` >= S slots: the new slots are empty (zeros, not valid)."""
    extra = size - self.size
    if extra < 0:
      raise ValueError(f"cannot shrink a cache of {self.size} slots to {size}")
    def pad(x, axis):
      return jnp.pad(x, [(0, extra if a == axis else 0) for a in range(x.ndim)])
    return self.replace(k=tuple(pad(x, 2) for x in self.k), v=tuple(pad(x, 2) for x in self.v),
                        valid=pad(self.valid, 1), tokens=None if self.tokens is None else pad(self.tokens, 1))
