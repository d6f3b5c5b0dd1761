"""Causal attention on CPU by two compiled kernels (`cpu_attention_kernels.cc`, XLA FFI handlers): `flash`
for long rows (scores against one key tile at a time with an online softmax, so no [T, S] score tensor
passes through memory) and `few_queries` for decoding (a few queries a row against the cache in its own
layout, reading only the visible slots). Float32, head dims 32, 64 and 128 (the toy models, SmolLM2,
Qwen2.5); built on first use (`cpu_kernels`), and where they cannot be, `unavailable_reason()` says why
and callers keep XLA's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from memagent_jax.runtime import cpu_kernels

TARGET = "memagent_flash_attention"
FEW_QUERIES_TARGET = "memagent_few_queries_attention"
FEW_QUERIES = 16  # the most queries a row that `few_queries` takes (its scores are held whole)
HEAD_DIMS = (32, 64, 128)  # the kernels' register tiles: 2, 4 or 8 AVX-512 vectors a row


def available() -> bool:
  return unavailable_reason() is None


def usable(platform: str | None, q, k, v) -> bool:
  """Attention of q, k, v in a program for `platform` may run on these kernels: a CPU program, float32
  operands with a head dim the kernels have tiles for, and rows each device holds whole (one device, or
  a mesh in context, under which callers hand each device its rows)."""
  if platform != "cpu" or jax.default_backend() != "cpu" or q.shape[-1] not in HEAD_DIMS:
    return False
  if any(x.dtype != jnp.float32 for x in (q, k, v)):
    return False
  if jax.sharding.get_abstract_mesh().empty and jax.device_count() > 1:
    return False  # XLA would gather a custom call's operands to every device
  return available()


def unavailable_reason() -> str | None:
  """None once the kernel is built (or found built) and registered with XLA; else why not."""
  return cpu_kernels.unavailable_reason("cpu_attention_kernels.cc", TARGET, FEW_QUERIES_TARGET)


def flash(q, k, v, key_valid, q_offset=0):
  """q [B, T, H, D]; k, v [B, K, S', D]; key_valid [B, S], S <= S' (the keys are the first S slots)
  -> [B, T, H, D] float32: query t at slot q_offset + t sees the valid keys at slots <= its own
  (`attention.dense_attention` with `slot_mask`; a query with none sees its masked slots evenly)."""
  _check(q, k, v)
  s = key_valid.shape[1]
  kt = k[:, :, :s].swapaxes(2, 3)  # [B, K, D, S]: a key tile's lanes are contiguous
  call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
  return call(q, kt, v, key_valid.astype(jnp.uint8), jnp.asarray(q_offset, jnp.int32))


def few_queries(q, k, v, key_valid, q_offset=0):
  """`flash`'s result for at most FEW_QUERIES queries a row (decoding), reading k, v [B, K, S', D] in place
  and only the slots up to the last query's."""
  _check(q, k, v)
  if q.shape[1] > FEW_QUERIES:
    raise ValueError(f"few_queries takes at most {FEW_QUERIES} queries a row; got {q.shape[1]}")
  call = jax.ffi.ffi_call(FEW_QUERIES_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
  return call(q, k, v, key_valid.astype(jnp.uint8), jnp.asarray(q_offset, jnp.int32))


def _check(q, k, v):
  if not available():
    raise RuntimeError(f"the CPU attention kernels are unavailable: {unavailable_reason()}")
  if q.shape[-1] not in HEAD_DIMS or any(x.dtype != jnp.float32 for x in (q, k, v)):
    raise ValueError(f"the CPU attention kernels run float32 with head dims {HEAD_DIMS}; got "
                     f"q {q.dtype}{list(q.shape)}, k {k.dtype}, v {v.dtype}")
