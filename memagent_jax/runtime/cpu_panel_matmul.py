"""Float32 products of few rows against a weight packed in column panels, by a compiled CPU kernel
(`cpu_panel_matmul.cc`) called through XLA's FFI. Decode at a small batch reads every weight once per
token; XLA:CPU's own products of 8 rows read a row-major weight at half to two thirds a plain read's speed.

The kernel is built on first use with the system's C++ compiler into a cache folder (keyed by its source,
the flags and jaxlib's version). Where that cannot be done (no compiler, no AVX-512, another platform, or
MEMAGENT_JAX_CPU_KERNELS=0) `unavailable_reason()` says why and callers keep XLA's products.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp

PANEL = 48  # columns per panel (the kernel's register tile: 3 AVX-512 vectors)
FEW_ROWS = 16  # the most rows a product runs on the kernel; more rows reuse each weight read by XLA's
TARGET = "memagent_panel_matmul"
SWITCH = "MEMAGENT_JAX_CPU_KERNELS"  # "0": XLA's products everywhere
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_panel_matmul.cc")
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-mavx512f", "-mfma")


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


@functools.cache
def unavailable_reason() -> str | None:
  """None once the kernel is built (or found built) and registered with XLA; else why not."""
  if os.environ.get(SWITCH, "1") == "0":
    return f"turned off by {SWITCH}=0"
  if platform.machine() not in ("x86_64", "AMD64"):
    return f"the kernel is written for x86-64 AVX-512, this machine is {platform.machine()}"
  if not _has_avx512():
    return "this processor has no AVX-512F"
  compiler = shutil.which(os.environ.get("CXX", "c++"))
  if compiler is None:
    return f"no C++ compiler ({os.environ.get('CXX', 'c++')}) on PATH"
  try:
    library = ctypes.cdll.LoadLibrary(_built(compiler))
  except subprocess.CalledProcessError as e:
    return f"building {SOURCE} failed: {(e.stderr or '').strip()[-500:]}"
  except OSError as e:
    return f"building or loading {SOURCE} failed: {e}"
  jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.memagent_panel_matmul), platform="cpu")
  return None


def _has_avx512() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      return any(line.startswith("flags") and " avx512f" in line for line in f)
  except OSError:
    return False


def _built(compiler: str) -> str:
  """The shared library's path in the cache folder, compiled there first when missing (written to a
  temporary name and renamed, so processes building at once never load a half-written file)."""
  with open(SOURCE, "rb") as f:
    source = f.read()
  key = hashlib.sha256(source + repr((FLAGS, compiler, jax.__version__)).encode()).hexdigest()[:16]
  folder = os.environ.get("MEMAGENT_JAX_KERNEL_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memagent_jax")
  path = os.path.join(folder, f"cpu_panel_matmul-{key}.so")
  if not os.path.exists(path):
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
      subprocess.run([compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", SOURCE, "-o", tmp], check=True,
                     capture_output=True, text=True)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  return path
