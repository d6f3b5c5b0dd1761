"""Attention backend benchmark: forward + backward time and compiled scratch memory of each
backend the platform has (xla everywhere, cudnn on NVIDIA GPUs, splash on TPUs).

Rows are left-padded by --pad_frac, so every backend pays for its padding handling. With
--model, also times a whole training forward + backward (response log-probs, remat) of that
preset with random weights: the "32K tokens on one H100" check.

  python -m experiments.benchmarks.bench_attention                                     # accelerator sizes
  python -m experiments.benchmarks.bench_attention --shapes=2x256,1x1024 --dtype=float32  # CPU
  python -m experiments.benchmarks.bench_attention --shapes=1x32768 --model=qwen2.5-0.5b-instruct
  python -m experiments.benchmarks.bench_attention --cache=88x176 --shapes=200x0,128x0 --heads=4 \
      --kv_heads=4 --head_dim=32 --dtype=float32   # CPU: queries against a cache, row steps vs one pass
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from absl import app, flags

from memagent_jax.models import attention
from memagent_jax.models.config import get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.rl.update import response_logprobs


def parse_shapes(text: str) -> list[tuple[int, int]]:
  """'8x2048,1x32768' -> [(8, 2048), (1, 32768)] (batch x tokens)."""
  try:
    return [tuple(int(n) for n in part.split("x")) for part in text.split(",")]
  except ValueError:
    raise SystemExit(f"--shapes={text!r}: expected BxT pairs separated by commas, e.g. 8x2048,1x32768")


def left_padded(b: int, t: int, pad_frac: float, seed: int = 0) -> np.ndarray:
  """key_valid [B, T]: each row left-padded by up to pad_frac of its slots."""
  pads = np.random.default_rng(seed).integers(0, int(pad_frac * t) + 1, size=b)
  return np.arange(t)[None, :] >= pads[:, None]


def availability(backend: str, dtype) -> str | None:
  """None if this platform runs `backend` for `dtype`, else why not."""
  try:
    attention.resolve_backend(backend, dtype)
  except ValueError as e:
    return str(e).split(";")[0]
  return None


def measure(fn, args, repeats: int) -> tuple[float, float]:
  """(median seconds per call after a warm-up, compiled scratch GiB) of jitted fn(*args)."""
  compiled = jax.jit(fn).lower(*args).compile()
  mem = compiled.memory_analysis()
  scratch = getattr(mem, "temp_size_in_bytes", float("nan")) / 2 ** 30 if mem is not None else float("nan")
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times), scratch


def attention_case(backend, b, t, args, dtype):
  """Gradients of a weighted sum of attend's output w.r.t. q, k, v (forward + backward)."""
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.normal(size=(b, t, args.heads, args.head_dim)), dtype)
  k, v = (jnp.asarray(x, dtype) for x in rng.normal(size=(2, b, args.kv_heads, t, args.head_dim)))
  valid = jnp.asarray(left_padded(b, t, args.pad_frac))
  cot = jnp.asarray(rng.normal(size=q.shape), dtype)
  spec = attention.AttentionSpec(backend=backend)
  fn = jax.grad(lambda q, k, v, valid: jnp.sum(attention.attend(q, k, v, valid, spec=spec) * cot)
                .astype(jnp.float32), argnums=(0, 1, 2))
  flops = 3.5 * 4 * b * args.heads * args.head_dim * t * t / 2  # causal; backward ~2.5x forward
  return fn, (q, k, v, valid), flops


def model_case(backend, b, t, args, dtype):
  """Whole-model training forward + backward: log-probs of the last --response_tokens tokens."""
  model = Decoder(get_preset(args.model), dtype, attention=backend, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  cfg = model.config
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, cfg.vocab_size, size=(b, t)), jnp.int32)
  valid = jnp.asarray(left_padded(b, t, args.pad_frac))
  prompt = t - min(args.response_tokens, t - 1)

  def fn(params, tokens, valid):
    loss = lambda p: jnp.sum(response_logprobs(nnx.merge(graphdef, p), tokens, valid, prompt_width=prompt,
                                               remat=True, temperature=1.0)[0])
    return jax.grad(loss)(params)

  flops = 3 * 2 * cfg.num_params * b * t + 3.5 * 4 * b * cfg.num_layers * cfg.num_heads * cfg.head_dim * t * t / 2
  return fn, (params, tokens, valid), flops


