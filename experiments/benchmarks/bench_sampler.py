"""Sampler benchmark: our compiled decode/prefill vs transformers (PyTorch) on the same prompts.

Prints a markdown table (and writes it with --out). Run: `python -m experiments.benchmarks.bench_sampler`.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from absl import app, flags

import memagent_jax as mj
from memagent_jax.runtime.atomic_io import atomic_write
from memagent_jax.policy import sampling
from memagent_jax.policy.decode_spec import GREEDY


def timed(fn, repeats: int) -> float:
  """Median wall time of `repeats` calls after one warm-up (compilation) call."""
  fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def matmul_peak(dtype=jnp.float32) -> float:
  """Best GFLOP/s over jitted matmuls (square, and the model's MLP shape): the achievable peak."""
  best = 0.0
  for m, k, n in ((2048, 2048, 2048), (1024, 1024, 1024), (4096, 576, 1536)):
    a = jax.random.normal(jax.random.PRNGKey(0), (m, k), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (k, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    for _ in range(10):
      t = time.perf_counter()
      f(a, b).block_until_ready()
      best = max(best, 2 * m * k * n / (time.perf_counter() - t) / 1e9)
  return best


def prefill_flops(cfg, t: int) -> float:
  """Model FLOPs of a causal prefill of t tokens producing last-position logits."""
  e, d = cfg.hidden_size, cfg.head_dim
  per_token = cfg.num_layers * (2 * e * d * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
                                + 6 * e * cfg.intermediate_size)
  attention = cfg.num_layers * cfg.num_heads * d * 4 * (t * (t + 1) / 2)  # QK^T and PV, causal half
  return per_token * t + attention + 2 * e * cfg.vocab_size


def decode_prompts(policy, b: int) -> list[list[int]]:
  """The decode rows' chat prompts (token ids), one story request per row."""
  return [policy.tokenizer.apply_chat_template(f"Tell me story number {i} about a fox.") for i in range(b)]


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_size"))
def _prefill(graphdef, state, ids, cache_size):
  """The sampler's own prefill (cache writes included), jitted alone so it can be timed."""
  return sampling.prefill(nnx.merge(graphdef, state), ids, jnp.ones(ids.shape, bool), cache_size=cache_size)[0]


flags.DEFINE_string("model", "smollm2-135m-instruct", "what load_policy takes")
flags.DEFINE_integer("new_tokens", 128, "decoded tokens per row")
flags.DEFINE_string("batches", "1,8", "decode batch sizes, comma separated")
flags.DEFINE_string("prefill", "1024,4096", "prefill lengths, comma separated")
flags.DEFINE_integer("repeats", 3, "timed calls per case")
flags.DEFINE_string("out", "", "also write the table to this markdown file")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS

  import torch
  from transformers import AutoModelForCausalLM
  torch.set_num_threads(os.cpu_count())
  policy = mj.load_policy(args.model)
  from memagent_jax.policy.loading import embedded_gguf_path
  from memagent_jax.models.gguf_weights import convert_gguf
  hf_dir = convert_gguf(embedded_gguf_path()) if args.model == "smollm2-135m-instruct" else args.model
  ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()

  rows = []
  peak_before = matmul_peak()
  rng = np.random.default_rng(0)
  n = args.new_tokens
  for b in [int(x) for x in args.batches.split(",")]:
    prompts = decode_prompts(policy, b)
    width = max(len(p) for p in prompts)
    ids = np.array([[policy.tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    ours = timed(lambda: policy.sample(prompts, n, params=GREEDY, stop_tokens=[]), args.repeats)
    with torch.no_grad():
      theirs = timed(lambda: ref.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                          max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                          pad_token_id=policy.tokenizer.pad_token_id), args.repeats)
    rows.append((f"generate B={b}, {width}-token prompt + {n} new (greedy)", "tokens/s",
                 b * n / ours, b * n / theirs, ""))
  for t in [int(x) for x in args.prefill.split(",") if x]:
    ids = rng.integers(0, policy.config.vocab_size, size=(1, t)).astype(np.int32)
    jids = jnp.asarray(ids)
    ours = timed(lambda: _prefill(policy.graphdef, policy.state, jids, t + n).block_until_ready(),
                 args.repeats)
    with torch.no_grad():
      theirs = timed(lambda: ref(torch.tensor(ids), logits_to_keep=1), args.repeats)
    rows.append((f"prefill {t} tokens (B=1, into a {t + n}-slot cache)", "tokens/s", t / ours, t / theirs,
                 prefill_flops(policy.config, t) / ours / 1e9))
  peak = max(peak_before, matmul_peak())  # measured before and after: the machine's noise varies
  rows = [r[:4] + (f"{r[4]:.0f} GFLOP/s = {100 * r[4] / peak:.0f}% of peak" if r[4] else "",)
          for r in rows]

  lines = [f"Model {args.model} float32; {platform.processor() or platform.machine()}, "
           f"{os.cpu_count()} CPU cores; jax {jax.__version__}, torch {torch.__version__}; "
           f"median of {args.repeats} after warm-up.",
           f"Measured JAX fp32 matmul peak (best of 2048^3, 1024^3, 4096x576x1536; before and after): "
           f"{peak:.0f} GFLOP/s. Prefill FLOPs count causal attention (half the square).", "",
           "| workload | unit | memagent_jax | transformers | ratio | note |",
           "|---|---|---|---|---|---|"]
  for name, unit, ours, theirs, note in rows:
    lines.append(f"| {name} | {unit} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x | {note} |")
  table = "\n".join(lines)
  print(table)
  if args.out:
    with atomic_write(args.out) as f:
      f.write(f"# Sampler benchmark\n\nCommand: `{' '.join(['python -m experiments.benchmarks.bench_sampler'] + sys.argv[1:])}`\n\n{table}\n")


if __name__ == "__main__":
  app.run(main)
