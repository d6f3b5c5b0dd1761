"""Ablation: GRPO's std-normalised advantage vs the released MemAgent's mean-centred one."""


def get_sweep():
  return {"config": "configs/toy_cpu.py",
          "runs": {"grpo": {"rl.advantage": "grpo"}, "mean_centred": {"rl.advantage": "mean_centred"}}}
