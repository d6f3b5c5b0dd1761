"""Up-front validation of a training config: every bad combination fails before any work,
with a message naming the field and the limit."""

from __future__ import annotations


def _fail(msg: str):
  raise ValueError(f"config: {msg}")


def validate_config(cfg):
  """Raises ValueError for settings that cannot work together (model-dependent checks, such as
  the context budget, happen when the agent is built)."""
  from memagent_jax.rl import advantages, losses, rollout
  from memagent_jax.rl.optim import SCHEDULES
  rl = cfg.rl
  for name in ("group_size", "questions_per_step", "ppo_mini_batch", "micro_batches", "rollout_batch"):
    if int(rl[name]) < 1:
      _fail(f"rl.{name}={rl[name]} must be >= 1")
  if rl.advantage not in advantages.ADVANTAGES:
    _fail(f"rl.advantage={rl.advantage!r}; known: {sorted(advantages.ADVANTAGES)}")
  t = cfg.train
  if t.source not in ("rollout", "teacher"):
    _fail(f"train.source={t.source!r}; choose 'rollout' (RL) or 'teacher' (supervised)")
  if (t.source == "teacher") != (rl.loss == "sft"):
    _fail(f"train.source={t.source!r} with rl.loss={rl.loss!r}: teacher rows train with the 'sft' loss "
          "and only they do (a policy-gradient loss needs rollouts and rewards)")
  if cfg.agent.kind not in ("memagent", "direct"):
    _fail(f"agent.kind={cfg.agent.kind!r}; choose 'memagent' or 'direct'")
  if cfg.agent.kind == "direct" and t.source != "teacher":
    _fail("agent.kind='direct' (the full-attention baseline) trains only supervised: set train.source='teacher'")
  if t.source == "teacher":
    from memagent_jax.data.toy_teacher import TEACHERS
    if cfg.teacher.name not in TEACHERS:
      _fail(f"teacher.name={cfg.teacher.name!r}; known: {sorted(TEACHERS)}")
  if rl.advantage == "grpo" and rl.group_size < 2 and t.source == "rollout":
    _fail(f"rl.advantage='grpo' divides by the group's std, which needs rl.group_size >= 2 "
          f"(got {rl.group_size}); use rl.advantage='mean_centred' or a larger group")
  if rl.questions_per_step % rl.ppo_mini_batch:
    _fail(f"rl.questions_per_step={rl.questions_per_step} is not a multiple of rl.ppo_mini_batch="
          f"{rl.ppo_mini_batch}")
  if rl.rollout_batch % rl.group_size:
    _fail(f"rl.rollout_batch={rl.rollout_batch} must be a multiple of rl.group_size={rl.group_size}")
  if rl.loss not in losses.POLICY_LOSSES:
    _fail(f"rl.loss={rl.loss!r}; known: {sorted(losses.POLICY_LOSSES)}")
  if rl.agg not in losses.AGG_MODES:
    _fail(f"rl.agg={rl.agg!r}; known: {list(losses.AGG_MODES)}")
  if rl.kl_coef and rl.kl_kind not in losses.KL_KINDS + tuple(losses.KL_ALIASES):
    _fail(f"rl.kl_kind={rl.kl_kind!r}; known: {list(losses.KL_KINDS) + list(losses.KL_ALIASES)}")
  if rl.temperature != 1.0 and not rl.recompute_old_logprobs:
    _fail(f"rl.temperature={rl.temperature} needs rl.recompute_old_logprobs=True: the sampler reports "
          "temperature-1 log-probs, not those of the distribution that sampled")
  if rl.advantage == "grpo" and rl.eps <= 0:
    _fail(f"rl.eps={rl.eps} must be > 0 with rl.advantage='grpo' (it guards the division by the std)")
  if not 0 <= rl.clip_low < 1:
    _fail(f"rl.clip_low={rl.clip_low} must be in [0, 1)")
  if rl.clip_c and rl.clip_c <= 1:
    _fail(f"rl.clip_c={rl.clip_c} must be > 1 (or 0 to disable the dual clip)")
  if rl.clip_low < 0 or rl.clip_high < 0:
    _fail(f"rl.clip_low/clip_high must be >= 0; got {rl.clip_low}/{rl.clip_high}")
  if rl.reward not in rollout.REWARD_FNS:
    _fail(f"rl.reward={rl.reward!r}; known: {sorted(rollout.REWARD_FNS)}")
  if rl.on_insufficient not in ("fail", "proceed"):
    _fail(f"rl.on_insufficient={rl.on_insufficient!r}; choose 'fail' or 'proceed'")
  if rl.max_extra_gen_batches < 0:
    _fail(f"rl.max_extra_gen_batches={rl.max_extra_gen_batches} must be >= 0")
  if rl.overlong.enable and not 0 < rl.overlong.cache_tokens <= rl.overlong.max_tokens:
    _fail(f"rl.overlong needs 0 < cache_tokens <= max_tokens; got {rl.overlong.cache_tokens}, "
          f"{rl.overlong.max_tokens}")
  if rl.overlong.enable and rl.overlong.max_tokens > cfg.agent.answer_tokens:
    _fail(f"rl.overlong.max_tokens={rl.overlong.max_tokens} exceeds agent.answer_tokens="
          f"{cfg.agent.answer_tokens}: no answer can be that long, so the penalty could never reach -1")
  if not 0 < rl.top_p <= 1 or rl.temperature <= 0:
    _fail(f"rollouts need rl.temperature > 0 and 0 < rl.top_p <= 1; got {rl.temperature}, {rl.top_p}")
  o = cfg.optim
  if o.schedule not in SCHEDULES:
    _fail(f"optim.schedule={o.schedule!r}; choose one of {SCHEDULES}")
  if o.lr <= 0:
    _fail(f"optim.lr={o.lr} must be > 0")
  for name in ("steps", "save_every", "keep_checkpoints", "log_every", "max_nan_steps"):
    if int(t[name]) < 1:
      _fail(f"train.{name}={t[name]} must be >= 1")
  if cfg.eval.every < 0 or (cfg.eval.every and cfg.eval.size < 1):
    _fail(f"eval.every={cfg.eval.every} needs eval.size >= 1 (got {cfg.eval.size})")
  if cfg.data.train_size < rl.questions_per_step:
    _fail(f"data.train_size={cfg.data.train_size} is smaller than one step's rl.questions_per_step="
          f"{rl.questions_per_step}")
