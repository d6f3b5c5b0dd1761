"""Linear cost of the memory agent vs the direct-reading baseline, with a tiny random model.

Each point runs in a fresh subprocess (so peak RSS is that point's own): MemAgent from 8 to 1024
chunks (time per chunk, peak RSS), DirectReader on the same documents up to the model's context
window, and a 1M-token document through `memagent answer` (the CLI's streaming path).
Writes a markdown table and a PNG. Run: `python -m experiments.benchmarks.bench_scaling`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from absl import app, flags

from memagent_jax.runtime.atomic_io import atomic_write, save_figure

CHUNK, MEMORY, ANSWER, BLOCK = 512, 32, 8, 8
CONTEXT = 32768  # the tiny model's context window (the direct baseline's limit)
SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"


def tiny_policy():
  """SmolLM2's vocabulary and tokenizer on a 2-layer, 64-wide random body (never stops early)."""
  from flax import nnx
  import jax.numpy as jnp
  from memagent_jax.models import Decoder, get_preset
  from memagent_jax.policy.loading import load_tokenizer
  from memagent_jax.policy import Policy
  cfg = dataclasses.replace(get_preset("tiny-smollm2"), max_position_embeddings=CONTEXT)
  return Policy(Decoder(cfg, jnp.float32, rngs=nnx.Rngs(0)), load_tokenizer(), "tiny-smollm2")


