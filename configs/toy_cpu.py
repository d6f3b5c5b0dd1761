"""CPU configs on the toy memory world (memagent_jax/data/toy.py): tests, demos, sweeps.

  --config=configs/toy_cpu.py          toy-tiny from scratch, RL only ("it learns" in minutes)
  --config=configs/toy_cpu.py:tiny     toy-tiny, a few steps: tests of the loop, resume, knobs
  --config=configs/toy_cpu.py:dapo     the same with DAPO's clip-higher, dynamic sampling, overlong
The reward is RULER's containment score on the answer, so a policy trained from scratch gets
some signal before it has learnt the answer format (the toy_memagent warm start removes that need).
"""

import ml_collections

from configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = base.get_config()
  c.model.update(source="random:toy-tiny", dtype="float32", seed=0, remat="none")
  c.agent.update(chunk_tokens=64, memory_tokens=16, answer_tokens=8, question_tokens=16,
                 final_template="boxed", block_chunks=4, max_chunks=0)
  c.data.update(task="toy_kv", length=128, train_size=512, seed=0)
  c.rl.update(group_size=8, questions_per_step=16, ppo_mini_batch=4, micro_batches=1, rollout_batch=128,
              temperature=1.0, top_p=1.0, reward="string_match_part", advantage="grpo",
              clip_low=0.2, clip_high=0.28, clip_c=3.0, kl_coef=0.0, entropy_coef=0.0,
              dynamic_sampling=False)
  c.rl.overlong.update(enable=False, max_tokens=8, cache_tokens=4)
  c.optim.update(lr=1e-2, schedule="constant", warmup_steps=2, weight_decay=0.0, grad_clip=1.0)
  c.train.update(steps=60, seed=0, workdir="runs/toy_cpu", save_every=20, keep_checkpoints=2)
  c.eval.update(every=0, size=64, seed=12345, temperature=1.0, top_p=0.7, batch_size=64)
  c.mesh.update(data=-1, fsdp=1, tensor=1)
  if variant == "tiny":
    c.data.update(length=96, train_size=16)
    c.rl.update(group_size=2, questions_per_step=4, ppo_mini_batch=2, rollout_batch=8, advantage="grpo")
    c.train.update(steps=3, save_every=1, workdir="runs/toy_tiny", progress=False)
    c.eval.update(every=0, size=4, batch_size=4)
  elif variant == "dapo":
    c.rl.update(dynamic_sampling=True, max_extra_gen_batches=4, on_insufficient="proceed",
                clip_high=0.28, clip_c=0.0, kl_coef=0.0)
    c.rl.overlong.update(enable=True, max_tokens=8, cache_tokens=4)
    c.train.workdir = "runs/toy_cpu_dapo"
  elif variant:
    raise ValueError(f"unknown variant {variant!r} of toy_cpu; choose '', 'tiny' or 'dapo'")
  return c
