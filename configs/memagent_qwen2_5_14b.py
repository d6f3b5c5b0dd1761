"""RL-MemAgent-14B as released (256 questions per step, 16 updates of 16 questions), plus `:dapo`."""

import ml_collections

from configs.memagent_qwen2_5_7b import with_variant


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  return with_variant("memagent_qwen2_5_14b", variant, model="qwen2.5-14b-instruct", questions_per_step=256,
                      mini_batch=16, fsdp=16, tensor=4)
