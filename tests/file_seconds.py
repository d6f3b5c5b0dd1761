"""Each test file's seconds in a full run (the sum of its tests' setup, call and teardown), by which
tests/conftest.py hands the longest files out first, so two workers end together. Only the order
depends on it: a stale or missing entry costs time, never a result. To refresh it from a run:

  .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests --durations=0 > durations.log
  .venv/bin/python tests/file_seconds.py durations.log   # rewrites this file's table

Measured on 2026-12-08 (b8bf921, 2 cores, `--durations=0`)."""

import collections
import re
import sys

SECONDS = {
  "test_toy_reproduction.py": 184,
  "test_save_faults.py": 165,
  "test_update.py": 148,
  "test_parity.py": 124,
  "test_tpu_compile.py": 92,
  "test_data_parallel_training.py": 76,
  "test_prefix_cache.py": 60,
  "test_cli.py": 49,
  "test_trainer.py": 44,
  "test_compaction.py": 41,
  "test_profile_step.py": 38,
  "test_sampling.py": 37,
  "test_rollout_sharding.py": 35,
  "test_own_data.py": 31,
  "test_bench_gpu.py": 26,
  "test_gated_memory.py": 23,
  "test_toy_teacher.py": 22,
  "test_attention.py": 21,
  "test_agent.py": 17,
  "test_cli_errors.py": 17,
  "test_parallel.py": 17,
  "test_long_run.py": 17,
  "test_token_shift.py": 16,
  "test_checkpointing.py": 15,
  "test_config_overrides.py": 13,
  "test_config_reach.py": 12,
  "test_compile_plan.py": 12,
  "test_device_rows.py": 11,
  "test_curriculum.py": 11,
  "test_weights.py": 9,
  "test_workdir_lock.py": 8,
  "test_decode_types.py": 7,
  "test_pod_launch.py": 6,
  "test_bench_length_sweep.py": 6,
  "test_toy.py": 6,
  "test_rollout.py": 6,
  "test_data_ruler.py": 6,
  "test_losses.py": 4,
  "test_qwen3.py": 4,
  "test_configs.py": 3,
  "test_config_validation.py": 3,
  "test_lean_core.py": 3,
  "test_plot_training.py": 3,
  "test_readme.py": 2,
  "test_chunking.py": 2,
  "test_memory_errors.py": 2,
  "test_optim.py": 1,
  "test_data_tfds.py": 1,
  "test_hlo_stats.py": 1,
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
