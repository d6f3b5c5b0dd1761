"""Ablation: chunk size at a fixed document length (more, smaller chunks = more memory updates).

agent.chunk_tokens also reaches the toy data: each run's documents keep every fact inside one of
its chunks (memagent_jax/data/toy.py), as the 64-token world does."""


def get_sweep():
  return {"config": "configs/toy_cpu.py",
          "runs": {f"chunk_{c}": {"agent.chunk_tokens": c} for c in (32, 64, 128)}}
