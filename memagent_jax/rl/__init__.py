"""Multi-Conv DAPO (layer 6; imports agent and below). The step, in file order:

  rollout        `RolloutCollector`: agent rollouts in groups, `REWARD_FNS`, dynamic sampling, overlong
  rewards        answer metrics (memagent_verifier, sub_em, exact_match, f1, string_match_*)
  advantages     `ADVANTAGES`: group-relative advantages (grpo, mean_centred)
  device_rows    fixed-width training rows and mini-batches, gathered on device from conversation slots
  losses         `POLICY_LOSSES` (ppo_clip, sft), KL penalties, aggregation modes
  update         the jitted update step; optim: optax optimizer and schedules
  trainer        `Trainer`: the loop; train_state: checkpoint/resume of its state
  teacher_rows   supervised rows from toy_teacher's `TEACHERS` (warm starts, baselines)
  metrics
"""
from memagent_jax.rl import advantages
from memagent_jax.rl import losses
from memagent_jax.rl import rewards
