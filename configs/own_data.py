"""MemAgent RL on your own questions: a JSONL file, one question a line (memagent_jax/data/jsonl_qa.py).

  --config=configs/own_data.py --config.data.data_dir=train.jsonl --config.eval.data_dir=dev.jsonl
                                        SmolLM2-135M-Instruct (the embedded default), sized for one GPU
  --config=configs/own_data.py:smoke    the same recipe on 2 CPU cores, 2 steps on tests/data/own_qa
  --config=configs/own_data.py:tiny     a random tiny SmolLM2, 2 steps on tests/data/own_qa: the test of the path

data.data_dir is the training file and eval.data_dir the held-out one (evaluating training questions is
refused); data.train_size and eval.size are at most their files' question counts. Lines with "documents"
are padded with the file's other documents to about data.length tokens; a "context" is read as given.
"""

import ml_collections

from configs import smollm2_niah_rl

EXAMPLE = "tests/data/own_qa"  # train.jsonl (10 questions) and dev.jsonl (5): the README's example


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "smoke", "tiny"):
    raise ValueError(f"unknown variant {variant!r} of own_data; choose '', 'smoke' or 'tiny'")
  c = smollm2_niah_rl.get_config("smoke" if variant else "")
  # RULER's containment of any accepted answer, in the boxed answer (the whole response when nothing is
  # boxed: SmolLM2 rarely boxes); the released QA reward is rl.reward=memagent_verifier
  c.rl.reward = "string_match_part"
  c.data.update(task="jsonl", data_dir="", length=8192)
  c.eval.update(data_dir="")
  c.train.workdir = "runs/own_data"
  if variant:  # the example files: 10 training and 5 held-out questions, 256-token documents
    c.data.update(data_dir=f"{EXAMPLE}/train.jsonl", length=256, train_size=10)
    c.eval.update(data_dir=f"{EXAMPLE}/dev.jsonl", every=2, size=4, batch_size=4)
    c.agent.update(chunk_tokens=128)
    c.train.update(steps=2, save_every=2, workdir=f"runs/own_data_{variant}")
  if variant == "tiny":  # a random 2-layer SmolLM2 with its real tokenizer: seconds, not minutes
    c.model.update(source="random:tiny-smollm2")
    c.agent.update(chunk_tokens=64, memory_tokens=16, answer_tokens=8, question_tokens=32)
    c.rl.update(group_size=2, questions_per_step=2, ppo_mini_batch=2, rollout_batch=4, dynamic_sampling=False)
    c.rl.overlong.update(enable=False, max_tokens=8, cache_tokens=4)
    c.eval.update(top_p=1.0)  # the rollouts' sampling: evaluation reuses their compiled answer program
    c.train.progress = False
  return c
