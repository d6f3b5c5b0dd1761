"""Multi-Conv DAPO on a real model: SmolLM2-135M-Instruct (the embedded default) on RULER
niah_multikey_1 at 8K tokens, sized for one GPU.

  --config=configs/smollm2_niah_rl.py          the accelerator run (bf16, 8 chunks of 1024 tokens)
  --config=configs/smollm2_niah_rl.py:smoke    the same recipe on 2 CPU cores: 512-token documents, 2 steps

niah_multikey_1 hides three needles about other keys in an essay haystack, so what the memory keeps
has to depend on the question, as in MemAgent's training data. The reward is RULER's
string_match_all on the boxed answer (the whole response when nothing is boxed: SmolLM2 rarely
boxes, docs/results/eval_smollm2-135m-instruct_niah_single_1.md). A fresh run evaluates the
held-out set at step 0 and every eval.every steps; experiments.plot_training draws both curves:

  python -m experiments.train --config=configs/smollm2_niah_rl.py
  python -m experiments.plot_training --workdir=runs/smollm2_niah_rl --out=docs/results/rl_smollm2_niah

Sizes, lr and steps are chosen for one H100; the measured run of this recipe is the CPU smoke run
(docs/results/rl_smollm2_niah_smoke.md).
"""

import ml_collections

from configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "smoke"):
    raise ValueError(f"unknown variant {variant!r} of smollm2_niah_rl; choose '' or 'smoke'")
  c = base.get_config()
  c.model.update(source="smollm2-135m-instruct", dtype="bfloat16", remat="full")
  # 8 chunks of 1024 tokens at 8K; each prompt (template + question + memory + chunk) is under 2K of
  # SmolLM2's 8192-token window, which the reader checks when it is built
  c.agent.update(chunk_tokens=1024, memory_tokens=256, answer_tokens=64, question_tokens=128,
                 final_template="boxed", block_chunks=8, max_chunks=0)
  c.data.update(task="niah_multikey_1", length=8192, train_size=2048, seed=0)
  # Multi-Conv DAPO: clip-higher, dynamic sampling, token-mean over every conversation's tokens,
  # overlong shaping on the answer; the released k3 KL at 0.001 (the toy world drifted without KL)
  c.rl.update(group_size=8, questions_per_step=32, ppo_mini_batch=16, micro_batches=8, rollout_batch=256,
              temperature=1.0, top_p=1.0, reward="string_match_all", advantage="grpo",
              loss="ppo_clip", agg="token-mean", clip_low=0.2, clip_high=0.28, clip_c=0.0,
              kl_coef=0.001, kl_kind="low_var_kl", entropy_coef=0.0,
              dynamic_sampling=True, max_extra_gen_batches=2, on_insufficient="proceed")
  c.rl.overlong.update(enable=True, max_tokens=64, cache_tokens=16)
  c.optim.update(lr=2e-6, schedule="constant", warmup_steps=5, weight_decay=0.01, grad_clip=1.0)
  c.train.update(steps=30, save_every=10, keep_checkpoints=2, workdir="runs/smollm2_niah_rl")
  # the released validation sampling (T 1.0, top-p 0.7) on 128 held-out questions
  c.eval.update(every=10, size=128, seed=12345, temperature=1.0, top_p=0.7, batch_size=128)
  if variant == "smoke":  # the whole loop on a CPU: float32, short documents, a few rows
    c.model.update(dtype="float32", remat="none")
    # SmolLM2's niah answers take 20-30 tokens (eval_smollm2-135m-instruct_niah_single_1_*.jsonl), so the cap
    # stays above that, or every answer would be cut and punished and no group would vary
    c.agent.update(chunk_tokens=256, memory_tokens=64, answer_tokens=48)
    c.data.update(length=512, train_size=16)
    c.rl.update(group_size=4, questions_per_step=2, ppo_mini_batch=2, micro_batches=1, rollout_batch=8,
                max_extra_gen_batches=1)
    c.rl.overlong.update(max_tokens=48, cache_tokens=16)
    c.train.update(steps=2, save_every=2, workdir="runs/smollm2_niah_rl_smoke")
    c.eval.update(every=2, size=4, batch_size=4)
  return c
