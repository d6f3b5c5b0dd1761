"""MemAgent RL on one 8-chip TPU host: Qwen2.5-0.5B / 1.5B / 3B with the released reader and rewards.

  --config=configs/memagent_qwen2_5_small.py:0.5b      (also 1.5b, 3b), for v5p-8 or v5e-8
The released workflow (5000-token chunks, 1024-token memory and answer, 8 chunks per training
document) and DAPO-style objective, with batches sized for 8 chips instead of 32-64 GPUs; the mesh
splits rows and weights over all chips (fsdp), the 1.5B and 3B over fsdp 4 x tensor 2, so that the
update's step peak (its own bytes plus the rollout copy of the weights beside it) fits a 16 GB v5e chip
(with fsdp 8 the 1.5B's update asked for 17.1 GiB of 14.9). The 3B does NOT fit a v5e-8 by the step's
peak: its update holds 14.3 GiB beside the 2.9 GiB rollout copy, 17.2 of 14.9 GiB (docs/results/tpu_compile.md);
run it on v5p-8 or v6e-8. Check a variant on your pod with `memagent compile --config ... --topology v5e-8`: the
0.5B update's step peak there is 9.6 of 14.9 GiB per chip (one 8K-token row per chip; it asked for 18.9
before activations were pinned to their rows between blocks, models/attention.constrain_rows).
"""

import ml_collections

from configs import base

# (preset, questions per step, questions per update, micro-batches, rollout rows, fsdp, tensor)
# Micro-batches give one row of 8K tokens per chip in the update (its temporaries fit a 16 GB v5e).
SIZES = {"0.5b": ("qwen2.5-0.5b-instruct", 32, 4, 32, 128, 8, 1),
         "1.5b": ("qwen2.5-1.5b-instruct", 32, 4, 64, 64, 4, 2),
         "3b": ("qwen2.5-3b-instruct", 32, 4, 64, 64, 4, 2)}


def get_config(variant: str = "0.5b") -> ml_collections.ConfigDict:
  if variant not in SIZES:
    raise ValueError(f"unknown variant {variant!r} of memagent_qwen2_5_small; choose one of {sorted(SIZES)}")
  model, questions, mini, micro, rollout_rows, fsdp, tensor = SIZES[variant]
  c = base.get_config()
  c.model.update(source=model, dtype="bfloat16", remat="full")
  c.agent.update(chunk_tokens=5000, memory_tokens=1024, answer_tokens=1024, question_tokens=1024,
                 final_template="boxed", block_chunks=8, max_chunks=8)
  c.data.update(task="hotpotqa", length=28000, data_dir="data/hotpotqa/hotpot_train_v1.1.json", train_size=8192)
  c.rl.update(group_size=8, questions_per_step=questions, ppo_mini_batch=mini, micro_batches=micro,
              rollout_batch=rollout_rows, temperature=1.0, top_p=1.0, reward="memagent_verifier",
              advantage="grpo", loss="ppo_clip", agg="token-mean", clip_low=0.2, clip_high=0.28, clip_c=0.0,
              kl_coef=0.0, dynamic_sampling=True, max_extra_gen_batches=2, on_insufficient="proceed")
  c.rl.overlong.update(enable=True, max_tokens=1024, cache_tokens=256)
  c.optim.update(lr=1e-6, schedule="constant", warmup_steps=10, weight_decay=0.01, grad_clip=1.0)
  c.train.update(steps=200, save_every=10, keep_checkpoints=3, workdir=f"runs/memagent_qwen2_5_{variant}")
  c.eval.update(every=10, size=128, temperature=1.0, top_p=0.7, batch_size=64,
                data_dir="data/hotpotqa/hotpot_dev_distractor_v1.json")
  c.mesh.update(data=-1, fsdp=fsdp, tensor=tensor, rollout="replicated")
  return c
