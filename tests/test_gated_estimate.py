"""`memagent compile --assume.keep_rate`: the rollout's decode loop re-costed for a gated memory, checked by
hand on a made-up program and on a compiled one (its own per-iteration figures)."""

import types

import pytest

from memagent_jax.experiment import gated_estimate
from memagent_jax.experiment.gated_estimate import GatedAssumption

CHIP = types.SimpleNamespace(peak_flops=100.0, hbm_bandwidth=1000.0, ici_bandwidth=1.0)
# two turns of a 16-token decode loop: 10 FLOPs, 100 bytes (60 of them weights) per iteration
PROGRAM = dict(flops=1000.0, bytes_accessed=5000.0, collective_bytes=0.0, roofline_s=10.0,
               loops=[dict(innermost=True, trip_count=16, flops_per_iteration=10.0, bytes_per_iteration=100.0,
                           collective_bytes_per_iteration=0.0),
                      dict(innermost=False, trip_count=2, flops_per_iteration=400.0, bytes_per_iteration=2000.0,
                           collective_bytes_per_iteration=0.0)])


def _estimate(keep_rate, buckets=3):
  return gated_estimate.gated_rollout(PROGRAM, assume=GatedAssumption(keep_rate=keep_rate, form_tokens=3,
                                                                      buckets=buckets),
                                      memory_tokens=16, turns=2, group_rows=8, weight_bytes=60.0, chip=CHIP)


def test_bucket_share():
  assert gated_estimate.bucket_share(0.8, 8, 3) == 0.25  # 1.6 writing rows: the 2-row bucket of (2, 4, 8)
  assert gated_estimate.bucket_share(0.6, 8, 3) == 0.5  # 3.2 rows: the 4-row bucket
  assert gated_estimate.bucket_share(0.8, 8, 1) == 1.0  # no compaction: every row runs
  assert gated_estimate.bucket_share(1.0, 8, 3) == 0.0  # nothing writes
  assert gated_estimate.bucket_share(0.0, 8, 3) == 1.0


def test_by_hand():
  # 4 steps with every row (3-token form + stop), 12 with a quarter of them: FLOPs and KV bytes (40 of the 100)
  # saved on 12 x 2 turns x 3/4
  e = _estimate(0.8)
  assert e["flops"] == 1000 - 2 * 12 * 10 * 0.75
  assert e["bytes_accessed"] == 5000 - 2 * 12 * 40 * 0.75
  assert e["roofline_s"] == pytest.approx(820 / 100) and e["bound_by"] == "compute"
  assert e["overwrite_roofline_s"] == 10.0
  # every turn keeps: the loop ends after 4 steps; its last 12 read nothing, weights included
  e = _estimate(1.0)
  assert e["flops"] == 1000 - 2 * 12 * 10 and e["bytes_accessed"] == 5000 - 2 * 12 * 100
  # no compaction and one writer: nothing saved (the loop runs every row to the cap)
  e = _estimate(0.8, buckets=1)
  assert e["flops"] == 1000 and e["bytes_accessed"] == 5000


def test_bad_assumptions_are_named():
  with pytest.raises(ValueError, match="keep_rate=1.5"):
    GatedAssumption(keep_rate=1.5, form_tokens=3, buckets=3)
  with pytest.raises(ValueError, match="no innermost loop of 32"):
    gated_estimate.gated_rollout(PROGRAM, assume=GatedAssumption(keep_rate=0.5, form_tokens=3, buckets=3),
                                 memory_tokens=32, turns=2, group_rows=8, weight_bytes=60.0, chip=CHIP)
