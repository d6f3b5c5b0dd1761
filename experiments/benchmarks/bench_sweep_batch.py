"""One toy sweep batch with CPU attention against a cache in row steps (`attention.cpu_cache_attention`,
what `attend` runs) or in one dense pass over all rows (what ran before it): seconds and a digest of
every answer and memory (and of every log-prob of them), so the two are shown to read the documents
identically.

  python -m experiments.benchmarks.bench_sweep_batch --path=rows --multiple=8    # then --path=dense

Run the two paths in separate processes, alternating (the jitted recurrence is cached per process).
"""

from __future__ import annotations

import time

from absl import app, flags

from experiments.benchmarks.sweep_batch import digests, sweep_batch
from memagent_jax.models import attention

_PATH = flags.DEFINE_enum("path", "rows", ["rows", "dense"], "attention against a cache: row steps or one dense pass")
_MULTIPLE = flags.DEFINE_integer("multiple", 8, "document length / training length (128 tokens)")
_N = flags.DEFINE_integer("n", 200, "documents in the batch (make reproduce's sweep batch)")
_REPEATS = flags.DEFINE_integer("repeats", 2, "timed batches after the compiling one (best is printed)")
_SOURCE = flags.DEFINE_string("source", "experiments/data/toy_base_lookup", "the reader's weights (the base writes "
                              "short memories; a trained one, e.g. experiments/data/toy_warm_start_lookup_demo, "
                              "decodes longer)")
_GROUP_BYTES = flags.DEFINE_integer("sample_group_bytes", -1, "the reader's AttentionSpec.cpu_sample_group_bytes "
                                    "(-1: its default; 0: all rows at once; see bench_row_groups)")


def main(argv):
  del argv
  if _PATH.value == "dense":  # keys: the first S slots of the cache (key_valid [B, S])
    attention.cpu_cache_attention = lambda q, k, v, kv, *, q_offset, **_: attention.dense_attention(
        q, k[:, :, :kv.shape[1]], v[:, :, :kv.shape[1]], attention.slot_mask(kv, q_offset, q.shape[1]))
  length = 128 * _MULTIPLE.value
  run = sweep_batch(_MULTIPLE.value, _N.value, _SOURCE.value,
                    None if _GROUP_BYTES.value < 0 else _GROUP_BYTES.value)
  results = run()  # compiles
  best = float("inf")
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    results = run()
    best = min(best, time.perf_counter() - start)
  digest, lp_digest = digests(results)
  print(f"path={_PATH.value} {_N.value} documents of {length} tokens: best {best:.3f} s, answers+memories {digest}, "
        f"log-probs {lp_digest}")


if __name__ == "__main__":
  app.run(main)
