"""MemAgent RL on one TPU host: Qwen2.5-0.5B / 1.5B / 3B with the released reader and rewards.

  --config=configs/memagent_qwen2_5_small.py:0.5b      (also 1.5b, 3b), each for the host in `POD`
The released workflow (5000-token chunks, 1024-token memory and answer, 8 chunks per training
document) and DAPO-style objective, with batches sized for 8 chips instead of 32-64 GPUs; the mesh
splits rows and weights over all chips (fsdp), the 1.5B and 3B over fsdp 4 x tensor 2. Each size's pod is
the smallest 8-chip host on which the step's peak (the largest program's own bytes plus what the trainer
keeps beside it, e.g. the rollout copy of the weights) leaves at least 10% of a chip's HBM free, by
`memagent compile` (docs/results/tpu_compile.md): the 0.5B and 1.5B on v5e-8 (16 GB chips; with fsdp 8 the
1.5B's update asked for 17.1 GiB of 14.9), the 3B on v6e-8 (32 GB chips): on v5e-8 its update holds
14.3 GiB beside the 2.9 GiB rollout copy, 17.2 of 14.9 GiB. Check a variant on your pod with
`memagent compile --config=configs/memagent_qwen2_5_small.py:SIZE --topology=POD`.
"""

import ml_collections

from configs import base

# (preset, pod, questions per step, questions per update, micro-batches, rollout rows, fsdp, tensor)
# Micro-batches give one row of 8K tokens per chip in the update (its temporaries fit a 16 GB v5e).
SIZES = {"0.5b": ("qwen2.5-0.5b-instruct", "v5e-8", 32, 4, 32, 128, 8, 1),
         "1.5b": ("qwen2.5-1.5b-instruct", "v5e-8", 32, 4, 64, 64, 4, 2),
         "3b": ("qwen2.5-3b-instruct", "v6e-8", 32, 4, 64, 64, 4, 2)}
POD = {size: spec[1] for size, spec in SIZES.items()}


def get_config(variant: str = "0.5b") -> ml_collections.ConfigDict:
  if variant not in SIZES:
    raise ValueError(f"unknown variant {variant!r} of memagent_qwen2_5_small; choose one of {sorted(SIZES)}")
  model, _, questions, mini, micro, rollout_rows, fsdp, tensor = SIZES[variant]
  c = base.get_config()
  # layers unrolled: on one host the scanned update (which stacks the weights in every forward) moves more
  # bytes for little saved memory (docs/results/tpu_compile.md, "Layers scanned or unrolled")
  c.model.update(source=model, dtype="bfloat16", remat="full", scan_layers=False)
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
