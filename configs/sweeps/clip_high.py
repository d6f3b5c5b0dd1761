"""Ablation: DAPO's clip-higher (upper clip range; the lower one stays 0.2)."""


def get_sweep():
  return {"config": "configs/toy_cpu.py",
          "runs": {f"clip_high_{h}": {"rl.clip_high": h} for h in (0.2, 0.28, 0.4)}}
