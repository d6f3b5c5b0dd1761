"""The Multi-Conv DAPO training loop: rollouts -> rewards -> advantages -> jitted updates, with
checkpoint/resume, periodic held-out evaluation, metrics and a progress bar.

A step is deterministic given (params, optimizer state, step, PRNG key, data position), which
is exactly what a checkpoint holds, so a resumed run continues bit for bit.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from memagent_jax import parallel
from memagent_jax.rl import update as upd
from memagent_jax.rl.batching import mini_batches
from memagent_jax.rl.config_checks import validate_config
from memagent_jax.rl.metrics import MetricWriter
from memagent_jax.rl.optim import lr_at, make_optimizer, set_learning_rate
from memagent_jax.rl.rollout import RolloutCollector
from memagent_jax.rl.teacher_rows import TeacherCollector
from memagent_jax.rl.train_state import (NonFiniteStateError, TrainState, check_finite,  # noqa: F401
                                         restore_or_init, save_state)


def enable_compilation_cache(directory: str):
  """Every compiled program (however quick to compile) goes to the persistent cache in directory."""
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.abspath(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class NonFiniteLossError(FloatingPointError):
  """Too many consecutive optimizer updates had a NaN/inf loss or gradient."""


def build_agent(cfg, policy, training: bool = True, mesh=None):
  """The agent of the config; centre truncation to agent.max_chunks applies to training
  rollouts only, evaluation always reads whole documents. agent.kind "direct" is the
  full-attention baseline (whole document in one prompt, up to agent.context_tokens). With a
  mesh, the MemAgent's rows split over its ("data", "fsdp") axes and over processes."""
  import memagent_jax as mj
  a = cfg.agent
  if a.kind == "direct":
    return mj.DirectReader(policy, answer_tokens=a.answer_tokens, question_tokens=a.question_tokens,
                           truncate=not training, context_tokens=a.context_tokens or None)
  return mj.MemAgent(policy, chunk_tokens=a.chunk_tokens, memory_tokens=a.memory_tokens,
                     answer_tokens=a.answer_tokens, question_tokens=a.question_tokens,
                     final_template=a.final_template, block_chunks=a.block_chunks,
                     max_chunks=(a.max_chunks or None) if training else None, mesh=mesh)


def row_widths(agent, question_tokens: int, document_tokens: int = 0) -> tuple[int, int]:
  """Static (prompt width P, response width N) covering every conversation of the config
  (a direct reader's prompt holds the whole training document of `document_tokens`)."""
  if not hasattr(agent, "check_budget"):  # DirectReader
    return agent.segments.fixed_tokens + question_tokens + document_tokens, agent.answer_tokens
  agent.check_budget(question_tokens)  # ContextBudgetError naming every part if it cannot fit
  return max(agent.prompt_tokens(question_tokens).values()), max(agent.memory_tokens, agent.answer_tokens)


def make_pool(task: str, size: int, seed: int, length: int, tokenizer, data_dir: str) -> list[dict]:
  from memagent_jax import evaluation
  return evaluation.make_samples(task, length, size, seed, tokenizer, data_dir or None)


def check_held_out(train: list[dict], held_out: list[dict], task: str):
  """Evaluation questions must not be training questions (QA corpora: pass the dev file as
  eval.data_dir); synthetic tasks draw fresh samples from another seed."""
  seen = {(s["question"], tuple(s["answers"])) for s in train}
  overlap = sum((s["question"], tuple(s["answers"])) in seen for s in held_out)
  if overlap and task in ("squad", "hotpotqa"):
    raise ValueError(f"{overlap} of the {len(held_out)} evaluation questions of {task!r} are also training "
                     "questions: set eval.data_dir to the held-out (dev) file and data.data_dir to the train file")


