"""MemAgent RL on Qwen3 dense models with the released run's objective (MEMAGENT_FACTS.md section 3).

  --config=configs/memagent_qwen3.py:4b          (also 8b, 1.7b; no size means 4b)
  --config=configs/memagent_qwen3.py:4b,dapo     DAPO on top (clip-higher, dynamic sampling, no KL, overlong)
What matters from the released RL-MemAgent run is kept as is: the released verifier, KL 1e-3 to the
reference with the k3 ("low_var_kl") estimator, clip 0.2/0.2 with dual clip 3, mean-centred advantages (no
std division), 16 rollouts per question, 5000-token chunks, 1024-token memory and answer, AdamW 1e-6. Batches
are the released 7B run's (128 questions per step, 16 updates of 8). Qwen3 models think unless told not to;
MemAgent's turns render with thinking off (an empty think block opens each reply: Tokenizer.chat_text).
Meant for a pod (bf16); the mesh per size is fsdp x tensor, with data filling the other chips.
"""

import ml_collections

from configs import base
from configs.memagent_qwen2_5_7b import dapo, released

# size -> (preset, fsdp, tensor). tensor divides the 8 kv heads of every Qwen3 size; 8B shards as the 7B
# release (32 chips a replica), 4B on 16, 1.7B on 8.
SIZES = {"1.7b": ("qwen3-1.7b", 8, 1),
         "4b": ("qwen3-4b", 8, 2),
         "8b": ("qwen3-8b", 8, 4)}


def parse_variant(variant: str) -> tuple[str, bool]:
  """'4b', '8b,dapo', 'dapo' (the 4B), '' (the 4B) -> (size, dapo)."""
  parts = [p for p in variant.split(",") if p]
  sizes = [p for p in parts if p in SIZES]
  other = [p for p in parts if p not in SIZES and p != "dapo"]
  if other or len(sizes) > 1 or parts.count("dapo") > 1:
    raise ValueError(f"unknown variant {variant!r} of memagent_qwen3; choose a size ({', '.join(SIZES)}), "
                     "optionally with ',dapo'")
  return (sizes[0] if sizes else "4b"), "dapo" in parts


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  size, with_dapo = parse_variant(variant)
  preset, fsdp, tensor = SIZES[size]
  c = released(base.get_config(), model=preset, questions_per_step=128, mini_batch=8, fsdp=fsdp, tensor=tensor)
  c.train.workdir = f"runs/memagent_qwen3_{size}" + ("_dapo" if with_dapo else "")
  return dapo(c) if with_dapo else c
