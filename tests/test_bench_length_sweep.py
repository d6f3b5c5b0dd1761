"""experiments/benchmarks/bench_length_sweep.py: the whole sweep's wall time split into its parts."""

import pytest

from experiments.benchmarks import bench_length_sweep
from memagent_jax.data import tasks


def test_lengths_double_from_the_training_length_and_refuse_other_multiples():
  assert bench_length_sweep.lengths_to(1) == [128]
  assert bench_length_sweep.lengths_to(8) == [128, 256, 512, 1024]
  for bad in (0, 3, 12):
    with pytest.raises(ValueError, match=f"max_multiple={bad} must be a power of 2"):
      bench_length_sweep.lengths_to(bad)


def test_a_tiny_sweep_times_each_length_and_splits_the_whole_into_parts():
  """Two lengths of 2 documents with the shipped base reader: one row per length, the parts add up to
  the whole, the documents were timed (and make_samples is restored after)."""
  make_samples = tasks.make_samples
  rows, parts = bench_length_sweep.timed_sweep("experiments/data/toy_base_lookup", [128, 256], n=2)
  assert tasks.make_samples is make_samples
  assert [r.length for r in rows] == [128, 256] and all(r.n == 2 for r in rows)
  assert all(r.seconds_per_doc > 0 for r in rows)
  assert parts["documents"] > 0 and parts["reading"] > 0 and parts["other"] > 0  # the warm-up compiles
  assert parts["whole"] == pytest.approx(parts["reading"] + parts["documents"] + parts["other"])
  text = bench_length_sweep.table(rows, parts, process=parts["whole"] + 1)
  assert "| 2x (256 tokens) | 2 |" in text and "whole sweep" in text


def test_cpu_devices_default_to_the_cores_that_divide_the_batch_and_refuse_others():
  assert bench_length_sweep.cpu_devices(0, rows=200, cores=2) == 2
  assert bench_length_sweep.cpu_devices(0, rows=7, cores=2) == 1  # 7 rows do not split over 2 devices
  assert bench_length_sweep.cpu_devices(0, rows=200, cores=3) == 2
  assert bench_length_sweep.cpu_devices(1, rows=200, cores=2) == 1
  with pytest.raises(ValueError, match="cpu_devices=3 does not divide the batch of 200"):
    bench_length_sweep.cpu_devices(3, rows=200, cores=8)
  with pytest.raises(ValueError, match="cpu_devices=-1 must be >= 0"):
    bench_length_sweep.cpu_devices(-1, rows=200, cores=2)
