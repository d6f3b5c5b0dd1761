"""Builds and registers this package's hand-written CPU kernels (`*.cc` beside this file, XLA FFI handlers):
compiled on first use with the system's C++ compiler into a cache folder (keyed by the source, the flags,
the compiler and jax's version), then loaded and registered as FFI targets for the CPU platform.

Where that cannot be done (no compiler, no AVX-512F, another platform, or MEMAGENT_JAX_CPU_KERNELS=0)
`unavailable_reason` says why, and callers keep XLA's own operations.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import jax

SWITCH = "MEMAGENT_JAX_CPU_KERNELS"  # "0": XLA's own operations everywhere
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-mavx512f", "-mfma")
HERE = os.path.dirname(os.path.abspath(__file__))


def precondition_failure() -> str | None:
  """Why no kernel can be built on this machine before trying (switch, processor, compiler); else None."""
  if os.environ.get(SWITCH, "1") == "0":
    return f"turned off by {SWITCH}=0"
  if platform.machine() not in ("x86_64", "AMD64"):
    return f"the kernels are written for x86-64 AVX-512, this machine is {platform.machine()}"
  if not has_avx512():
    return "this processor has no AVX-512F"
  if shutil.which(os.environ.get("CXX", "c++")) is None:
    return f"no C++ compiler ({os.environ.get('CXX', 'c++')}) on PATH"
  return None


@functools.cache
def unavailable_reason(source: str, *targets: str) -> str | None:
  """None once `source` (a file name beside this module) is built (or found built) and each of its
  `targets` (exported handler symbols) is registered with XLA for the CPU; else why not."""
  failure = precondition_failure()
  if failure:
    return failure
  compiler = shutil.which(os.environ.get("CXX", "c++"))
  path = os.path.join(HERE, source)
  try:
    library = ctypes.cdll.LoadLibrary(_built(compiler, path))
  except subprocess.CalledProcessError as e:
    return f"building {path} failed: {(e.stderr or '').strip()[-500:]}"
  except OSError as e:
    return f"building or loading {path} failed: {e}"
  for target in targets:
    if not hasattr(library, target):
      return f"{path} exports no handler {target}"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)), platform="cpu")
  return None


def has_avx512() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      return any(line.startswith("flags") and " avx512f" in line for line in f)
  except OSError:
    return False


def _built(compiler: str, source: str) -> str:
  """The shared library's path in the cache folder, compiled there first when missing (written to a
  temporary name and renamed, so processes building at once never load a half-written file)."""
  with open(source, "rb") as f:
    text = f.read()
  key = hashlib.sha256(text + repr((FLAGS, compiler, jax.__version__)).encode()).hexdigest()[:16]
  folder = os.environ.get("MEMAGENT_JAX_KERNEL_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memagent_jax")
  stem = os.path.splitext(os.path.basename(source))[0]
  path = os.path.join(folder, f"{stem}-{key}.so")
  if not os.path.exists(path):
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
      subprocess.run([compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", source, "-o", tmp], check=True,
                     capture_output=True, text=True)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  return path
