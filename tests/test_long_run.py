"""A long run does not leak: the tiny config trained with evaluation and saves on keeps the same jax
arrays alive after every step (count and bytes), its host RSS flat, and a bounded history.
The 500-step figures are in docs/results/faults.md."""

import json

import numpy as np
import pytest

from test_trainer import tiny
from memagent_jax.experiment import assembly

STEPS, EVERY = 80, 10


@pytest.mark.slow
def test_memory_flat_over_a_run_with_evaluation_and_saves(tmp_path):
  t = assembly.build_trainer(tiny(**{"train.steps": STEPS, "eval.every": EVERY, "train.save_every": 2 * EVERY,
                                     "train.log_every": 1}), workdir=str(tmp_path))
  out = t.train(keep_history=5)
  assert out["step"] == STEPS and [h["step"] for h in out["history"]] == list(range(STEPS - 4, STEPS + 1))
  lines = [json.loads(l) for l in open(tmp_path / "logs" / "metrics.jsonl")]
  train = {l["step"]: l for l in lines if "train/perf/host_rss_bytes" in l}
  assert sorted(train) == list(range(1, STEPS + 1))
  assert len([l for l in lines if "eval/score" in l]) == STEPS // EVERY + 1  # evaluation ran throughout
  warm = [train[s] for s in range(EVERY + 1, STEPS + 1)]  # after the first evaluation and save compiled
  assert {(l["train/perf/live_arrays"], l["train/perf/device_bytes"]) for l in warm} == {
      (warm[0]["train/perf/live_arrays"], warm[0]["train/perf/device_bytes"])}  # device memory: flat
  rss = np.array([train[s]["train/perf/host_rss_bytes"] for s in range(1, STEPS + 1)])
  early, late = np.median(rss[2 * EVERY:3 * EVERY]), np.median(rss[-EVERY:])  # medians: allocator noise
  assert late <= 1.05 * early, (early / 2 ** 20, late / 2 ** 20)