def document(tokenizer, n_tokens: int) -> str:
  """Noise text of about n_tokens tokens."""
  per = len(tokenizer.encode(SENTENCE))
  return SENTENCE * max(1, n_tokens // per)


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(kind: str, n: int) -> dict:
  """One measurement in this process; prints JSON."""
  import memagent_jax as mj
  policy = tiny_policy()
  q = "What colour is the grass?"
  if kind == "cli":
    from memagent_jax import cli
    path = os.path.join(tempfile.mkdtemp(), "doc.txt")
    with open(path, "w") as f:  # written in pieces: the process never holds the document
      per = len(policy.tokenizer.encode(SENTENCE))
      for _ in range(max(1, n // per) // 1000):
        f.write(SENTENCE * 1000)
    t = time.perf_counter()
    cli.main(["answer", "--doc", path, "--question", q, "--model", "random:tiny-smollm2",
              "--chunk-tokens", str(CHUNK * 4), "--memory-tokens", str(MEMORY),
              "--answer-tokens", str(ANSWER), "--block-chunks", str(BLOCK), "--quiet"])
    return dict(kind=kind, tokens=n, seconds=time.perf_counter() - t, rss_mb=peak_rss_mb(),
                file_mb=os.path.getsize(path) / 2**20)
  if kind == "interleaved":  # 8 chunks vs n chunks alternately in one process, min of 3 each
    reader = mj.MemAgent(policy, chunk_tokens=CHUNK, memory_tokens=MEMORY, answer_tokens=ANSWER,
                         block_chunks=BLOCK)
    docs = {8: document(policy.tokenizer, 8 * CHUNK), n // CHUNK: document(policy.tokenizer, n)}
    reader.answer(q, docs[8], keep_prompts=False)
    best = {k: float("inf") for k in docs}
    for _ in range(3):
      for k, d in docs.items():
        t = time.perf_counter()
        res = reader.answer(q, d, keep_prompts=False)
        best[k] = min(best[k], (time.perf_counter() - t) / res.num_chunks)
    return dict(kind=kind, tokens=n, ms_per_chunk={str(k): 1e3 * v for k, v in best.items()},
                rss_mb=peak_rss_mb())
  doc = document(policy.tokenizer, n)
  if kind == "memagent":
    reader = mj.MemAgent(policy, chunk_tokens=CHUNK, memory_tokens=MEMORY, answer_tokens=ANSWER,
                         block_chunks=BLOCK)
    run = lambda: reader.answer(q, doc, keep_prompts=False)
  else:
    reader = mj.DirectReader(policy, answer_tokens=ANSWER)
    run = lambda: reader.answer(q, doc)
  run()  # compilation
  times = []
  for _ in range(3 if n <= 64 * CHUNK else 1):
    t = time.perf_counter()
    res = run()
    times.append(time.perf_counter() - t)
  return dict(kind=kind, tokens=res.document_tokens, chunks=res.num_chunks, seconds=min(times),
              rss_mb=peak_rss_mb())


def measure(kind: str, n: int) -> dict:
  out = subprocess.run([sys.executable, "-m", "experiments.benchmarks.bench_scaling", f"--worker={kind}",
                        f"--n={n}"], capture_output=True, text=True)
  if out.returncode:
    return dict(kind=kind, tokens=n, error=out.stderr.strip().splitlines()[-1])
  return json.loads(out.stdout.strip().splitlines()[-1])


def plot(rows_mem, rows_dir, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
  ax[0].plot([r["chunks"] for r in rows_mem], [1e3 * r["seconds"] / r["chunks"] for r in rows_mem], "o-")
  ax[0].set(xscale="log", xlabel="chunks", ylabel="ms per chunk", title="MemAgent: time per chunk",
            ylim=(0, None))
  for rows, label in ((rows_mem, "MemAgent"), (rows_dir, "direct")):
    ok = [r for r in rows if "error" not in r]
    ax[1].plot([r["tokens"] for r in ok], [r["seconds"] for r in ok], "o-", label=label)
    ax[2].plot([r["tokens"] for r in ok], [r["rss_mb"] for r in ok], "o-", label=label)
  ax[1].axvline(CONTEXT, color="grey", ls="--", label="direct: context window")
  ax[1].set(xscale="log", yscale="log", xlabel="document tokens", ylabel="seconds", title="time per document")
  ax[2].set(xscale="log", xlabel="document tokens", ylabel="peak RSS (MB)", title="peak memory", ylim=(0, None))
  for a in ax[1:]:
    a.legend()
  fig.tight_layout()
  save_figure(fig, path, dpi=110)


flags.DEFINE_string("worker", None, "internal: measure one case in this process and print it as JSON")
flags.DEFINE_integer("n", None, "internal: the worker's document tokens")
flags.DEFINE_string("chunks", "8,16,32,64,128,256,512,1024", "MemAgent document lengths in chunks")
flags.DEFINE_string("direct_tokens", "1024,2048,4096,8192,16384,30000,65536", "direct-reading lengths in tokens")
flags.DEFINE_string("cli_tokens", "65536,1048576", "file lengths read through `memagent answer`")
flags.DEFINE_string("out", "docs/results", "directory of the table and plot")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  if args.worker:
    print(json.dumps(worker(args.worker, args.n)))
    return
  from tqdm import tqdm
  jobs = ([("memagent", int(c) * CHUNK) for c in args.chunks.split(",")]
          + [("direct", int(t)) for t in args.direct_tokens.split(",")]
          + [("cli", int(t)) for t in args.cli_tokens.split(",") if t]
          + [("interleaved", int(args.chunks.split(",")[-1]) * CHUNK)])
  results = []
  for kind, n in tqdm(jobs, desc="bench_scaling", unit="run"):
    results.append(measure(kind, n))
    tqdm.write(json.dumps(results[-1]))
  mem = [r for r in results if r["kind"] == "memagent"]
  dirs = [r for r in results if r["kind"] == "direct"]
  cli_rows = [r for r in results if r["kind"] == "cli"]
  base = mem[0]["seconds"] / mem[0]["chunks"]
  lines = [f"# Scaling: MemAgent vs direct reading (tiny random model, {platform.machine()}, "
           f"{os.cpu_count()} cores)", "",
           f"Command: `.venv/bin/python experiments/bench_scaling.py` ; model: tiny-smollm2 body "
           f"(2 layers, width 64, SmolLM2 vocabulary), context {CONTEXT}; MemAgent chunk {CHUNK}, "
           f"memory {MEMORY}, answer {ANSWER}, {BLOCK} chunks per compiled block. Random weights never "
           f"emit a stop token, so every memory update generates the full {MEMORY} tokens (worst case). "
           "Times exclude compilation (one warm-up call); each point is a fresh process.", "",
           "| document tokens | chunks | MemAgent s | ms / chunk | vs 8 chunks | MemAgent peak RSS MB "
           "| direct s | direct peak RSS MB |", "|---|---|---|---|---|---|---|---|"]
  for r in mem:
    per = r["seconds"] / r["chunks"]
    d = min(dirs, key=lambda x: abs(x["tokens"] - r["tokens"]))
    d_cell = (f"{d['seconds']:.2f} | {d['rss_mb']:.0f}" if abs(d["tokens"] - r["tokens"]) < 0.1 * r["tokens"]
              and "error" not in d else " - | - ")
    lines.append(f"| {r['tokens']} | {r['chunks']} | {r['seconds']:.2f} | {1e3 * per:.1f} | "
                 f"{per / base:.2f}x | {r['rss_mb']:.0f} | {d_cell} |")
  lines += ["", "Direct reading (whole document in one prompt):", "",
            "| document tokens | seconds | peak RSS MB | note |", "|---|---|---|---|"]
  for r in dirs:
    if "error" in r:
      lines.append(f"| {r['tokens']} | - | - | does not fit: {r['error'][:160]} |")
    else:
      lines.append(f"| {r['tokens']} | {r['seconds']:.2f} | {r['rss_mb']:.0f} | |")
  lines += ["", f"`memagent answer` on long files (chunk {CHUNK * 4}, streamed from disk, compilation "
            "included):", "", "| document tokens (approx.) | file MB | seconds | peak RSS MB |",
            "|---|---|---|---|"]
  for r in cli_rows:
    lines.append(f"| {r['tokens']} | {r.get('file_mb', 0):.1f} | {r.get('seconds', 0):.1f} | "
                 f"{r.get('rss_mb', 0):.0f} |" if "error" not in r else f"| {r['tokens']} | error: {r['error']} |")
  for r in results:
    if r["kind"] == "interleaved" and "error" not in r:
      (a, ta), (b, tb) = r["ms_per_chunk"].items()
      lines += ["", f"Same process, the two documents alternated, best of 3 each: {a} chunks "
                f"{ta:.1f} ms/chunk, {b} chunks {tb:.1f} ms/chunk ({tb / ta:.2f}x)."]
  table = "\n".join(lines) + "\n"
  print(table)
  os.makedirs(args.out, exist_ok=True)
  with atomic_write(os.path.join(args.out, "bench_scaling.md")) as f:
    f.write(table + "\n![scaling](bench_scaling.png)\n")
  plot(mem, dirs, os.path.join(args.out, "bench_scaling.png"))


if __name__ == "__main__":
  app.run(main)
