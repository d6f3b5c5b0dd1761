"""GPU benchmarks in one run -> docs/results/gpu.md (shapes of /work/shared/GPU_BASELINES.md):
1. attention fwd+bwd, bf16: `attend` (xla, cudnn) vs `jax.nn.dot_product_attention(implementation="cudnn")`;
2. update tokens/s and MFU: `update_step` (bf16 compute, fp32 master, full remat) vs PyTorch + transformers;
3. decode tokens/s of our sampler beside HF `generate`, and its share of the HBM-bandwidth limit;
4. the RL step split (rollout / logprobs / update seconds) of a small config through `build_trainer`.
  make bench-gpu                                            # python -m experiments.benchmarks.bench_gpu (NVIDIA GPU)
  python -m experiments.benchmarks.bench_gpu --smoke --out=/tmp/g.md   # tiny shapes: < 1 min on CPU, a pre-check on a GPU
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import statistics
import sys
import tempfile
import time

# JAX must not pre-allocate 75% of the GPU: the PyTorch references run in this process too (first)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402

from memagent_jax.models import attention  # noqa: E402
from memagent_jax.models.config import get_preset  # noqa: E402
from memagent_jax.models.decoder import Decoder  # noqa: E402
from memagent_jax.policy import sampling  # noqa: E402
from memagent_jax.policy.decode_spec import GREEDY  # noqa: E402
from memagent_jax.rl import update as upd  # noqa: E402
from memagent_jax.runtime.atomic_io import atomic_write  # noqa: E402

DEFAULT_OUT = os.path.join("docs", "results", "gpu.md")
# Dense bf16 tensor-core FLOP/s and HBM bytes/s from NVIDIA's datasheets, which print twice these FLOP/s "with
# sparsity": "NVIDIA H100 Tensor Core GPU" (SXM5, PCIe, NVL) and "NVIDIA H200 Tensor Core GPU" (SXM, NVL).
# Matched in this order against jax's device_kind (e.g. "NVIDIA H100 80GB HBM3").
GPU_PEAKS = (("H200 NVL", 835e12, 4.8e12), ("H200", 989e12, 4.8e12), ("H100 PCIe", 756e12, 2.0e12),
             ("H100 NVL", 835e12, 3.9e12), ("H100", 989e12, 3.35e12))
ON_GPU = jax.default_backend() == "gpu"


@dataclasses.dataclass(frozen=True)
class Shapes:
  attn_heads: tuple[int, int, int]  # (query heads H, kv heads K, head dim D)
  attn_cases: tuple[tuple[int, int], ...]  # (B, T) per row
  preset: str  # update and decode model (random weights)
  rows: int  # update: [rows, length] tokens, the last `response` of each row scored
  length: int
  response: int
  decode_batches: tuple[int, ...]
  prompt: int  # decode: [B, prompt] prompts, then `new` generated tokens per row
  new: int
  rl_config: str  # section 4: "path.py:variant"


REAL = Shapes((14, 2, 64), ((8, 2048), (4, 8192), (1, 32768)), "qwen2.5-0.5b-instruct", 16, 2048, 1024,
              (1, 8), 128, 256, "configs/toy_cpu.py")
SMOKE = Shapes((4, 2, 16), ((2, 128), (1, 256)), "tiny-qwen2", 4, 64, 32, (1, 8), 16, 32, "configs/toy_cpu.py:tiny")


# --- helpers ---------------------------------------------------------------------------------
def gpu_peaks() -> tuple[float, float] | None:
  """(bf16 FLOP/s, HBM bytes/s) of this GPU from GPU_PEAKS; None on CPU or an unknown GPU."""
  kind = jax.devices()[0].device_kind
  return next(((f, b) for name, f, b in GPU_PEAKS if name in kind), None) if ON_GPU else None


def timed(fn, repeats: int) -> float:
  """Median seconds of fn() (which must block) after one warm-up call (compilation)."""
  fn()
  stamps = [time.perf_counter()]
  for _ in range(repeats):
    fn()
    stamps.append(time.perf_counter())
  return statistics.median(np.diff(stamps))


def attempt(fn, *args):
  """fn(*args), or a table cell saying why it failed (out of memory, a shape a kernel refuses)."""
  try:
    return fn(*args)
  except Exception as e:  # noqa: BLE001  report and go on: one failed case must not lose the rest
    return f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}".replace("|", "/")


def fmt(x, spec: str = ".1f") -> str:
  return "n/a" if x is None else format(x, spec)  # None: not measurable here


def table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def torch_device():
  """(torch module, "cuda" | "cpu"), or (None, None) when torch or transformers is missing."""
  try:
    import torch
    import transformers  # noqa: F401
  except ImportError:
    return None, None
  return torch, "cuda" if torch.cuda.is_available() else "cpu"


def hf_model(preset: str, dtype: str):
  """A random-weight transformers model of the preset's shape with SDPA attention, on torch_device()."""
  torch, dev = torch_device()
  import transformers
  hf = transformers.AutoConfig.for_model(**get_preset(preset).to_hf_dict(dtype))
  model = transformers.AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa")
  return model.to(dev, getattr(torch, dtype))


