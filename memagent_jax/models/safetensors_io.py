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
  header.pop("__metadata__", None)
  data_size = size - 8 - n
  for name, entry in header.items():
    dtype = DTYPES.get(entry.get("dtype"))
    if dtype is None:
      raise WeightsError(f"{path}: tensor {name!r} has unsupported dtype {entry.get('dtype')!r}")
    begin, end = entry["data_offsets"]
    expected = int(np.prod(entry["shape"], dtype=np.int64)) * dtype.itemsize
    if end - begin != expected or end > data_size:
      raise WeightsError(f"{path}: tensor {name!r} is truncated or corrupt "
                         f"(bytes {begin}..{end}, expected {expected}, data section {data_size})")
  return header, 8 + n


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
