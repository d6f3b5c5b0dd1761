"""How fast XLA:CPU's dot libraries read float32 weights in products of few rows (decode at small batch):
GB/s of weights per library (one process each, since XLA_FLAGS is read once), beside a plain read.

  python -m experiments.benchmarks.bench_small_matmul            # rows 1, 8, 16; 30 [576, 1536] weights
  python -m experiments.benchmarks.bench_small_matmul --dtypes   # float32 and bfloat16, ours beside torch
  python -m experiments.benchmarks.bench_small_matmul --panels   # XLA's products beside the panel kernel

Each timing: 30 independent [B, 576] x [576, 1536] products (SmolLM2-135M's MLP shape, 106 MB of weights),
best of 20 after a warm-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

_ROWS = flags.DEFINE_string("rows", "1,8,16", "rows per product, comma separated")
_DTYPES = flags.DEFINE_bool("dtypes", False, "instead: milliseconds of the 30 products with float32 and with "
                            "bfloat16 weights and activations, XLA's default library beside torch's F.linear")
_PANELS = flags.DEFINE_bool("panels", False, "instead: 30 layers of [B, 576] x [576, 1536] and [B, 1536] x "
                            "[1536, 576] products in a chain, as decode runs them, on XLA's products and on the "
                            "panel kernel (runtime/cpu_panel_matmul; weights packed beforehand)")
LIBRARIES = {  # column name -> XLA_FLAGS
    "YNNPACK (default)": "",
    "oneDNN (`--xla_cpu_use_onednn`)": "--xla_cpu_use_onednn=true",
    "XNNPACK (`--xla_cpu_use_xnnpack`)": "--xla_cpu_use_xnnpack=true",
    "Eigen (YNNPACK off)": "--xla_cpu_experimental_ynn_fusion_type=",
    "oneDNN dot fusion, YNNPACK off": "--xla_cpu_experimental_onednn_fusion_type=dot --xla_cpu_experimental_ynn_fusion_type=",
}


def measure(rows: list[int]) -> dict:
  """{rows: GB/s} for this process's XLA flags, and "read": a jnp.sum over 4x the weights."""
  import jax
  import jax.numpy as jnp
  import memagent_jax  # noqa: F401  (its CPU host settings, as every benchmark here runs with)

  best = lambda f, *args: _best_seconds(lambda: jax.block_until_ready(f(*args)))

  weights = [jax.random.normal(jax.random.PRNGKey(i), (576, 1536), jnp.float32) for i in range(30)]
  nbytes = 30 * 576 * 1536 * 4
  products = jax.jit(lambda ws, x: [x @ w for w in ws])
  out = {str(b): nbytes / best(products, weights, jnp.ones((b, 576), jnp.float32)) / 1e9 for b in rows}
  big = jnp.ones((4 * 30 * 576 * 1536,), jnp.float32)
  out["read"] = 4 * nbytes / best(jax.jit(jnp.sum), big) / 1e9
  return out


def _best_seconds(run) -> float:
  """Best of 20 calls of run() after a warm-up one."""
  run()
  times = []
  for _ in range(20):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return min(times)


def dtype_table(rows: list[int]) -> str:
  """Would bfloat16 weights lift decode's ratio to transformers? Both sides in each dtype, same shapes:
  jax with float32 accumulation (`preferred_element_type`), torch with its default CPU kernels."""
  import jax
  import jax.numpy as jnp
  import torch
  import memagent_jax  # noqa: F401  (its CPU host settings)
  torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
  lines = ["| rows | jax float32 | jax bfloat16 | torch float32 | torch bfloat16 | speed-up over torch, float32 | "
           "speed-up over torch, bfloat16 |", "|---|---|---|---|---|---|---|"]
  for b in rows:
    ms = {}
    for name, jdt, tdt in (("float32", jnp.float32, torch.float32), ("bfloat16", jnp.bfloat16, torch.bfloat16)):
      ws = [jax.random.normal(jax.random.PRNGKey(i), (576, 1536), jnp.float32).astype(jdt) for i in range(30)]
      x = jnp.ones((b, 576), jdt)
      f = jax.jit(lambda ws, x: [jnp.dot(x, w, preferred_element_type=jnp.float32) for w in ws])
      ms["jax " + name] = 1e3 * _best_seconds(lambda: jax.block_until_ready(f(ws, x)))
      tw = [torch.randn(1536, 576).to(tdt) for _ in range(30)]  # F.linear's [out, in] layout
      tx = torch.ones(b, 576, dtype=tdt)
      with torch.no_grad():
        ms["torch " + name] = 1e3 * _best_seconds(lambda: [torch.nn.functional.linear(tx, w) for w in tw])
    lines.append(f"| {b} | " + " | ".join(f"{ms[k]:.2f} ms" for k in ("jax float32", "jax bfloat16", "torch float32",
                                                                       "torch bfloat16"))
                 + f" | {ms['torch float32'] / ms['jax float32']:.2f}x | {ms['torch bfloat16'] / ms['jax bfloat16']:.2f}x |")
  return "\n".join(lines)


def panel_table(rows: list[int]) -> str:
  """Each product waits for the last, as in a decode step: XLA's products of the row-major weights against
  the panel kernel's of the same weights packed in column panels (packed before timing, as a decode loop
  packs them once before its steps)."""
  import jax
  import jax.numpy as jnp
  from memagent_jax.runtime import cpu_panel_matmul as kernel  # also its CPU host settings
  if not kernel.available():
    return f"The panel kernel is unavailable here: {kernel.unavailable_reason()}"
  ups = [jax.random.normal(jax.random.PRNGKey(i), (576, 1536), jnp.float32) * 0.04 for i in range(30)]
  downs = [jax.random.normal(jax.random.PRNGKey(100 + i), (1536, 576), jnp.float32) * 0.025 for i in range(30)]
  nbytes = 2 * 30 * 576 * 1536 * 4

  def chain(product):
    def layers(ups, downs, x):  # x [B, 576]
      for up, down in zip(ups, downs):
        x = jnp.tanh(product(jnp.tanh(product(x, up, 1536)), down, 576))
      return x
    return jax.jit(layers)

  xla = chain(lambda x, w, n: x @ w)
  panels = chain(kernel.product)
  packed_ups, packed_downs = [kernel.pack(w) for w in ups], [kernel.pack(w) for w in downs]
  lines = ["| rows | XLA's products | panel kernel | speed-up | largest difference |", "|---|---|---|---|---|"]
  for b in rows:
    x = jax.random.normal(jax.random.PRNGKey(99), (b, 576), jnp.float32)
    diff = float(jnp.max(jnp.abs(xla(ups, downs, x) - panels(packed_ups, packed_downs, x))))
    t_xla = _best_seconds(lambda: jax.block_until_ready(xla(ups, downs, x)))
    t_panels = _best_seconds(lambda: jax.block_until_ready(panels(packed_ups, packed_downs, x)))
    lines.append(f"| {b} | {1e3 * t_xla:.2f} ms ({nbytes / t_xla / 1e9:.1f} GB/s) | {1e3 * t_panels:.2f} ms "
                 f"({nbytes / t_panels / 1e9:.1f} GB/s) | {t_xla / t_panels:.2f}x | {diff:.1e} |")
  return "\n".join(lines)


def main(argv):
  del argv
  rows = [int(r) for r in _ROWS.value.split(",")]
  if _DTYPES.value:
    print(dtype_table(rows))
    return
  if _PANELS.value:
    print(panel_table(rows))
    return
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