def random_model(preset: str):
  """(config, graphdef, bf16 state) of a random-weight Decoder; attention "auto" (cudnn on a GPU)."""
  model = Decoder(get_preset(preset), jnp.bfloat16, rngs=nnx.Rngs(0))
  return (model.config, *nnx.split(model))


def matmul_peak(n: int = 8192, repeats: int = 5) -> float:
  """bf16 FLOP/s of one n^3 jitted matmul (a 2048^3 one is too small to reach an H100's peak)."""
  a = jnp.ones((n, n), jnp.bfloat16)
  f = jax.jit(lambda x: x @ x)
  return 2 * n ** 3 / timed(lambda: f(a).block_until_ready(), repeats)


# --- 1. attention ----------------------------------------------------------------------------
def attention_ms(name: str, b: int, t: int, heads, repeats: int):
  """Milliseconds of one jitted fwd+bwd (grads of sum(out * cot) w.r.t. q, k, v) on whole rows."""
  h, kh, d = heads
  rng = np.random.default_rng(0)
  q, cot = (jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.bfloat16) for _ in range(2))  # [B, T, H, D]
  k, v = (jnp.asarray(rng.normal(size=(b, kh, t, d)), jnp.bfloat16) for _ in range(2))  # [B, K, T, D]
  valid = jnp.ones((b, t), bool)  # no padding: the direct call has none either
  if name == "jax.nn cudnn (direct)":
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)  # [B, T, K, D], its native layout
    fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
  else:
    spec = attention.AttentionSpec(backend=name.split()[-1])
    fn = lambda q, k, v: attention.attend(q, k, v, valid, spec=spec)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum((fn(q, k, v) * cot).astype(jnp.float32)), argnums=(0, 1, 2)))
  return 1e3 * timed(lambda: jax.block_until_ready(grad(q, k, v)), repeats)


def bench_attention(s: Shapes, repeats: int) -> str:
  h, kh, d = s.attn_heads
  rows = []
  for b, t in s.attn_cases:
    for name in ("attend xla", "attend cudnn", "jax.nn cudnn (direct)"):
      skip = "cudnn" in name and not ON_GPU
      ms = f"n/a on {jax.default_backend()}" if skip else attempt(attention_ms, name, b, t, s.attn_heads, repeats)
      flops = 3.5 * 4 * b * h * d * t * t / 2  # causal QK^T + PV; backward ~2.5x forward
      ok = isinstance(ms, float)
      rows.append([name, b, t, f"{h}/{kh}", d, f"{ms:.3f}" if ok else ms, f"{flops / ms / 1e9:.3g}" if ok else "n/a"])
      print(rows[-1], flush=True)
  return table(["implementation", "B", "T", "q/kv heads", "D", "ms fwd+bwd", "TFLOP/s"], rows)


# --- 2. update -------------------------------------------------------------------------------
def update_batch(s: Shapes, vocab: int) -> upd.UpdateBatch:
  """One micro-batch: tokens, valid [1, R, L]; loss_mask, old_logp, ref_logp [1, R, N]; advantages [1, R]."""
  rng, r, n = np.random.default_rng(0), s.rows, s.response
  b = dict(tokens=rng.integers(0, vocab, (r, s.length)).astype(np.int32), valid=np.ones((r, s.length), bool),
           loss_mask=np.ones((r, n), bool), old_logp=np.zeros((r, n), np.float32),
           ref_logp=np.zeros((r, n), np.float32), advantages=rng.standard_normal(r).astype(np.float32))
  return jax.tree.map(jnp.asarray, upd.split_micro(b, 1))


