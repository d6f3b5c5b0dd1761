"""Config sections -> the typed, self-checking specs the library takes.

The only place (with cli.py) that reads a training config: below experiment/, code sees
frozen dataclasses (`TrainSpec`, `OptimSpec`, `RolloutSpec`, `TeacherSpec`, `UpdateSpec`,
`ReaderSpec`, `MeshSpec`, `DistributedSpec`), never a ConfigDict.
"""

from __future__ import annotations

from memagent_jax.agent.memagent import ReaderSpec
from memagent_jax.rl.optim import OptimSpec
from memagent_jax.rl.rollout import OverlongSpec, RolloutSpec
from memagent_jax.rl.teacher_rows import TeacherSpec
from memagent_jax.rl.trainer import TrainSpec
from memagent_jax.rl.update import UpdateSpec
from memagent_jax.runtime.distributed import DistributedSpec
from memagent_jax.runtime.parallel import MeshSpec


def optim_spec(cfg) -> OptimSpec:
  """`optim`, with the schedule's length from train.steps."""
  o = cfg.optim
  return OptimSpec(lr=o.lr, schedule=o.schedule, warmup_steps=o.warmup_steps, min_lr_ratio=o.min_lr_ratio,
                   total_steps=cfg.train.steps, weight_decay=o.weight_decay, grad_clip=o.grad_clip or 0.0,
                   b1=o.b1, b2=o.b2, eps=o.eps)


def reader_spec(agent_cfg, *, training: bool) -> ReaderSpec:
  """A MemAgent's reading from `agent` (a config's agent section): centre truncation to max_chunks applies
  to training rollouts only (evaluation reads whole documents)."""
  a = agent_cfg
  return ReaderSpec(chunk_tokens=a.chunk_tokens, memory_tokens=a.memory_tokens, answer_tokens=a.answer_tokens,
                    question_tokens=a.question_tokens, final_template=a.final_template, block_chunks=a.block_chunks,
                    max_chunks=(a.max_chunks or None) if training else None,
                    template_prefix_cache=a.template_prefix_cache, memory=a.memory, gate_forms=a.gate_forms,
                    invalid_gate=a.invalid_gate, decode_buckets=a.decode_buckets)


def rollout_spec(cfg) -> RolloutSpec:
  """`rl`'s sampling, reward, advantage and dynamic-sampling keys."""
  r = cfg.rl
  ov = r.overlong
  return RolloutSpec(group_size=r.group_size, questions_per_step=r.questions_per_step,
                     rollout_batch=r.rollout_batch, temperature=r.temperature, top_p=r.top_p, reward=r.reward,
                     advantage=r.advantage, eps=r.eps, dynamic_sampling=bool(r.dynamic_sampling),
                     max_extra_gen_batches=r.max_extra_gen_batches, on_insufficient=r.on_insufficient,
                     dynamic_sampling_filter=r.dynamic_sampling_filter,
                     mask_truncated=bool(r.mask_truncated),
                     overlong=OverlongSpec(max_tokens=ov.max_tokens, cache_tokens=ov.cache_tokens) if ov.enable else None,
                     gate_weights=tuple(sorted(dict(r.gate_rewards).items())), advantage_mode=r.advantage_mode,
                     turn_advantage_weight=r.turn_advantage_weight)


def teacher_spec(cfg) -> TeacherSpec:
  """`teacher`: a registered teacher and its options."""
  t = cfg.teacher
  return TeacherSpec(name=t.name, options=tuple(sorted(dict(t.options).items())), prompt_loss=bool(t.prompt_loss))


def update_spec(cfg, *, loss_from: int) -> UpdateSpec:
  """`rl`'s loss keys and `model`'s remat and dtype; the loss reads token columns from `loss_from` on."""
  r = cfg.rl
  return UpdateSpec(prompt_width=loss_from, loss=r.loss, agg=r.agg, clip_low=r.clip_low, clip_high=r.clip_high,
                    clip_c=r.clip_c if r.clip_c else None, kl_coef=r.kl_coef, kl_kind=r.kl_kind,
                    entropy_coef=r.entropy_coef, remat=cfg.model.remat, temperature=r.temperature,
                    compute_dtype=cfg.model.dtype)


def train_spec(cfg) -> TrainSpec:
  """`train`, with the update batching of `rl`, eval.every, and the model's dtype, layout and source."""
  t, r = cfg.train, cfg.rl
  return TrainSpec(steps=t.steps, ppo_mini_batch=r.ppo_mini_batch, micro_batches=r.micro_batches,
                   recompute_old_logprobs=bool(r.recompute_old_logprobs), seed=t.seed, save_every=t.save_every,
                   keep_checkpoints=t.keep_checkpoints, async_checkpoint=bool(t.async_checkpoint),
                   log_every=t.log_every, max_nan_steps=t.max_nan_steps, progress=bool(t.progress),
                   eval_every=cfg.eval.every, rollout_dtype=cfg.model.dtype, rollout_layout=cfg.mesh.rollout,
                   model_source=cfg.model.source)


def mesh_spec(cfg) -> MeshSpec:
  """`mesh`: axis sizes, extra axis rules, the rollout weight layout."""
  m = cfg.mesh
  return MeshSpec(data=m.data, fsdp=m.fsdp, tensor=m.tensor,
                  rules=tuple((str(name), None if target is None else target if isinstance(target, str)
                               else tuple(target)) for name, target in m.rules),
                  rollout=m.rollout)


def distributed_spec(cfg) -> DistributedSpec:
  """`distributed`: 0 / "" / -1 mean "from the JAX_* environment variables" (or the detected cluster)."""
  d = cfg.distributed
  return DistributedSpec(num_processes=d.num_processes or None, coordinator_address=d.coordinator_address or None,
                         process_id=d.process_id if d.process_id >= 0 else None, cluster=d.cluster)
