"""RL-MemAgent-7B as released (MEMAGENT_FACTS.md section 3), plus a DAPO variant.

  --config=configs/memagent_qwen2_5_7b.py          released settings (GRPO-style, KL 0.001 k3)
  --config=configs/memagent_qwen2_5_7b.py:dapo     clip-higher, dynamic sampling, no KL, overlong
Meant for a pod (bf16, fsdp x tensor mesh); see configs/base.py for every field.
"""

import ml_collections

from configs import base


def released(c: ml_collections.ConfigDict, model: str, questions_per_step: int, mini_batch: int,
             fsdp: int, tensor: int) -> ml_collections.ConfigDict:
  """The settings both released models share; model size picks the batch and the mesh."""
  c.model.source = model
  c.model.dtype = "bfloat16"
  c.model.remat = "full"
  c.agent.update(chunk_tokens=5000, memory_tokens=1024, answer_tokens=1024, question_tokens=1024,
                 final_template="boxed", block_chunks=8, max_chunks=8)  # training: centre-truncate to 8 chunks
  # 8192 training questions as released (they were first filtered to those Qwen2.5-7B cannot answer
  # without the document; that filter is not implemented here), 128 held-out dev questions.
  c.data.update(task="hotpotqa", length=28000, data_dir="data/hotpotqa/hotpot_train_v1.1.json",
                train_size=8192)
  c.rl.update(group_size=16, questions_per_step=questions_per_step, ppo_mini_batch=mini_batch,
              micro_batches=mini_batch * 16 // 8, rollout_batch=512, temperature=1.0, top_p=1.0,
              reward="memagent_verifier", advantage="mean_centred", loss="ppo_clip", agg="token-mean",
              clip_low=0.2, clip_high=0.2, clip_c=3.0, kl_coef=0.001, kl_kind="low_var_kl",
              entropy_coef=0.0, dynamic_sampling=False, mask_truncated=False)
  c.rl.overlong.enable = False
  c.optim.update(lr=1e-6, schedule="constant", warmup_steps=20, weight_decay=0.01, grad_clip=1.0)
  c.train.update(steps=200, save_every=10, keep_checkpoints=3)
  c.eval.update(every=10, size=128, temperature=1.0, top_p=0.7, batch_size=64,
                data_dir="data/hotpotqa/hotpot_dev_distractor_v1.json")
  c.mesh.update(data=-1, fsdp=fsdp, tensor=tensor, rollout="replicated")
  return c


def dapo(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """DAPO (arXiv 2503.14476) on top of the released run."""
  c.rl.update(clip_low=0.2, clip_high=0.28, clip_c=0.0, kl_coef=0.0, dynamic_sampling=True,
              max_extra_gen_batches=3, on_insufficient="proceed", advantage="grpo")
  c.rl.overlong.update(enable=True, max_tokens=1024, cache_tokens=256)
  return c


def with_variant(name: str, variant: str, **released_kw) -> ml_collections.ConfigDict:
  """The released config of one model size, or its `dapo` variant."""
  if variant not in ("", "dapo"):
    raise ValueError(f"unknown variant {variant!r} of {name}; choose '' or 'dapo'")
  c = released(base.get_config(), **released_kw)
  c.train.workdir = f"runs/{name}" + (f"_{variant}" if variant else "")
  return dapo(c) if variant == "dapo" else c


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  return with_variant("memagent_qwen2_5_7b", variant, model="qwen2.5-7b-instruct", questions_per_step=128,
                      mini_batch=8, fsdp=8, tensor=4)
