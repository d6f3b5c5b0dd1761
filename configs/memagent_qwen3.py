"""MemAgent RL on Qwen3 dense models with the released run's objective, each size on one TPU host.

  --config=configs/memagent_qwen3.py:4b          (also 8b, 1.7b; no size means 4b)
  --config=configs/memagent_qwen3.py:4b,dapo     DAPO on top (clip-higher, dynamic sampling, no KL, overlong)
What matters from the released RL-MemAgent run is kept as is (MEMAGENT_FACTS.md section 3): the released
verifier, KL 1e-3 to the reference with the k3 ("low_var_kl") estimator, clip 0.2/0.2 with dual clip 3,
mean-centred advantages (no std division), 16 rollouts per question, 5000-token chunks, 1024-token memory
and answer, AdamW 1e-6. Qwen3 models think unless told not to; MemAgent's turns render with thinking off (an
empty think block opens each reply: Tokenizer.chat_text).
Each size is sized for the one 8-chip host a re-implementer would pick (`POD`; the mesh is fsdp x tensor
over all of its chips): 32 questions x 16 rollouts per step in 8 updates of 4 questions, one trajectory per
update micro-batch. The release's 128 questions per step: --config.rl.questions_per_step=128 on a larger pod.
Check a size on your pod with `memagent compile --config=configs/memagent_qwen3.py:SIZE --topology=POD`.
"""

import ml_collections

from configs import base
from configs.memagent_qwen2_5_7b import dapo, released

QUESTIONS_PER_STEP, QUESTIONS_PER_UPDATE = 32, 4
# size -> (preset, pod, fsdp, tensor, rollout rows). fsdp x tensor is the pod's chip count; tensor divides
# the 8 kv heads of every Qwen3 size. The step's peak per chip by `memagent compile` (the largest program's
# own bytes plus what the trainer keeps beside it; docs/results/tpu_compile.md, rows qwen3_<size>_<pod>):
# 1.7B 13.2 of 14.9 GiB on v5e, 4B 25.9 of 29.8 on v6e, 8B 74.5 of 95.0 on v5p, each with at least 10% free.
# 8B cannot train on v5e-8 (its fp32 weights + Adam alone are 12 of 16 GB per chip).
SIZES = {"1.7b": ("qwen3-1.7b", "v5e-8", 4, 2, 32),
         "4b": ("qwen3-4b", "v6e-8", 4, 2, 64),
         "8b": ("qwen3-8b", "v5p-8", 2, 2, 64)}
POD = {size: spec[1] for size, spec in SIZES.items()}


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
  preset, _, fsdp, tensor, rollout_rows = SIZES[size]
  c = released(base.get_config(), model=preset, questions_per_step=QUESTIONS_PER_STEP,
               mini_batch=QUESTIONS_PER_UPDATE, fsdp=fsdp, tensor=tensor)
  c.rl.update(micro_batches=QUESTIONS_PER_UPDATE * c.rl.group_size, rollout_batch=rollout_rows)
  # layers unrolled: scanned, the update's stacked weight copy costs these few-chip meshes 1.2-11 GiB per
  # chip and the 4B a tenth of its update time (docs/results/tpu_compile.md, "Layers scanned or unrolled")
  c.model.scan_layers = False
  c.eval.batch_size = rollout_rows
  c.train.workdir = f"runs/memagent_qwen3_{size}" + ("_dapo" if with_dapo else "")
  return dapo(c) if with_dapo else c
