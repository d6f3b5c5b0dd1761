"""A long run does not leak: the tiny config trained with evaluation and saves on holds the same jax
arrays (count and bytes) after 12 more steps (evaluated every 4, saved every 8), its host RSS stays flat, and its
history is bounded. The 500-step figures are in docs/results/faults.md."""

import gc
import json

import jax
import numpy as np
import pytest

from test_trainer import tiny
from memagent_jax.experiment import assembly

STEPS, EVERY = 20, 4  # a leak shows in the arrays within a few steps; RSS: steps 9-12 against 17-20


def _live() -> tuple[int, int]:
  """(count, bytes) of the jax arrays alive once garbage is collected (earlier tests' included)."""
  gc.collect()
  arrays = jax.live_arrays()
  return len(arrays), sum(a.nbytes for a in arrays)


@pytest.mark.slow
def test_memory_flat_over_a_run_with_evaluation_and_saves(tmp_path):
  t = assembly.build_trainer(tiny(**{"train.steps": STEPS, "eval.every": EVERY, "train.save_every": 2 * EVERY,
                                     "train.log_every": 1}), workdir=str(tmp_path))
  t.train(until=2 * EVERY)  # every program compiled, evaluation and a save done
  early = _live()
  out = t.train(keep_history=5)
  assert _live() == early  # device memory: the same arrays, to the byte
  assert out.step == STEPS and [h.step for h in out.history] == list(range(STEPS - 4, STEPS + 1))
  lines = [json.loads(l) for l in open(tmp_path / "logs" / "metrics.jsonl")]
  train = {l["step"]: l for l in lines if "train/perf/host_rss_bytes" in l}
  assert sorted(train) == list(range(1, STEPS + 1))
  assert len([l for l in lines if "eval/score" in l]) == STEPS // EVERY + 1  # evaluation ran throughout
  assert all(l["train/perf/live_arrays"] > 0 and l["train/perf/device_bytes"] > 0 for l in train.values())
  rss = np.array([train[s]["train/perf/host_rss_bytes"] for s in range(1, STEPS + 1)])
  early_rss, late_rss = np.median(rss[2 * EVERY:3 * EVERY]), np.median(rss[-EVERY:])  # medians: allocator noise
  assert late_rss <= 1.05 * early_rss, (early_rss / 2 ** 20, late_rss / 2 ** 20)
