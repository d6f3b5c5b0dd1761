"""Ablation: how much memory the agent may write (tokens per memory update)."""


def get_sweep():
  return {"config": "configs/toy_cpu.py",
          "runs": {f"memory_{m}": {"agent.memory_tokens": m} for m in (8, 16, 32)}}
