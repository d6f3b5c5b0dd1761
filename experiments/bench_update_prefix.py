"""What one RL step's update costs with and without the shared template opening and the
first update's own old log-probs, on a real rollout batch of the toy reproduction.

  python experiments/bench_update_prefix.py --root=runs/toy_full_lookup

Builds the lookup world's RL stage from <root>/warm_start/export, collects one step of
rollouts, and times (compiled, median of --repeats) the passes an update runs:
  per row      old log-probs + reference log-probs + update, every row through the whole model
  shared       reference log-probs + update, the opening's keys once per batch, old = current
It prints both side by side and the largest log-prob difference between the two paths.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from experiments import toy_reproduction  # noqa: E402
from memagent_jax.experiment.assembly import build_trainer  # noqa: E402
from memagent_jax.rl import update as upd  # noqa: E402
from memagent_jax.rl.batching import mini_batches  # noqa: E402

_ROOT = flags.DEFINE_string("root", "runs/toy_full_lookup", "a toy_reproduction run with a warm_start export")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed calls per pass (after one compiling call)")


def timed(fn, repeats: int) -> float:
  """Median wall seconds of fn() after a first (compiling) call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint handler at INFO
  cfg = toy_reproduction.stage_config("rl", "full", _ROOT.value, "lookup", steps={})
  workdir = tempfile.mkdtemp(prefix="bench_update_prefix_")
  cfg.train.progress = False
  try:
    t = build_trainer(cfg, workdir=workdir)
    roll = t.collector.collect(t.batches, t._seed)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  part = mini_batches(roll.rows, num_questions=roll.num_questions, questions_per_mini_batch=cfg.rl.ppo_mini_batch,
                      multiple=t.row_multiple, pad_id=t.collector.agent.pad_id)[0]
  dev = t._device_batch(upd.split_micro(part.arrays(), cfg.rl.micro_batches))
  st, gd, r = t.state, t.policy.graphdef, _REPEATS.value
  prefix = jnp.asarray(t.shared_prefix)
  if not upd.prefix_fits(part.tokens, part.valid, t.shared_prefix, t.loss_from):
    raise SystemExit("this batch's rows do not all fit the shared opening")
  kw = dict(graphdef=gd, prompt_width=t.loss_from, temperature=t.spec.temperature, compute_dtype=t.spec.compute_dtype)
  fwd = lambda **extra: upd.batch_logprobs(st.params, dev["tokens"], dev["valid"], **kw, **extra)
  plain_fwd, shared_fwd = timed(fwd, r), timed(lambda: fwd(prefix=prefix), r)
  spec = dataclasses.replace(t.spec, old_is_current=False)
  copy = lambda tree: jax.tree.map(jnp.copy, tree)  # update_step donates its params and optimizer state
  plain_upd = timed(lambda: upd.update_step(copy(st.params), copy(st.opt_state), dev, graphdef=gd, tx=t.tx,
                                            spec=spec)[2]["loss"], r)
  spec_now = dataclasses.replace(t.spec, old_is_current=True)
  shared_upd = timed(lambda: upd.update_step(copy(st.params), copy(st.opt_state), dev, graphdef=gd, tx=t.tx, spec=spec_now,
                                             prefix=prefix)[2]["loss"], r)
  mask = np.asarray(dev["loss_mask"])
  diff = float(np.abs(np.asarray(fwd()) - np.asarray(fwd(prefix=prefix)))[mask].max())
  rows, width = part.tokens.shape
  print(f"rows {rows} x {width} columns ({part.valid.mean():.0%} real tokens), shared opening "
        f"{len(t.shared_prefix)} tokens, {jax.device_count()} {jax.default_backend()} device(s)\n")
  print("| pass | per row (s) | shared opening (s) |\n|---|---|---|")
  print(f"| old log-probs | {plain_fwd:.3f} | 0 (the update's own pass) |")
  print(f"| reference log-probs | {plain_fwd:.3f} | {shared_fwd:.3f} |")
  print(f"| update (forward + backward + AdamW) | {plain_upd:.3f} | {shared_upd:.3f} |")
  total_plain, total_shared = 2 * plain_fwd + plain_upd, shared_fwd + shared_upd
  print(f"| **one step's update** | **{total_plain:.3f}** | **{total_shared:.3f}** ({total_plain / total_shared:.2f}x) |")
  print(f"\nlargest |log-prob difference| on response tokens, per row vs shared: {diff:.2e}")


if __name__ == "__main__":
  app.run(main)
