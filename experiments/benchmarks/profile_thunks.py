"""Where a compiled program's wall time goes, per XLA thunk: one toy sweep batch (`--target=sweep`) or
one SmolLM2 prefill (`--target=prefill`) or one greedy SmolLM2 generation (`--target=decode`, make bench's
prompts and batch) or one RL update of bench_train's table (`--target=update`: forward, backward, AdamW),
traced with `jax.profiler` and grouped by thunk kind, output shape and jax op (from the optimized HLO
XLA dumps). Each moment of wall time is split equally among the thunks running then, so two cores'
overlap is not counted twice and the rows add up to the traced time.

  python -m experiments.benchmarks.profile_thunks --target=sweep --multiple=8
  python -m experiments.benchmarks.profile_thunks --target=prefill --tokens=4096
  python -m experiments.benchmarks.profile_thunks --target=decode --batch=8
  python -m experiments.benchmarks.profile_thunks --target=update --preset=tiny-smollm2

XLA_FLAGS is set here (HLO dump) before JAX starts, so run it in a fresh process.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

# the HLO dump and the trace: a fresh directory, under PROFILE_THUNKS_DIR when set (kept for a second look)
_WORK = (tempfile.mkdtemp(prefix="profile_thunks_", dir=os.environ.get("PROFILE_THUNKS_DIR"))
         if __name__ == "__main__" else None)
if _WORK and "jax" not in sys.modules:  # the dump names each thunk's output shape
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={_WORK}/hlo --xla_dump_hlo_as_text").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags, defined when run as a script only: tests import `wall_share` beside
  other scripts' flags of the same names (--n, --out)."""
  flags.DEFINE_enum("target", "sweep", ["sweep", "prefill", "decode", "update"], "the program to trace")
  flags.DEFINE_integer("multiple", 8, "sweep: document length / training length (128 tokens)")
  flags.DEFINE_integer("n", 200, "sweep: documents in the batch (bench_sweep_batch's)")
  flags.DEFINE_string("source", "experiments/data/toy_base_lookup", "sweep: the reader's weights (a trained "
                      "reader writes longer memories than the base: more decoding)")
  flags.DEFINE_integer("tokens", 4096, "prefill: prompt tokens (B=1, as make bench)")
  flags.DEFINE_integer("batch", 8, "decode: rows (as make bench)")
  flags.DEFINE_integer("decode_tokens", 128, "decode: new tokens per row (as make bench)")
  flags.DEFINE_string("preset", "tiny-smollm2", "update: the model preset (bench_train's rows, length, float32)")
  flags.DEFINE_integer("rows", 25, "table rows to print")


_WRAPPERS = re.compile(r"(while|conditional|cond|call)(\.\d+)?$")  # control flow: its body's thunks are counted
_NUMBERED = re.compile(r"\.\d+$")  # ynn_fusion.117 -> ynn_fusion


def wall_share(trace_dir: str, hlo_text: str) -> tuple[collections.Counter, collections.Counter, float]:
  """(seconds, calls) per "thunk kind, output shape and the jax op it comes from" (the last part of its
  op_name: a YNNPACK fusion led by a norm's reduce_sum is told from a matmul's), and the traced seconds
  the thunks cover."""
  shapes = {}
  for name, shape, rest in re.findall(r"^\s*(?:ROOT )?%(\S+) = (\S+\[[^\]]*\])([^\n]*)", hlo_text, re.M)[::-1]:
    op = re.search(r'op_name="[^"]*?([^/"]+)"', rest)
    shapes[name] = shape + (f" {op.group(1)}" if op else "")
  events = json.load(gzip.open(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[0]))
  events = events["traceEvents"] if isinstance(events, dict) else events
  skip = ("Pjit", "ThunkExecutor", "$", "Common", "Slinky", "end:")
  thunks = [e for e in events if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(skip)
            and not _WRAPPERS.match(e["name"])]
  key = lambda e: f"{_NUMBERED.sub('', e['name'])} {shapes.get(e['name'], '?')}"
  calls = collections.Counter(key(e) for e in thunks)
  edges = sorted([(e["ts"], 1, i) for i, e in enumerate(thunks)] + [(e["ts"] + e["dur"], -1, i) for i, e in enumerate(thunks)])
  share, running, last = collections.Counter(), set(), None
  for t, kind, i in edges:
    for j in running:  # the time since the last edge, split among the thunks running in it
      share[key(thunks[j])] += (t - last) / len(running) / 1e6
    last = t
    (running.add if kind == 1 else running.discard)(i)
  return share, calls, sum(share.values())


def _sweep_call():
  from experiments.benchmarks.sweep_batch import sweep_batch
  return "jit_memory_block", sweep_batch(FLAGS.multiple, FLAGS.n, FLAGS.source)


def _prefill_call():
  import memagent_jax as mj
  from experiments.benchmarks.bench_sampler import _prefill
  policy = mj.load_policy("smollm2-135m-instruct", dtype="float32")
  t = FLAGS.tokens
  ids = jnp.asarray(np.random.default_rng(0).integers(0, policy.config.vocab_size, size=(1, t)), jnp.int32)
  return "jit__prefill", lambda: _prefill(policy.graphdef, policy.state, ids, t + 128).block_until_ready()


def _decode_call():
  import memagent_jax as mj
  from experiments.benchmarks.bench_sampler import decode_prompts
  from memagent_jax.policy.decode_spec import GREEDY
  policy = mj.load_policy("smollm2-135m-instruct", dtype="float32")
  prompts = decode_prompts(policy, FLAGS.batch)  # make bench's
  return "jit_generate_tokens", lambda: policy.sample(prompts, FLAGS.decode_tokens, params=GREEDY, stop_tokens=[])


def _update_call():
  from experiments.benchmarks import bench_train as bt
  step, _ = bt.bench_update(FLAGS.preset, bt.ROWS, bt.LENGTH, bt.PROMPT_WIDTH, jnp.float32, micro=1, remat=False)
  return "jit_update_step", lambda: jax.block_until_ready(step())


def main(argv):
  del argv
  program, call = dict(sweep=_sweep_call, prefill=_prefill_call, decode=_decode_call,
                       update=_update_call)[FLAGS.target]()
  call(), call()  # compile, warm up
  start = time.perf_counter()
  call()
  untraced = time.perf_counter() - start
  with jax.profiler.trace(f"{_WORK}/trace"):
    start = time.perf_counter()
    call()
    traced = time.perf_counter() - start
  hlo = sorted(glob.glob(f"{_WORK}/hlo/*{program}.cpu_after_optimizations.txt"))[-1]
  share, calls, covered = wall_share(f"{_WORK}/trace", open(hlo).read())
  print(f"{FLAGS.target}: {untraced:.3f} s untraced, {traced:.3f} s traced, thunks cover {covered:.3f} s "
        f"(wall split among the thunks running at once)\n")
  print("| thunk kind, output shape and jax op | calls | s |\n|---|---|---|")
  for name, seconds in share.most_common(FLAGS.rows):
    print(f"| {name} | {calls[name]} | {seconds:.3f} |")


if __name__ == "__main__":
  define_flags()
  app.run(main)
