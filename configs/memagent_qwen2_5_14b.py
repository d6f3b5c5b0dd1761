"""RL-MemAgent-14B as released (256 questions per step, 16 updates of 16 questions), plus `:dapo`."""

import ml_collections

from configs import base
from configs.memagent_qwen2_5_7b import dapo, released


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = released(base.get_config(), "qwen2.5-14b-instruct", questions_per_step=256, mini_batch=16,
               fsdp=16, tensor=4)
  c.train.workdir = "runs/memagent_qwen2_5_14b" + (f"_{variant}" if variant else "")
  if variant == "dapo":
    return dapo(c)
  if variant:
    raise ValueError(f"unknown variant {variant!r} of memagent_qwen2_5_14b; choose '' or 'dapo'")
  return c
