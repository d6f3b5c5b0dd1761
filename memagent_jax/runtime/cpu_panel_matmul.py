"""Float32 products of few rows against a weight packed in column panels, by a compiled CPU kernel
(`cpu_panel_matmul.cc`) called through XLA's FFI. Decode at a small batch reads every weight once per
token; XLA:CPU's own products of 8 rows read a row-major weight at half to two thirds a plain read's speed.

The kernel is built on first use (`cpu_kernels`); where it cannot be (no compiler, no AVX-512, another
platform, or MEMAGENT_JAX_CPU_KERNELS=0) `unavailable_reason()` says why and callers keep XLA's products.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from memagent_jax.runtime import cpu_kernels

PANEL = 48  # columns per panel (the kernel's register tile: 3 AVX-512 vectors)
FEW_ROWS = 16  # the most rows a product runs on the kernel; more rows reuse each weight read by XLA's
TARGET = "memagent_panel_matmul"


def pack(w):
  """w [K, N] -> panels [T, K, 48], T = ceil(N / 48): panel t holds columns 48t..48t+47, row after row,
  zero columns after N."""
  k, n = w.shape
  t = -(-n // PANEL)
  w = jnp.pad(w, ((0, 0), (0, t * PANEL - n)))
  return w.reshape(k, t, PANEL).transpose(1, 0, 2)


def product(x, panels, n: int):
  """x [..., K] @ the weight packed in `panels` [T, K, 48] -> [..., n] float32 (n <= 48T, its columns)."""
  if not available():
    raise RuntimeError(f"the CPU panel kernel is unavailable: {unavailable_reason()}")
  lead, k = x.shape[:-1], x.shape[-1]
  rows = math.prod(lead)
  call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows, panels.shape[0] * PANEL), jnp.float32),
                          vmap_method="sequential")
  return call(x.reshape(rows, k).astype(jnp.float32), panels)[:, :n].reshape(*lead, n)


def available() -> bool:
  return unavailable_reason() is None


def unavailable_reason() -> str | None:
  """None once the kernel is built (or found built) and registered with XLA; else why not."""
  return cpu_kernels.unavailable_reason("cpu_panel_matmul.cc", TARGET)
