"""Throughput of the RL update step: tokens/s and achieved FLOP/s against the measured matmul peak.

  python -m experiments.benchmarks.bench_train                   # toy-tiny, toy-1m, tiny-smollm2 on this machine
  python -m experiments.benchmarks.bench_train --presets=qwen2.5-0.5b-instruct --rows=8 --length=2048 --dtype=bfloat16

FLOPs are XLA's own count for the compiled update (forward + backward + AdamW), and the usual
6 x params x tokens estimate beside it; the peak is a large jitted matmul in the same dtype.
PyTorch runs in this process, alternating with ours (so load hits both alike).
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from absl import app, flags

from memagent_jax.runtime.atomic_io import atomic_write
from memagent_jax.models.config import get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.rl import update as upd


def _time(fn, repeats: int) -> float:
  jax.block_until_ready(fn())  # compile + warm up
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t)
  return best


def _time_pair(fn_a, fn_b, repeats: int) -> tuple[float, float]:
  """Best seconds of each of two steps, timed alternately so other load on the machine hits both alike."""
  jax.block_until_ready(fn_a())
  fn_b()
  best_a = best_b = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn_a())
    best_a = min(best_a, time.perf_counter() - t)
    t = time.perf_counter()
    fn_b()
    best_b = min(best_b, time.perf_counter() - t)
  return best_a, best_b


def matmul_peak(dtype, n: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of one large square matmul: the practical peak of this device and dtype."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  return 2 * n ** 3 / _time(lambda: f(a), repeats)


def bench_update(preset: str, rows: int, length: int, prompt_width: int, dtype, micro: int, remat: bool):
  """(the update step, a dict of its sizes and XLA's FLOP count)."""
  cfg = get_preset(preset)
  model = Decoder(cfg, dtype, rngs=nnx.Rngs(0))
  gd, params = nnx.split(model)
  tx = optax.adamw(1e-5)
  opt = tx.init(params)
  rng = np.random.default_rng(0)
  n = length - prompt_width
  batch = dict(tokens=rng.integers(0, cfg.vocab_size, (rows, length)).astype(np.int32),
               valid=np.ones((rows, length), bool), loss_mask=np.ones((rows, n), bool),
               old_logp=np.full((rows, n), -5.0, np.float32), ref_logp=np.full((rows, n), -5.0, np.float32),
               advantages=rng.standard_normal(rows).astype(np.float32))
  batch = jax.tree.map(jnp.asarray, upd.split_micro(batch, micro))
  spec = upd.UpdateSpec(prompt_width=prompt_width, loss="ppo_clip", agg="token-mean", clip_low=0.2,
                        clip_high=0.28, clip_c=None, kl_coef=0.0, kl_kind="low_var_kl", entropy_coef=0.0,
                        remat=remat, temperature=1.0, compute_dtype=jnp.dtype(dtype).name)  # the model dtype: bf16 runs bf16
  compiled = upd.update_step.lower(params, opt, batch, graphdef=gd, tx=tx, spec=spec).compile()
  state = [params, opt]  # update_step donates params and optimizer state: each call takes the last outputs

  def step():
    state[0], state[1], metrics = upd.update_step(*state, batch, graphdef=gd, tx=tx, spec=spec)
    return metrics.loss

  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  tokens = rows * length
  return step, dict(preset=preset, params=cfg.num_params, rows=rows, length=length,
                    xla_flops=float(cost.get("flops", float("nan"))), model_flops=6.0 * cfg.num_params * tokens)


def bench_torch(preset: str, rows: int, length: int, prompt_width: int):
  """The same update in PyTorch + transformers (the stack the released trainer uses): forward,
  response log-probs, a policy-gradient loss, backward, grad-norm clip, AdamW. Returns the step."""
  import torch
  import transformers
  cfg = get_preset(preset)
  hf = transformers.AutoConfig.for_model(**cfg.to_hf_dict())
  model = transformers.AutoModelForCausalLM.from_config(hf).float().train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
  g = torch.Generator().manual_seed(0)
  tokens = torch.randint(0, cfg.vocab_size, (rows, length), generator=g)
  adv = torch.randn(rows, 1, generator=g)

  def step():
    opt.zero_grad(set_to_none=True)
    hidden = model.model(input_ids=tokens).last_hidden_state[:, prompt_width - 1:length - 1]
    logp = torch.log_softmax(model.lm_head(hidden).float(), -1)
    logp = logp.gather(-1, tokens[:, prompt_width:, None])[..., 0]
    loss = -(adv * torch.exp(logp - logp.detach())).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  return step


ROWS, LENGTH, PROMPT_WIDTH = 64, 256, 224  # the table's update: 64 rows of 224 prompt + 32 response slots


def define_flags():
  """Defined when run as a script only, so importing this module beside other scripts defines nothing twice."""
  flags.DEFINE_string("presets", "toy-tiny,toy-1m,tiny-smollm2", "model presets, comma separated")
  flags.DEFINE_integer("rows", ROWS, "rows per update")
  flags.DEFINE_integer("length", LENGTH, "row width in tokens")
  flags.DEFINE_integer("prompt_width", PROMPT_WIDTH, "prompt slots of a row (the rest is response)")
  flags.DEFINE_integer("micro_batches", 1, "gradient accumulation steps")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype")
  flags.DEFINE_bool("remat", False, "rematerialise each layer in the backward pass")
  flags.DEFINE_integer("repeats", 3, "timed updates")
  flags.DEFINE_string("out", None, "write the markdown table here too")
  flags.DEFINE_bool("no_torch", False, "skip the PyTorch + transformers reference")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  dtype = jnp.dtype(args.dtype)
  with_torch = not args.no_torch and dtype == jnp.float32
  peak = matmul_peak(dtype)
  lines = [f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, dtype {args.dtype}, "
           f"matmul peak {peak / 1e9:.1f} GFLOP/s (2048^3 jitted matmul)", "",
           "| model | params | rows x length | s / update | tokens/s | XLA GFLOP/s | 6NT GFLOP/s | XLA % of peak "
           "| torch s / update | torch tokens/s | ours / torch speed |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for preset in args.presets.split(","):
    step, r = bench_update(preset, args.rows, args.length, args.prompt_width, dtype, args.micro_batches, args.remat)
    if with_torch:
      r["seconds"], ts = _time_pair(step, bench_torch(preset, args.rows, args.length, args.prompt_width), args.repeats)
    else:
      r["seconds"] = _time(step, args.repeats)
    r["tokens_per_s"] = r["rows"] * r["length"] / r["seconds"]
    xla = r["xla_flops"] / r["seconds"]
    lines.append(f"| {preset} | {r['params'] / 1e6:.2f}M | {r['rows']} x {r['length']} | {r['seconds']:.3f} | "
                 f"{r['tokens_per_s']:,.0f} | {xla / 1e9:.1f} | {r['model_flops'] / r['seconds'] / 1e9:.1f} | "
                 f"{100 * xla / peak:.0f}% |")
    if not with_torch:
      lines[-1] += " - | - | - |"
    else:
      lines[-1] += f" {ts:.3f} | {r['rows'] * r['length'] / ts:,.0f} | {ts / r['seconds']:.2f}x |"
    print(lines[-1], flush=True)
  table = "\n".join(lines)
  print(table)
  if args.out:
    with atomic_write(args.out) as f:
      f.write(f"Command: `python -m experiments.benchmarks.bench_train {' '.join(sys.argv[1:])}`\n\n{table}\n")


if __name__ == "__main__":
  define_flags()
  app.run(main)
