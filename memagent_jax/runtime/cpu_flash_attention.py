"""Causal attention for long rows on CPU by a compiled flash-attention kernel (`cpu_flash_attention.cc`,
an XLA FFI handler): scores against one key tile at a time with an online softmax, so no [T, S] score
tensor passes through memory. Float32, head dims 64 and 128 (SmolLM2, Qwen2.5); built on first use
(`cpu_kernels`), and where it cannot be, `unavailable_reason()` says why and callers keep XLA's attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from memagent_jax.runtime import cpu_kernels

TARGET = "memagent_flash_attention"
HEAD_DIMS = (64, 128)  # the kernel's register tiles: 4 or 8 AVX-512 vectors a row


def available() -> bool:
  return unavailable_reason() is None


def unavailable_reason() -> str | None:
  """None once the kernel is built (or found built) and registered with XLA; else why not."""
  return cpu_kernels.unavailable_reason("cpu_flash_attention.cc", TARGET)


def attention(q, k, v, key_valid, q_offset=0):
  """q [B, T, H, D]; k, v [B, K, S', D]; key_valid [B, S], S <= S' (the keys are the first S slots)
  -> [B, T, H, D] float32: query t at slot q_offset + t sees the valid keys at slots <= its own
  (`attention.dense_attention` with `slot_mask`; a query with none sees its masked slots evenly)."""
  if not available():
    raise RuntimeError(f"the CPU flash-attention kernel is unavailable: {unavailable_reason()}")
  b, t, h, d = q.shape
  s = key_valid.shape[1]
  if d not in HEAD_DIMS or q.dtype != jnp.float32 or k.dtype != jnp.float32 or v.dtype != jnp.float32:
    raise ValueError(f"the CPU flash-attention kernel runs float32 with head dims {HEAD_DIMS}; got "
                     f"q {q.dtype}{list(q.shape)}, k {k.dtype}, v {v.dtype}")
  kt = k[:, :, :s].swapaxes(2, 3)  # [B, K, D, S]: a key tile's lanes are contiguous
  call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
  return call(q, kt, v, key_valid.astype(jnp.uint8), jnp.asarray(q_offset, jnp.int32))
