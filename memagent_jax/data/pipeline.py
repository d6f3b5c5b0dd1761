"""grain input pipeline over any random-access source: seeded shuffle, epochs, text batches.

The position is grain's own iterator state (`it.get_state()` -> {"next_index": int},
`it.set_state(state)`), so a checkpoint resumes at exactly the next batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import grain
import numpy as np


def to_python(x: Any) -> Any:
  """tfds numpy records -> plain Python: bytes -> str, arrays -> lists, numpy scalars -> numbers."""
  if isinstance(x, bytes):
    return x.decode("utf-8")
  if isinstance(x, dict):
    return {k: to_python(v) for k, v in x.items()}
  if isinstance(x, np.ndarray):
    return [to_python(v) for v in x.tolist()] if x.ndim else to_python(x.item())
  if isinstance(x, (list, tuple)):
    return [to_python(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  return x


def collate(samples: Sequence[Any]) -> Any:
  """A batch of dicts -> one dict of lists (text needs no padding); other samples -> list."""
  samples = list(samples)
  if samples and all(isinstance(s, dict) for s in samples):
    return {k: [s[k] for s in samples] for k in samples[0]}
  return samples


def make_dataset(source, batch_size: int, seed: int = 0, num_epochs: int | None = 1,
                 shuffle: bool = True, drop_remainder: bool = False, shard_index: int = 0,
                 shard_count: int = 1) -> grain.MapDataset:
  """Shuffled (reshuffled each epoch), decoded, batched and repeated MapDataset.

  Args:
    source: anything with `__len__`/`__getitem__` (a tfds data source, a list).
    batch_size: samples per batch; a batch is a dict of lists.
    seed: shuffle seed; same seed -> same order.
    num_epochs: passes over the data; None repeats forever.
    shuffle: False keeps the source order.
    drop_remainder: drop the last short batch.
    shard_index, shard_count: this host's slice of the source (multi-host).
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
  if len(source) == 0:
    raise ValueError("the data source is empty")
  ds = grain.MapDataset.source(source)
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  if shuffle:
    ds = ds.shuffle(seed=seed)
  # Batch before repeating: batches never straddle epochs (the last one may be short),
  # and repeat reseeds the upstream shuffle so every epoch has its own order.
  ds = ds.map(to_python).batch(batch_size, drop_remainder=drop_remainder, batch_fn=collate)
  return ds.repeat(num_epochs)


def iterate(ds: grain.MapDataset, num_threads: int = 2, prefetch: int = 8) -> grain.DatasetIterator:
  """An iterator over ds with `get_state()` / `set_state()` for checkpointing.

  Long-context samples are large, so reading threads and the prefetch buffer stay small.
  """
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
  return iter(ds.to_iter_dataset(options))


def make_iterator(source, batch_size: int, **dataset_options) -> grain.DatasetIterator:
  """`iterate(make_dataset(source, batch_size, **dataset_options))`: batches of dicts of lists."""
  return iterate(make_dataset(source, batch_size, **dataset_options))