def jax_update(s: Shapes, repeats: int) -> tuple[float, float]:
  """(seconds per update, GiB XLA plans: arguments + outputs - donated + scratch) of update_step: bf16
  compute, fp32 master + AdamW, full remat, token-mean policy gradient at ratio 1, as the reference."""
  cfg, gd, state = random_model(s.preset)
  params = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), state)  # fp32 master
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5, weight_decay=0.01))
  carry = [params, tx.init(params)]
  batch = update_batch(s, cfg.vocab_size)
  spec = upd.UpdateSpec(prompt_width=s.length - s.response, loss="ppo_clip", agg="token-mean", clip_low=0.2,
                        clip_high=0.28, clip_c=None, kl_coef=0.0, kl_kind="low_var_kl", entropy_coef=0.0,
                        remat="full", temperature=1.0, compute_dtype="bfloat16", old_is_current=True)
  compiled = upd.update_step.lower(*carry, batch, graphdef=gd, tx=tx, spec=spec).compile()
  m = compiled.memory_analysis()
  gib = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes) / 2**30

  def step():  # params and opt_state are donated: only the returned ones are used again
    carry[0], carry[1], metrics = compiled(*carry, batch)
    jax.block_until_ready(metrics.loss)

  return timed(step, repeats), gib


def torch_update(s: Shapes, repeats: int) -> tuple[float, float | None]:
  """(seconds, peak GiB) of the update in PyTorch + transformers: bf16 autocast over fp32 weights, SDPA,
  gradient checkpointing, AdamW (fused on CUDA), grad-norm clip 1.0, token-mean policy gradient."""
  torch, dev = torch_device()
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
  model = hf_model(s.preset, "float32").train()
  model.config.use_cache = False
  getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=dev == "cuda")
  g = torch.Generator().manual_seed(0)
  tokens = torch.randint(0, model.config.vocab_size, (s.rows, s.length), generator=g).to(dev)  # [R, L]
  adv = torch.randn(s.rows, 1, generator=g).to(dev)  # [R, 1]
  p = s.length - s.response

  def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=torch.bfloat16):
      logits = model.lm_head(model.model(input_ids=tokens).last_hidden_state[:, p - 1:-1])  # [R, N, V]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, p:, None])[..., 0]  # [R, N]
    (-(adv * torch.exp(logp - logp.detach())).mean()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sync()

  # the first CUDA work of the process (torch_references runs it first): the peak is this update's
  return timed(step, repeats), torch.cuda.max_memory_allocated() / 2 ** 30 if dev == "cuda" else None


def bench_update(s: Shapes, repeats: int, refs: dict) -> str:
  cfg, tokens, peaks = get_preset(s.preset), s.rows * s.length, gpu_peaks()
  measured = matmul_peak() if ON_GPU else None
  results = [("memagent_jax update_step", attempt(jax_update, s, repeats))] + refs.get("update", [])
  rows, ours = [], None if isinstance(results[0][1], str) else results[0][1][0]
  for name, r in results:
    if isinstance(r, str):
      rows.append([name, s.preset, f"{s.rows} x {s.length}", r] + [""] * 5)
      continue
    sec, gib = r
    mfu = lambda peak: None if peak is None else 100 * 6 * cfg.num_params * tokens / sec / peak
    rows.append([name, s.preset, f"{s.rows} x {s.length}", f"{sec:.4f}", f"{tokens / sec:,.0f}",
                 fmt(mfu(peaks and peaks[0])), fmt(mfu(measured)), fmt(gib, ".2f"), fmt(ours and sec / ours, ".2f")])
    print(rows[-1], flush=True)
  note = (f"MFU = 6 x {cfg.num_params / 1e6:.2f}M params x tokens / time / peak: spec peak "
          f"{fmt(peaks and peaks[0] / 1e12, '.0f')} TFLOP/s (datasheet, dense bf16), measured "
          f"{fmt(measured and measured / 1e12, '.0f')} TFLOP/s (8192^3 bf16 matmul). Ours: attention "
          f"{attention.resolve_backend('auto', jnp.bfloat16)}, GiB as XLA plans it; torch: peak allocated. "
          "Last column: seconds relative to memagent_jax (above 1x: slower than ours).\n\n")
  return note + table(["stack", "model", "rows x tokens", "s / update", "tokens/s", "MFU % (spec)",
                       "MFU % (measured)", "GiB", "time vs ours"], rows)


# --- 3. decode -------------------------------------------------------------------------------
def jax_decode(s: Shapes, b: int, repeats: int) -> float:
  """Seconds to prefill [b, prompt] and greedily decode `new` tokens per row (no stop token)."""
  cfg, gd, state = random_model(s.preset)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (b, s.prompt)), jnp.int32)  # [B, P]
  rows = sampling.PromptRows(tokens=tokens, valid=jnp.ones(tokens.shape, bool),
                             keys=sampling.row_keys(jax.random.PRNGKey(0), np.arange(b)),
                             stop_tokens=-jnp.ones((b, 1), jnp.int32), inactive=jnp.zeros((b,), bool))
  kw = dict(max_new_tokens=s.new, cache_size=s.prompt + s.new, pad_id=0)
  return timed(lambda: jax.block_until_ready(sampling.generate_tokens(gd, state, rows, GREEDY, **kw).tokens), repeats)


