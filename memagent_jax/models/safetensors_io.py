"""Minimal safetensors reader/writer on numpy (no torch; bfloat16 through ml_dtypes).

We own this ~80 lines because `safetensors.numpy` cannot read bfloat16, and we want
errors that name the file and tensor instead of a Rust panic.
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np


class WeightsError(ValueError):
  """A weights file is missing, corrupt, or does not match the model config."""


DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}


def _entry_error(entry, data_size: int) -> str | None:
  """Why a header entry is malformed, or None (checked before any data is read)."""
  if not isinstance(entry, dict):
    return f"has a header entry that is a {type(entry).__name__}, not an object"
  dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
  if not isinstance(dtype, str) or dtype not in DTYPES:
    return f"has unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})"
  if not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape):
    return f"has shape {shape!r}, not a list of non-negative integers"
  if (not isinstance(offsets, list) or len(offsets) != 2
      or not all(type(x) is int for x in offsets) or not 0 <= offsets[0] <= offsets[1]):
    return f"has data_offsets {offsets!r}, not two increasing non-negative integers"
  begin, end = offsets
  expected = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
  if end - begin != expected or end > data_size:
    return (f"is truncated or corrupt (bytes {begin}..{end}, expected {expected} for shape "
            f"{tuple(shape)} {dtype}, data section {data_size})")
  return None


def read_header(path: str) -> tuple[dict, int]:
  """Returns (tensor entries by name, byte offset of the data section)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"weights file not found: {path}")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise WeightsError(f"{path}: corrupt safetensors file ({size} bytes, too short for a header)")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8 or n > 100_000_000:
      raise WeightsError(f"{path}: corrupt safetensors file (header length {n} > file size {size})")
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise WeightsError(f"{path}: corrupt safetensors header ({e})") from None
  if not isinstance(header, dict):
    raise WeightsError(f"{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object)")
  header.pop("__metadata__", None)
  data_size = size - 8 - n
  for name, entry in header.items():
    why = _entry_error(entry, data_size)
    if why:
      raise WeightsError(f"{path}: tensor {name!r} {why}")
  return header, 8 + n


def count_nonfinite(a: np.ndarray) -> int:
  """NaN/Inf values in a float array; one vectorised pass (a sum) when there are none."""
  if a.dtype.itemsize < 4:  # float16 / bfloat16: accumulate in float64, never overflows
    total = a.sum(dtype=np.float64)
  else:  # NaN and +-Inf propagate into the sum; a finite overflow is re-checked exactly below
    total = a.sum()
  if np.isfinite(total):
    return 0
  return int(a.size - np.count_nonzero(np.isfinite(a)))


def check_finite(a: np.ndarray, path: str, name: str):
  """Raises WeightsError naming the file and tensor when `a` holds NaN or Inf."""
  bad = count_nonfinite(a)
  if bad:
    raise WeightsError(f"{path}: tensor {name!r} has {bad} non-finite values (NaN or Inf) "
                       f"among its {a.size}; the weights are corrupt")


def load_tensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a file as read-only numpy arrays backed by a memory map."""
  header, offset = read_header(path)
  mm = np.memmap(path, dtype=np.uint8, mode="r")
  out = {}
  for name, entry in header.items():
    begin, end = entry["data_offsets"]
    raw = mm[offset + begin: offset + end]
    out[name] = raw.view(DTYPES[entry["dtype"]]).reshape(entry["shape"])
  return out


def save_tensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None):
  """Writes tensors in safetensors layout (8-byte aligned, names sorted)."""
  header, offset, arrays = {}, 0, []
  for name in sorted(tensors):
    a = np.ascontiguousarray(tensors[name])
    if a.dtype not in _NAMES:
      raise WeightsError(f"cannot save tensor {name!r} of dtype {a.dtype} to {path}")
    header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                    "data_offsets": [offset, offset + a.nbytes]}
    offset += a.nbytes
    arrays.append(a)
  if metadata:
    header["__metadata__"] = metadata
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for a in arrays:
      f.write(a.tobytes())
  os.replace(tmp, path)