class Trainer:
  """Owns the policy, agent, optimizer, mesh, data iterator and checkpoints of one run."""

  def __init__(self, cfg, workdir: str | None = None):
    from memagent_jax.data import pipeline
    validate_config(cfg)
    self.cfg = cfg
    self.workdir = workdir or cfg.train.workdir
    d = cfg.distributed  # 0 / "" / -1 mean "from the JAX_* environment variables"
    parallel.initialize_distributed({"num_processes": d.num_processes or None,
                                     "coordinator_address": d.coordinator_address or None,
                                     "process_id": d.process_id if d.process_id >= 0 else None})
    if cfg.train.compilation_cache_dir:
      enable_compilation_cache(cfg.train.compilation_cache_dir)
    self.mesh = parallel.make_mesh(cfg.mesh)
    self.rules = parallel.axis_rules([tuple(r) for r in cfg.mesh.rules] or None)
    import memagent_jax as mj
    self.policy = mj.load_policy(cfg.model.source, dtype=cfg.model.dtype, seed=cfg.model.seed,
                                 attention=cfg.model.attention)
    self.agent = build_agent(cfg, self.policy, mesh=self.mesh)  # rollouts: rows over data x fsdp
    self.prompt_width, self.response_width = row_widths(self.agent, cfg.agent.question_tokens, cfg.data.length)
    self.loss_from = self.prompt_width  # the column the loss starts from
    if cfg.train.source == "teacher" and cfg.teacher.prompt_loss:
      self.loss_from = 1  # language-model loss on whole conversations (teacher_rows.language_model_rows)
    self.spec = upd.UpdateSpec.from_config(cfg.rl, self.loss_from, cfg.model.remat, cfg.model.dtype)
    self.updates_per_step = cfg.rl.questions_per_step // cfg.rl.ppo_mini_batch
    self.tx = make_optimizer(cfg.optim, cfg.train.steps)
    self.row_multiple = cfg.rl.micro_batches * parallel.batch_shards(self.mesh)
    if cfg.train.source == "teacher":  # supervised warm start / baseline: teacher-forced rows, loss "sft"
      self.collector = TeacherCollector(self.agent, cfg.teacher, self.prompt_width, self.response_width)
    else:
      self.collector = RolloutCollector(self.agent, cfg.rl, self.prompt_width, self.response_width)
    tok = self.agent.tokenizer
    pool = make_pool(cfg.data.task, cfg.data.train_size, cfg.data.seed, cfg.data.length, tok, cfg.data.data_dir)
    self.batches = pipeline.make_iterator(pool, cfg.rl.questions_per_step, seed=cfg.data.seed,
                                          num_epochs=None, drop_remainder=True)
    self.eval_pool, self.eval_agent = [], None
    if cfg.eval.every:
      self.eval_pool = make_pool(cfg.data.task, cfg.eval.size, cfg.eval.seed, cfg.eval.length or cfg.data.length,
                                 tok, cfg.eval.data_dir or cfg.data.data_dir)
      check_held_out(pool, self.eval_pool, cfg.data.task)
      # multi-process params span hosts, so evaluation runs on the mesh too (each process reads the
      # whole held-out set: duplicated work, same scores); one process keeps any batch size
      self.eval_agent = build_agent(cfg, self.policy, training=False,
                                    mesh=self.mesh if jax.process_count() > 1 else None)
    self.is_chief = jax.process_index() == 0
    self.writer = MetricWriter(os.path.join(self.workdir, "logs"), enabled=self.is_chief)
    self.state, self.checkpointer = restore_or_init(self)
    self._sync_policy()
    self._nan_run = 0

  # ----- one step ------------------------------------------------------------------------------
  def _seed(self, gen: int, sub: int) -> int:
    key = jax.random.fold_in(jax.random.fold_in(self.state.rng, self.state.step), gen * 4096 + sub)
    return int(jax.random.randint(key, (), 0, 2 ** 31 - 1))

  def _device_batch(self, arrays: dict) -> dict:
    return {k: parallel.shard_micro_batches(v, self.mesh) for k, v in arrays.items()}

  def train_step(self) -> dict[str, float]:
    """Rollouts, then `updates_per_step` optimizer updates; returns the step's metrics."""
    cfg, st = self.cfg, self.state
    t0 = time.perf_counter()
    roll = self.collector.collect(self.batches, self._seed)
    metrics = dict(roll.metrics)
    t1 = time.perf_counter()
    if roll.rows is None:  # dynamic sampling proceeded with nothing to learn from
      metrics.update(updates=0, step_seconds=time.perf_counter() - t0)
      return metrics
    parts = mini_batches(roll.rows, roll.num_questions, cfg.rl.ppo_mini_batch, self.row_multiple,
                         self.agent.pad_id)
    batches = []
    gd = self.policy.graphdef
    tokens = int(sum(part.valid.sum() for part in parts))  # real tokens the updates process
    for part in parts:  # old / reference log-probs: all from the params that sampled
      arrays = upd.split_micro(part.arrays(), cfg.rl.micro_batches)
      dev = self._device_batch(arrays)
      kw = dict(prompt_width=self.loss_from, temperature=self.spec.temperature,
                compute_dtype=self.spec.compute_dtype)
      if cfg.rl.recompute_old_logprobs and cfg.rl.loss != "sft":  # sft reads no old log-probs
        dev["old_logp"] = upd.batch_logprobs(gd, st.params, dev["tokens"], dev["valid"], **kw)
      if cfg.rl.kl_coef:
        dev["ref_logp"] = upd.batch_logprobs(gd, st.ref_params, dev["tokens"], dev["valid"], **kw)
      batches.append(dev)
    st.opt_state = set_learning_rate(st.opt_state, lr_at(cfg.optim, st.step, cfg.train.steps))
    update_metrics = []
    for dev in batches:
      st.params, st.opt_state, m = upd.update_step(gd, st.params, st.opt_state, dev, tx=self.tx,
                                                   spec=self.spec)
      update_metrics.append(m)
    update_metrics = jax.device_get(update_metrics)  # metrics are replicated scalars
    t2 = time.perf_counter()
    finite = [bool(m["finite"]) for m in update_metrics]
    for ok, m in zip(finite, update_metrics):
      self._nan_run = 0 if ok else self._nan_run + 1
      if self._nan_run >= cfg.train.max_nan_steps:
        raise NonFiniteLossError(
            f"step {st.step + 1}: {self._nan_run} consecutive updates had a non-finite loss or gradient "
            f"(last: loss={float(m['loss'])}, grad_norm={float(m['grad_norm'])}); stopping without saving "
            f"this step (train.max_nan_steps={cfg.train.max_nan_steps}). Lower optim.lr or check the data.")
    # a NaN/inf learning rate (or an overflowing update) leaves loss and gradients finite
    check_finite(self, st.step + 1)
    good = [m for m in update_metrics if bool(m["finite"])] or update_metrics
    for k in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "dual_clip_frac", "approx_kl_old", "grad_norm"):
      metrics[k] = float(np.mean([m[k] for m in good]))
    metrics.update(updates=len(parts), skipped_updates=finite.count(False), nan_run=self._nan_run,
                   update_tokens_per_s=tokens / max(t2 - t1, 1e-9),
                   rollout_tokens_per_s=metrics["rollout_tokens"] / max(t1 - t0, 1e-9),
                   update_seconds=t2 - t1, step_seconds=t2 - t0)
    self._sync_policy()
    return metrics

  def _sync_policy(self):
    """Rollouts run the current params in the model's dtype (bf16 on accelerators)."""
    self.policy.state = upd.cast_params(self.state.params, self.cfg.model.dtype)

  # ----- evaluation ----------------------------------------------------------------------------
  def evaluate(self) -> dict[str, float]:
    """Accuracy of the current policy on the held-out split (released validation sampling)."""
    from memagent_jax import evaluation
    e = self.cfg.eval
    summary = evaluation.run_eval(self.eval_agent, self.cfg.data.task, self.eval_pool, None, e.batch_size,
                                  e.temperature, e.top_p, seed=e.seed, progress=False)
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and k != "n"}

  # ----- the loop ------------------------------------------------------------------------------
  def train(self) -> dict:
    """Runs until train.steps; saves every train.save_every steps and at the end."""
    cfg, st = self.cfg, self.state
    history = []
    bar = tqdm(total=cfg.train.steps, initial=st.step, desc="train", unit="step",
               disable=not (cfg.train.progress and self.is_chief))
    try:
      while st.step < cfg.train.steps:
        metrics = self.train_step()
        st.step += 1
        metrics["lr"] = float(self._lr())
        if st.step % cfg.train.log_every == 0 or st.step == cfg.train.steps:
          self.writer.write(st.step, metrics, prefix="train/")
        if cfg.eval.every and (st.step % cfg.eval.every == 0 or st.step == cfg.train.steps):
          ev = self.evaluate()
          self.writer.write(st.step, ev, prefix="eval/")
          metrics.update({f"eval_{k}": v for k, v in ev.items()})
        if st.step % cfg.train.save_every == 0 or st.step == cfg.train.steps:
          save_state(self)
        history.append({"step": st.step, **metrics})
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", kept=f"{metrics['kept_group_frac']:.2f}",
                        loss=f"{metrics.get('loss', float('nan')):.3g}")
    finally:
      bar.close()
      self.checkpointer.wait()
      self.writer.close()
    return {"history": history, "step": st.step}

  def _lr(self):
    """The learning rate of the step just taken."""
    return lr_at(self.cfg.optim, self.state.step - 1, self.cfg.train.steps)
