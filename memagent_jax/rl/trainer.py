"""The Multi-Conv DAPO training loop: rollouts -> rewards -> advantages -> jitted updates, with
checkpoint/resume, periodic held-out evaluation, metrics and a progress bar.

A step is deterministic given (params, optimizer state, step, PRNG key, data position), which
is exactly what a checkpoint holds, so a resumed run continues bit for bit. A run holds its workdir
(runtime/workdir_lock.py); SIGTERM / SIGINT stop it after the step in flight, saved
(runtime/preemption.py).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from memagent_jax.runtime import parallel
from memagent_jax.runtime.device_clock import DeviceClock
from memagent_jax.runtime.preemption import Preempted, StopSignals
from memagent_jax.runtime.workdir_lock import WorkdirLock
from memagent_jax.rl import update as upd
from memagent_jax.rl.device_rows import MiniBatchPlan, SlotRows
from memagent_jax.rl.metrics import MetricWriter, device_memory, host_rss_bytes
from memagent_jax.rl.optim import OptimSpec, lr_at, make_optimizer, set_learning_rate
from memagent_jax.rl.rollout import RolloutMetrics
from memagent_jax.rl.train_state import (NonFiniteStateError, StateSpec, check_finite,  # noqa: F401
                                         model_meta, restore_or_init, save_state)


class NonFiniteLossError(FloatingPointError):
  """Too many consecutive optimizer updates had a NaN/inf loss or gradient."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepPrograms:
  """What a step runs: the jitted log-prob pass and update (rl/update.py). A caller may pass wrapped
  ones to observe or fault a step."""
  batch_logprobs: Callable = upd.batch_logprobs
  update_step: Callable = upd.update_step


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSpec:
  """The loop's settings: length, batching of updates, checkpoints, logging; checks itself."""
  steps: int
  ppo_mini_batch: int  # questions per optimizer update
  micro_batches: int = 1  # gradient accumulation per update
  recompute_old_logprobs: bool = True  # old log-probs from the training forward (as verl), not the sampler
  seed: int = 0
  save_every: int = 10
  keep_checkpoints: int = 3
  async_checkpoint: bool = True
  log_every: int = 1
  max_nan_steps: int = 3  # consecutive non-finite updates before training stops
  progress: bool = True
  eval_every: int = 0  # 0: no held-out evaluation
  rollout_dtype: str = "float32"  # the dtype rollouts decode in (the model's)
  rollout_layout: str = "train"  # parallel.ROLLOUT_LAYOUTS
  model_source: str = ""  # recorded in checkpoints, so a resume checks it loads the same model

  def __post_init__(self):
    for name in ("steps", "ppo_mini_batch", "micro_batches", "save_every", "keep_checkpoints", "log_every",
                 "max_nan_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"TrainSpec.{name}={getattr(self, name)} must be >= 1")
    if self.eval_every < 0 or self.seed < 0:
      raise ValueError(f"TrainSpec.eval_every={self.eval_every} and seed={self.seed} must be >= 0")
    if self.rollout_layout not in parallel.ROLLOUT_LAYOUTS:
      raise ValueError(f"TrainSpec.rollout_layout={self.rollout_layout!r}; choose one of {parallel.ROLLOUT_LAYOUTS}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MiniBatchCalls:
  """What one mini-batch runs: per width group the gather and its log-prob passes, then one update
  over every group. `plan_updates` makes these; `memagent compile` compiles exactly them."""
  groups: tuple[MiniBatchPlan, ...]
  recompute_old: bool  # old log-probs from a forward pass on the current params (each group)
  reference: bool  # reference log-probs (each group; rl.kl_coef > 0)
  update: upd.UpdateSpec  # old_is_current on a step's first mini-batch

  def logprob_spec(self, prompt_width: int) -> upd.LogprobSpec:
    """The log-prob pass of a group whose loss starts at `prompt_width` (its UpdateBatch's)."""
    u = self.update
    return upd.LogprobSpec(prompt_width=prompt_width, temperature=u.temperature, compute_dtype=u.compute_dtype,
                           logits_chunk=u.logits_chunk)


def plan_updates(rows: SlotRows, *, num_questions: int, spec: TrainSpec, update: upd.UpdateSpec,
                 multiple: int) -> list[MiniBatchCalls]:
  """A step's kept rows -> its mini-batches as width groups (rows bucketed to `multiple` = micro-batches x
  row shards) and the programs each runs. Host only: the trainer and `memagent compile` both ask it."""
  plans = rows.mini_batches(num_questions=num_questions, questions_per_mini_batch=spec.ppo_mini_batch,
                            multiple=multiple)
  recompute = spec.recompute_old_logprobs and update.loss != "sft"  # sft reads no old log-probs
  # the first update runs on the params that sampled: its own forward pass gives the old log-probs
  return [MiniBatchCalls(groups=groups, recompute_old=recompute and i > 0, reference=bool(update.kl_coef),
                         update=dataclasses.replace(update, old_is_current=recompute and i == 0))
          for i, groups in enumerate(plans)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepMetrics:
  """What one training step reports; `scalars()` are the names it is logged under (train/...)."""
  step: int  # the step these metrics are of (1 for the first)
  lr: float
  rollout: RolloutMetrics
  update: upd.UpdateMetrics | None = None  # means over the step's finite updates; None: no update ran
  updates: int = 0  # optimizer updates (mini-batches)
  skipped_updates: int = 0  # updates with a non-finite loss or gradient, not applied
  nan_run: int = 0  # consecutive non-finite updates so far
  prefix_shared_frac: float = 0.0  # width groups whose shared template prefix ran once
  width_groups: float = 0.0  # width groups per update
  update_tokens_per_s: float = 0.0
  rollout_tokens_per_s: float = 0.0
  update_seconds: float = 0.0
  step_seconds: float = 0.0
  host_seconds: float = 0.0  # step time outside the device sections (perf/host_s)
  host_rss_bytes: int = 0
  device_bytes: int = 0  # bytes of the jax arrays alive after the step (perf/device_bytes)
  live_arrays: int = 0
  eval: dict[str, float] | None = None  # the held-out scores, on steps that evaluated

  def scalars(self) -> dict[str, float]:
    """Flat {name: number}: metrics.jsonl's and TensorBoard's names (the held-out scores go under eval/)."""
    out = dict(self.rollout.scalars(), lr=self.lr, updates=self.updates, step_seconds=self.step_seconds,
               **{"perf/host_s": self.host_seconds})
    if self.update is not None:
      out.update({name: getattr(self.update, name) for name in upd.UpdateMetrics.mean_names()},
                 skipped_updates=self.skipped_updates, nan_run=self.nan_run,
                 prefix_shared_frac=self.prefix_shared_frac, width_groups=self.width_groups,
                 update_tokens_per_s=self.update_tokens_per_s, rollout_tokens_per_s=self.rollout_tokens_per_s,
                 update_seconds=self.update_seconds)
    if self.host_rss_bytes:
      out.update({"perf/host_rss_bytes": self.host_rss_bytes, "perf/device_bytes": self.device_bytes,
                  "perf/live_arrays": self.live_arrays})
    return out


@dataclasses.dataclass(kw_only=True)
class TrainResult:
  """What `Trainer.train` (and `train_phases`) return."""
  step: int  # the step reached
  history: list[StepMetrics]  # the last steps' metrics (every step's are in metrics.jsonl)
  trainer: "Trainer | None" = None  # train_phases: the last phase's trainer


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunParts:
  """The built pieces a Trainer drives (`memagent_jax.experiment.build_experiment` makes them)."""
  policy: Any  # policy.Policy: the model rollouts sample from (its state is replaced after every step)
  collector: Any  # rollout.RolloutCollector or teacher_rows.TeacherCollector
  batches: Any  # grain iterator of data.tasks.QuestionBatch, with get_state / set_state
  mesh: Any  # jax.sharding.Mesh
  rules: tuple  # logical axis -> mesh axis rules (runtime/parallel.py)
  evaluate: Callable[[], dict[str, float]] | None = None  # held-out scores of the current policy
  shared_prefix: Any = None  # [L] ids most rows start with, run once per update batch where it fits
  config_json: str = ""  # the run's configuration, kept in every checkpoint


class Trainer:
  """Owns the policy, agent, optimizer, mesh, data iterator and checkpoints of one run."""

  def __init__(self, spec: TrainSpec, parts: RunParts, *, update: upd.UpdateSpec, optim: OptimSpec, workdir: str,
               programs: StepPrograms = StepPrograms()):
    """`update.prompt_width` is the first token column the loss reads; `programs`: what a step runs."""
    self.programs = programs
    if optim.total_steps != spec.steps:
      raise ValueError(f"OptimSpec.total_steps={optim.total_steps} must equal TrainSpec.steps={spec.steps}")
    self.spec, self.update_spec, self.optim = spec, update, optim
    self.workdir, self.mesh, self.rules, self.config_json = workdir, parts.mesh, parts.rules, parts.config_json
    mesh, policy = parts.mesh, parts.policy
    self.policy, self.collector, self.batches = policy, parts.collector, parts.batches
    self.loss_from = update.prompt_width
    self._evaluate = parts.evaluate
    self.tx = make_optimizer(optim)
    self.row_multiple = spec.micro_batches * parallel.batch_shards(mesh)
    self.is_chief = jax.process_index() == 0
    self.lock = WorkdirLock(workdir).acquire()  # before anything in the workdir is read or written
    self.writer = MetricWriter(os.path.join(workdir, "logs"), enabled=self.is_chief)
    self.state, self.checkpointer = restore_or_init(
        StateSpec(seed=spec.seed, with_reference=bool(update.kl_coef), keep=spec.keep_checkpoints,
                  async_save=spec.async_checkpoint, model_source=spec.model_source),
        workdir=workdir, policy=policy, mesh=mesh, rules=parts.rules, tx=self.tx, batches=parts.batches)
    # programs are traced on the mesh: a splash attention kernel runs per shard (models/attention.py)
    self._trace_mesh = lambda: parallel.trace_mesh(mesh)
    # rollouts decode with their own weight layout (mesh.rollout), re-sharded once per step
    layout_rules = parallel.rollout_rules(parts.rules, spec.rollout_layout)
    self.rollout_shardings = (None if spec.rollout_layout == "train" else
                              parallel.param_shardings(policy.state, mesh, layout_rules))
    self._sync_policy()
    self._nan_run = 0
    self.clock = DeviceClock()  # seconds dispatching and waiting for the update's programs (perf/host_s)
    self._shared_prefix_dev = None if parts.shared_prefix is None else jnp.asarray(parts.shared_prefix, jnp.int32)

  # ----- one step ------------------------------------------------------------------------------
  def _seed(self, gen: int, sub: int) -> int:
    key = jax.random.fold_in(jax.random.fold_in(self.state.rng, self.state.step), gen * 4096 + sub)
    return int(jax.random.randint(key, (), 0, 2 ** 31 - 1))

  def train_step(self) -> StepMetrics:
    """Rollouts, then `updates_per_step` optimizer updates; returns the step's metrics."""
    spec, st = self.spec, self.state
    device0 = self._device_seconds()
    t0 = time.perf_counter()
    # read before any of the step's programs is queued: the value comes back without waiting for them
    lr = lr_at(self.optim, st.step)
    roll = self.collector.collect(self.batches, self._seed)
    t1 = time.perf_counter()
    device_seconds = lambda: self._device_seconds() - device0
    if roll.rows is None:  # dynamic sampling proceeded with nothing to learn from
      wall = time.perf_counter() - t0
      return StepMetrics(step=st.step + 1, lr=lr, rollout=roll.metrics, step_seconds=wall,
                         host_seconds=wall - device_seconds())
    if roll.rows.prompt_width != self.loss_from:
      raise ValueError(f"the collector's rows start their loss at column {roll.rows.prompt_width}, the update "
                       f"at column {self.loss_from}")
    # each mini-batch as width groups: rows with short prompts (final answers) in a narrower group
    calls = plan_updates(roll.rows, num_questions=roll.num_questions, spec=spec, update=self.update_spec,
                         multiple=self.row_multiple)
    batches = []
    gd = self.policy.graphdef
    tokens = sum(group.real_tokens for call in calls for group in call.groups)  # real tokens the updates process
    prefixed = []
    for call in calls:  # old / reference log-probs: all from the params that sampled
      devs, prefixes = [], []
      for group in call.groups:
        with self.clock.section():  # the rows are gathered on device; whether the prefix fits comes back
          dev, fits = roll.rows.to_device(group, micro_batches=spec.micro_batches, mesh=self.mesh,
                                          prefix=self._shared_prefix_dev)
        prefix = self._shared_prefix_dev if fits else None
        prefixed.append(prefix is not None)
        kw = dict(graphdef=gd, prefix=prefix, spec=call.logprob_spec(dev.prompt_width))
        with self._trace_mesh(), self.clock.section():
          if call.recompute_old:
            dev = dev.replace(old_logp=self.programs.batch_logprobs(st.params, dev.tokens, dev.valid, **kw))
          if call.reference:
            dev = dev.replace(ref_logp=self.programs.batch_logprobs(st.ref_params, dev.tokens, dev.valid, **kw))
        devs.append(dev), prefixes.append(prefix)
      batches.append((tuple(devs), call.update, tuple(prefixes)))
    st.opt_state = set_learning_rate(st.opt_state, lr)
    update_metrics = []
    with self.clock.section():
      for dev, update_spec, prefix in batches:
        with self._trace_mesh():
          st.params, st.opt_state, m = self.programs.update_step(st.params, st.opt_state, dev, graphdef=gd,
                                                                 tx=self.tx, spec=update_spec, prefix=prefix)
        update_metrics.append(m)
      update_metrics = jax.device_get(update_metrics)  # metrics are replicated scalars: waits for the updates
    t2 = time.perf_counter()
    finite = [bool(m.finite) for m in update_metrics]
    for ok, m in zip(finite, update_metrics):
      self._nan_run = 0 if ok else self._nan_run + 1
      if self._nan_run >= spec.max_nan_steps:
        raise NonFiniteLossError(
            f"step {st.step + 1}: {self._nan_run} consecutive updates had a non-finite loss or gradient "
            f"(last: loss={float(m.loss)}, grad_norm={float(m.grad_norm)}); stopping without saving "
            f"this step (train.max_nan_steps={spec.max_nan_steps}). Lower optim.lr or check the data.")
    # a NaN/inf learning rate (or an overflowing update) leaves loss and gradients finite
    check_finite(st, self.mesh, st.step + 1)
    good = [m for m in update_metrics if bool(m.finite)] or update_metrics
    means = upd.UpdateMetrics(**{name: float(np.mean([getattr(m, name) for m in good]))
                                 for name in upd.UpdateMetrics.mean_names()},
                              tokens=float(sum(m.tokens for m in good)), finite=all(finite))
    with self.clock.section():
      self._sync_policy()  # dispatched here; the next rollout waits for it in its own device time
    wall = time.perf_counter() - t0
    return StepMetrics(step=st.step + 1, lr=lr, rollout=roll.metrics, update=means, updates=len(calls),
                       skipped_updates=finite.count(False), nan_run=self._nan_run,
                       prefix_shared_frac=float(np.mean(prefixed)), width_groups=len(prefixed) / len(calls),
                       update_tokens_per_s=tokens / max(t2 - t1, 1e-9),
                       rollout_tokens_per_s=roll.metrics.rollout_tokens / max(t1 - t0, 1e-9),
                       update_seconds=t2 - t1, step_seconds=wall, host_seconds=wall - device_seconds())

  def _device_seconds(self) -> float:
    """Seconds so far in device sections of this trainer and of its agent (a teacher's runs none)."""
    agent_clock = getattr(self.collector.agent, "device_clock", None)
    return self.clock.seconds + (agent_clock.seconds if agent_clock else 0.0)

  def _sync_policy(self):
    """Rollouts run the current params in the model's dtype (bf16 on accelerators), in the rollout
    weight layout. In float32 they may share the params' buffers: nothing reads them between the
    (donating) updates and this call."""
    state = upd.cast_params(self.state.params, self.spec.rollout_dtype)
    if self.rollout_shardings is not None:
      state = jax.device_put(state, self.rollout_shardings)
    self.policy.state = state

  # ----- evaluation ----------------------------------------------------------------------------
  def evaluate(self) -> dict[str, float]:
    """Accuracy of the current policy on the held-out split (released validation sampling)."""
    if self._evaluate is None:
      raise ValueError("this run has no held-out set: set eval.every > 0")
    return self._evaluate()

  # ----- the loop ------------------------------------------------------------------------------
  def train(self, until: int | None = None, keep_history: int = 1000) -> TrainResult:
    """Runs until step `until` (default train.steps: a data phase may stop earlier, see
    data/curriculum.py); saves every train.save_every steps and at the end. With eval.every, a fresh
    run evaluates its starting policy as step 0. SIGTERM / SIGINT (on any process) stop every
    process after the same step: it is saved, then `Preempted` is raised. The returned history holds
    the last `keep_history` steps' metrics (all of them are in metrics.jsonl): a long run's memory
    stays flat."""
    spec, st = self.spec, self.state
    until = spec.steps if until is None else min(until, spec.steps)
    history = collections.deque(maxlen=keep_history)
    self.lock.acquire()  # again, if an earlier train() released it
    stop = StopSignals().install()
    bar = tqdm(total=until, initial=st.step, desc="train", unit="step",
               disable=not (spec.progress and self.is_chief))
    try:
      if spec.eval_every and st.step == 0 and until > 0:  # the starting policy: "before" of every curve
        self._log(0, self.evaluate(), prefix="eval/")
      while not (signum := stop.agreed()) and st.step < until:  # a step runs whole or not at all
        metrics = self.train_step()
        st.step += 1
        device_bytes, live_arrays = device_memory()
        metrics = dataclasses.replace(metrics, host_rss_bytes=host_rss_bytes(), device_bytes=device_bytes,
                                      live_arrays=live_arrays)
        if st.step % spec.log_every == 0 or st.step == until:
          self._log(st.step, metrics.scalars(), prefix="train/")
        if spec.eval_every and (st.step % spec.eval_every == 0 or st.step == spec.steps):
          metrics = dataclasses.replace(metrics, eval=self.evaluate())
          self._log(st.step, metrics.eval, prefix="eval/")
        if st.step % spec.save_every == 0 or st.step == until:
          save_state(self.checkpointer, st, mesh=self.mesh, meta=self.checkpoint_meta())
        history.append(metrics)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics.rollout.reward_mean:.3f}", kept=f"{metrics.rollout.kept_group_frac:.2f}",
                        loss=loss_text(metrics))
      if signum:
        save_state(self.checkpointer, st, mesh=self.mesh, meta=self.checkpoint_meta())  # skipped if saved
        self.checkpointer.wait()
        raise Preempted(signum, st.step, str(self.checkpointer.directory))
    except BaseException:
      stop.restore()
      bar.close()
      self._let_go(failing=True)
      raise
    stop.restore()
    bar.close()
    self._let_go(failing=False)
    return TrainResult(step=st.step, history=list(history))

  def close(self):
    """Lets go of what building took (the workdir lock, the metric files) for a trainer that will not
    train: a finished phase of a curriculum. train() does the same when it ends."""
    self._let_go(failing=False)

  def _let_go(self, *, failing: bool):
    """Waits for the save in flight, closes the metric files and releases the workdir lock, each even
    when another fails. While an error is already on its way out (`failing`: a full disk's checkpoint
    error, which names the step kept) theirs are logged, not raised in its place; else the first is raised."""
    errors = []
    for let_go in (self.checkpointer.wait, self.writer.close, self.lock.release):
      try:
        let_go()
      except Exception as e:  # noqa: BLE001 - every step must run; the errors are raised or logged below
        errors.append(e)
    if errors and not failing:
      raise errors[0]
    for e in errors:
      logging.getLogger(__name__).warning("while stopping after an error: %s", e)

  def _log(self, step: int, metrics: dict, prefix: str):
    """Writes metrics; when that fails (a full disk) and the save in flight failed first, the save's
    error is the one raised: it says which step is lost and which one is kept."""
    try:
      self.writer.write(step, metrics, prefix=prefix)
    except OSError:
      self.checkpointer.wait()
      raise

  def checkpoint_meta(self) -> dict:
    """What a checkpoint carries beside the arrays: the model, the data position, the config."""
    return dict(model_meta(self.spec.model_source, self.policy), data_state=self.batches.get_state(),
                step=self.state.step, config=self.config_json)


def loss_text(metrics: StepMetrics) -> str:
  """The progress bar's loss: "none" on a step that made no update (no group kept), not a NaN that
  reads like a diverged run."""
  return "none" if metrics.update is None else f"{metrics.update.loss:.3g}"
