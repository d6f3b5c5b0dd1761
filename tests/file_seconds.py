"""Each test file's seconds in a full run (the sum of its tests' setup, call and teardown), by which
tests/conftest.py hands the longest files out first, so two workers end together. Only the order
depends on it: a stale or missing entry costs time, never a result. To refresh it from a run:

  .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests --durations=0 > durations.log
  .venv/bin/python tests/file_seconds.py durations.log   # rewrites this file's table

Measured on 2026-12-07 (72aa912, 2 cores, `--durations=0`)."""

import collections
import re
import sys

SECONDS = {
  "test_toy_reproduction.py": 172,
  "test_update.py": 162,
  "test_save_faults.py": 140,
  "test_parity.py": 101,
  "test_agent.py": 96,
  "test_trainer.py": 85,
  "test_tpu_compile.py": 80,
  "test_data_parallel_training.py": 73,
  "test_prefix_cache.py": 52,
  "test_sampling.py": 48,
  "test_profile_step.py": 44,
  "test_compaction.py": 44,
  "test_cli.py": 43,
  "test_rollout_sharding.py": 40,
  "test_own_data.py": 30,
  "test_bench_gpu.py": 24,
  "test_gated_memory.py": 23,
  "test_toy_teacher.py": 21,
  "test_attention.py": 20,
  "test_parallel.py": 19,
  "test_cli_errors.py": 17,
  "test_checkpointing.py": 16,
  "test_token_shift.py": 14,
  "test_compile_plan.py": 12,
  "test_config_overrides.py": 12,
  "test_long_run.py": 12,
  "test_curriculum.py": 11,
  "test_config_reach.py": 11,
  "test_device_rows.py": 11,
  "test_weights.py": 10,
  "test_workdir_lock.py": 8,
  "test_bench_length_sweep.py": 7,
  "test_decode_types.py": 7,
  "test_rollout.py": 7,
  "test_pod_launch.py": 6,
  "test_losses.py": 5,
  "test_toy.py": 5,
  "test_data_ruler.py": 4,
  "test_qwen3.py": 3,
  "test_plot_training.py": 2,
  "test_config_validation.py": 2,
  "test_readme.py": 2,
  "test_configs.py": 2,
  "test_lean_core.py": 2,
  "test_chunking.py": 2,
  "test_memory_errors.py": 2,
  "test_hlo_stats.py": 1,
  "test_optim.py": 1,
  "test_data_tfds.py": 1,
  "test_length_sweep.py": 1,
  "test_toy_seeds.py": 1,
  "test_load_errors.py": 1,
}


def from_durations(log_text: str) -> dict[str, int]:
  """Per-file seconds summed from pytest's `--durations=0` lines."""
  total = collections.Counter()
  for seconds, path in re.findall(r"^([0-9.]+)s (?:setup|call|teardown) +tests/([^:]+)::", log_text, flags=re.M):
    total[path] += float(seconds)
  return {path: round(s) for path, s in total.most_common() if round(s) >= 1}


if __name__ == "__main__":
  seconds = from_durations(open(sys.argv[1]).read())
  text = open(__file__).read()
  table = "SECONDS = {\n" + "".join(f'  "{k}": {v},\n' for k, v in seconds.items()) + "}\n"
  open(__file__, "w").write(re.sub(r"SECONDS = \{\n.*?^\}\n", table, text, count=1, flags=re.M | re.S))
