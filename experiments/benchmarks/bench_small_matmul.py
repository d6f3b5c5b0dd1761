"""How fast XLA:CPU's dot libraries read float32 weights in products of few rows (decode at small batch):
GB/s of weights per library (one process each, since XLA_FLAGS is read once), beside a plain read.

  python -m experiments.benchmarks.bench_small_matmul            # rows 1, 8, 16; 30 [576, 1536] weights

Each timing: 30 independent [B, 576] x [576, 1536] products (SmolLM2-135M's MLP shape, 106 MB of weights),
best of 20 after a warm-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

_ROWS = flags.DEFINE_string("rows", "1,8,16", "rows per product, comma separated")
LIBRARIES = {  # column name -> XLA_FLAGS
    "YNNPACK (default)": "",
    "oneDNN (`--xla_cpu_use_onednn`)": "--xla_cpu_use_onednn=true",
    "XNNPACK (`--xla_cpu_use_xnnpack`)": "--xla_cpu_use_xnnpack=true",
    "Eigen (YNNPACK off)": "--xla_cpu_experimental_ynn_fusion_type=",
    "oneDNN dot fusion, YNNPACK off": "--xla_cpu_experimental_onednn_fusion_type=dot --xla_cpu_experimental_ynn_fusion_type=",
}


def measure(rows: list[int]) -> dict:
  """{rows: GB/s} for this process's XLA flags, and "read": a jnp.sum over 4x the weights."""
  import time
  import jax
  import jax.numpy as jnp
  import memagent_jax  # noqa: F401  (its CPU host settings, as every benchmark here runs with)

  def best(f, *args):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(20):
      start = time.perf_counter()
      jax.block_until_ready(f(*args))
      times.append(time.perf_counter() - start)
    return min(times)

  weights = [jax.random.normal(jax.random.PRNGKey(i), (576, 1536), jnp.float32) for i in range(30)]
  nbytes = 30 * 576 * 1536 * 4
  products = jax.jit(lambda ws, x: [x @ w for w in ws])
  out = {str(b): nbytes / best(products, weights, jnp.ones((b, 576), jnp.float32)) / 1e9 for b in rows}
  big = jnp.ones((4 * 30 * 576 * 1536,), jnp.float32)
  out["read"] = 4 * nbytes / best(jax.jit(jnp.sum), big) / 1e9
  return out


def main(argv):
  del argv
  rows = [int(r) for r in _ROWS.value.split(",")]
  results = {}
  for name, xla_flags in LIBRARIES.items():
    env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")
    code = f"from experiments.benchmarks.bench_small_matmul import measure; import json; print(json.dumps(measure({rows})))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    results[name] = json.loads(done.stdout.strip().splitlines()[-1])
  print("| rows | " + " | ".join(LIBRARIES) + " |\n|---|" + "---|" * len(LIBRARIES))
  for b in rows:
    print(f"| {b} | " + " | ".join(f"{results[n][str(b)]:.1f}" for n in LIBRARIES) + " |")
  print(f"\nA plain read (jnp.sum over {4 * 30 * 576 * 1536 * 4 / 1e6:.0f} MB): "
        + ", ".join(f"{results[n]['read']:.0f}" for n in LIBRARIES) + " GB/s in the same processes.")


if __name__ == "__main__":
  app.run(main)