def cache_cases(b, queries, slots, args, dtype):
  """Queries at the last `queries` of `slots` cache slots (a prefill after a shared prefix): the path
  `attend` takes (xla), as (name, forward fn, forward + backward fn) on the same inputs."""
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.normal(size=(b, queries, args.heads, args.head_dim)), dtype)
  k, v = (jnp.asarray(x, dtype) for x in rng.normal(size=(2, b, args.kv_heads, slots, args.head_dim)))
  valid = jnp.asarray(left_padded(b, slots, args.pad_frac))
  off = jnp.int32(slots - queries)
  cot = jnp.asarray(rng.normal(size=q.shape), dtype)
  paths = {"attend (xla)": lambda q, k, v: attention.attend(q, k, v, valid, q_offset=off,
                                                           spec=attention.AttentionSpec(backend="xla"))}
  for name, fn in paths.items():
    grad = jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v) * cot).astype(jnp.float32), argnums=(0, 1, 2))
    yield name, fn, grad, (q, k, v)


def cache_table(args, dtype):
  """`--cache`: queries against a longer cache, forward and forward + backward."""
  queries, slots = (int(n) for n in args.cache.split("x"))
  print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}), H={args.heads} K={args.kv_heads} "
        f"D={args.head_dim}, {args.dtype}, {queries} queries against {slots} cache slots\n")
  print("| path | B | forward ms | forward + backward ms |")
  print("|---|---|---|---|")
  for b, _ in parse_shapes(args.shapes):
    for name, fn, grad, fn_args in cache_cases(b, queries, slots, args, dtype):
      fwd, _ = measure(fn, fn_args, args.repeats)
      both, _ = measure(grad, fn_args, args.repeats)
      print(f"| {name} | {b} | {fwd * 1e3:.1f} | {both * 1e3:.1f} |")


flags.DEFINE_string("shapes", "8x2048,4x8192,1x32768", "BxT cases, comma separated")
flags.DEFINE_integer("heads", 14, "query heads")
flags.DEFINE_integer("kv_heads", 2, "key/value heads")
flags.DEFINE_integer("head_dim", 64, "head dimension")
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16", "float32"], "compute dtype")
flags.DEFINE_string("backends", "xla,cudnn,splash", "backends to time, comma separated")
flags.DEFINE_float("pad_frac", 0.1, "rows are left-padded by up to this fraction")
flags.DEFINE_integer("repeats", 5, "timed calls per case")
flags.DEFINE_string("model", "", "a preset: time its whole training fwd+bwd instead")
flags.DEFINE_integer("response_tokens", 1024, "with --model: tokens scored")
flags.DEFINE_string("cache", "", "QxS: Q queries at the end of S cache slots instead (the B of --shapes; "
                    "its T is ignored): the CPU row-stepped path against one dense pass")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  if args.heads % args.kv_heads:
    raise SystemExit(f"--heads={args.heads} must be a multiple of --kv_heads={args.kv_heads}")
  dtype = jnp.dtype(args.dtype)
  if args.cache:
    return cache_table(args, dtype)
  case = model_case if args.model else attention_case
  what = f"model {args.model}" if args.model else f"H={args.heads} K={args.kv_heads} D={args.head_dim}"
  print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}), {what}, {args.dtype}, fwd+bwd\n")
  print("| backend | B | T | ms | TFLOP/s | scratch GiB |")
  print("|---|---|---|---|---|---|")
  for b, t in parse_shapes(args.shapes):
    for backend in args.backends.split(","):
      missing = availability(backend, dtype)
      if missing:
        print(f"| {backend} | {b} | {t} | skipped: {missing} | | |")
        continue
      try:
        fn, fn_args, flops = case(backend, b, t, args, dtype)
        sec, scratch = measure(fn, fn_args, args.repeats)
      except Exception as e:  # out of memory, or a shape the kernel refuses: report, go on
        print(f"| {backend} | {b} | {t} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | |")
        continue
      print(f"| {backend} | {b} | {t} | {sec * 1e3:.1f} | {flops / sec / 1e12:.2f} | {scratch:.2f} |")


if __name__ == "__main__":
  app.run(main)
