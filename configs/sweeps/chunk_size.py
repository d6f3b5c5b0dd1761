"""Ablation: chunk size at a fixed document length (more, smaller chunks = more memory updates)."""


def get_sweep():
  return {"config": "configs/toy_cpu.py",
          "runs": {f"chunk_{c}": {"agent.chunk_tokens": c} for c in (32, 64, 128)}}