def hf_decode(s: Shapes, b: int, repeats: int) -> float:
  """The same with transformers' `generate` (bf16 weights, SDPA, KV cache, greedy)."""
  torch, dev = torch_device()
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
  model = hf_model(s.preset, "bfloat16").eval()
  ids = torch.randint(0, model.config.vocab_size, (b, s.prompt), generator=torch.Generator().manual_seed(0)).to(dev)

  def run():
    with torch.no_grad():
      model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.new, min_new_tokens=s.new,
                     do_sample=False, pad_token_id=0)
    sync()

  return timed(run, repeats)


def bench_decode(s: Shapes, repeats: int, refs: dict) -> str:
  cfg, peaks = get_preset(s.preset), gpu_peaks()
  rows = []
  for b in s.decode_batches:
    # every decode step reads all bf16 params once and yields b tokens (KV-cache reads ignored)
    limit = b * peaks[1] / (2 * cfg.num_params) if peaks else None
    for name, r in [("memagent_jax sampler", attempt(jax_decode, s, b, repeats))] + refs.get(("decode", b), []):
      tps = b * s.new / r if isinstance(r, float) else None
      rows.append([name, b, f"{s.prompt} + {s.new}", r if tps is None else f"{tps:,.1f}", fmt(limit, ",.0f"),
                   fmt(limit and tps and 100 * tps / limit)])
      print(rows[-1], flush=True)
  note = (f"{s.preset} shape, bf16, random weights, greedy, no stop token; tokens/s = B x new / (prefill + "
          f"decode). HBM limit = B x bandwidth ({fmt(peaks and peaks[1] / 1e12, '.2f')} TB/s) / bf16 param "
          f"bytes per decode step ({2 * cfg.num_params / 1e9:.3g} GB).\n\n")
  return note + table(["implementation", "B", "prompt + new", "tokens/s", "HBM limit tokens/s", "% of limit"], rows)


def torch_references(s: Shapes, repeats: int, sections: list[str], smoke: bool) -> dict:
  """The PyTorch rows of sections 2 and 3 (on CUDA; on CPU only in a smoke run), run before JAX touches
  the GPU, their memory freed after."""
  torch, dev = torch_device()
  run = torch is not None and (smoke or dev == "cuda")
  why = "skipped: no torch + transformers" if torch is None else f"skipped: torch on {dev}, not CUDA"
  refs = {}
  if "update" in sections:
    refs["update"] = [(f"PyTorch + transformers ({dev})", attempt(torch_update, s, repeats) if run else why)]
  for b in s.decode_batches if "decode" in sections else ():
    refs[("decode", b)] = [(f"HF generate ({dev})", attempt(hf_decode, s, b, repeats) if run else why)]
  if run and dev == "cuda":
    torch.cuda.empty_cache()
  return refs


# --- 4. RL step split ------------------------------------------------------------------------
def load_config(spec: str):
  """'configs/toy_cpu.py:tiny' -> configs.toy_cpu.get_config('tiny') (run from the repository root)."""
  path, _, variant = spec.partition(":")
  return importlib.import_module(os.path.splitext(os.path.normpath(path))[0].replace(os.sep, ".")).get_config(variant)


def bench_rl(spec: str, steps: int) -> str:
  """`steps` train_step calls; logprobs seconds by timing each `update.batch_logprobs` call (blocking)."""
  from memagent_jax.experiment.assembly import build_trainer
  from memagent_jax.rl.trainer import StepPrograms
  cfg = load_config(spec)
  cfg.train.progress, cfg.eval.every = False, 0
  spent = []

  def timed_logprobs(*a, **kw):
    t = time.perf_counter()
    out = jax.block_until_ready(upd.batch_logprobs(*a, **kw))
    spent.append(time.perf_counter() - t)
    return out

  rows = []
  with tempfile.TemporaryDirectory() as workdir:
    trainer = build_trainer(cfg, workdir=workdir, programs=StepPrograms(batch_logprobs=timed_logprobs))
    try:
      for i in range(steps):
        spent.clear()
        m = trainer.train_step()
        trainer.state.step += 1
        update = m.update_seconds - sum(spent)
        rows.append([i + 1] + [f"{x:.3f}" for x in (m.rollout.rollout_seconds, sum(spent), update, m.step_seconds)]
                    + [m.updates] + [f"{x:,.0f}" for x in (m.rollout_tokens_per_s, m.update_tokens_per_s)])
        print(rows[-1], flush=True)
    finally:
      trainer.checkpointer.wait()
      trainer.writer.close()
  note = (f"`{spec}` through `build_trainer`, {steps} train_step calls (step 1 includes compilation). "
          "logprobs: the old/reference log-prob passes (timed blocking); update: the rest of the update "
          "phase (mini-batching, transfers, update_step).\n\n")
  return note + table(["step", "rollout s", "logprobs s", "update s", "step s", "updates", "rollout tokens/s",
                       "update tokens/s"], rows)


# --- main ------------------------------------------------------------------------------------
def header(smoke: bool, repeats: int) -> str:
  (torch, dev), peaks = torch_device(), gpu_peaks()
  return (f"# GPU benchmarks{': SMOKE RUN at tiny shapes, not a measurement' if smoke else ''}\n\n"
          f"Command: `{' '.join(['python -m experiments.benchmarks.bench_gpu'] + sys.argv[1:])}`\n\n"
          f"Device: {jax.devices()[0].device_kind} ({jax.default_backend()}) x{jax.device_count()}; jax "
          f"{jax.__version__}; {f'torch {torch.__version__} on {dev}' if torch else 'no torch'}; spec peak "
          f"{fmt(peaks and peaks[0] / 1e12, '.0f')} TFLOP/s bf16 dense, HBM {fmt(peaks and peaks[1] / 1e12, '.2f')} "
          f"TB/s. Median of {repeats} calls after a warm-up call. The PyTorch rows ran first, then JAX (without "
          "pre-allocation), in one process.\n")


flags.DEFINE_bool("smoke", False, "tiny shapes (CPU: under a minute; GPU: a pre-check)")
flags.DEFINE_string("out", None, f"markdown output (default {DEFAULT_OUT}; a tmp file with --smoke)")
flags.DEFINE_string("sections", "attention,update,decode,rl", "sections to run, comma separated")
flags.DEFINE_integer("repeats", None, "timed calls per case (default 5; 2 with --smoke)")
flags.DEFINE_string("rl_config", None, "'path.py:variant' for section 4")
flags.DEFINE_integer("rl_steps", 2, "RL steps timed in section 4")
flags.DEFINE_bool("no_torch", False, "skip the PyTorch + transformers references")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  out = args.out or (os.path.join(tempfile.gettempdir(), "bench_gpu_smoke.md") if args.smoke else DEFAULT_OUT)
  if args.smoke and os.path.abspath(out) == os.path.abspath(DEFAULT_OUT):
    raise SystemExit(f"--smoke must not overwrite {DEFAULT_OUT}: pass --out=<another path>")
  if not args.smoke and not ON_GPU:
    raise SystemExit(f"no GPU (jax backend {jax.default_backend()!r}): install jax[cuda12] and a CUDA torch "
                     "on the GPU machine, or run with --smoke --out=<path> for the CPU check")
  s, repeats = (SMOKE if args.smoke else REAL), args.repeats or (2 if args.smoke else 5)
  sections = args.sections.split(",")
  if set(sections) - {"attention", "update", "decode", "rl"}:
    raise SystemExit(f"--sections={args.sections!r}: choose from attention,update,decode,rl")
  refs = {} if args.no_torch else torch_references(s, repeats, sections, args.smoke)
  run = {"attention": ("1. Attention fwd+bwd, bf16", lambda: bench_attention(s, repeats)),
         "update": ("2. Update step: tokens/s and MFU", lambda: bench_update(s, repeats, refs)),
         "decode": ("3. Decode", lambda: bench_decode(s, repeats, refs)),
         "rl": ("4. RL step split", lambda: bench_rl(args.rl_config or s.rl_config, args.rl_steps))}
  parts = [header(args.smoke, repeats)]
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  for key in sections:
    title, fn = run[key]
    print(f"== {title}", flush=True)
    parts.append(f"## {title}\n\n{fn()}\n")
    with atomic_write(out) as f:  # after every section: a later one that fails keeps the earlier tables
      f.write("\n".join(parts))
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)
