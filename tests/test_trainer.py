"""The training loop, in-process: metrics, bad configs, NaN stopping, knobs, resume from a damaged
checkpoint, and a signal mid-step raising `Preempted`. Stopped and resumed CLI runs (SIGKILL, SIGTERM, a
full disk, two processes): test_save_faults.py."""

import dataclasses
import json
import logging
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # the viewer's reader

from configs import toy_cpu
from memagent_jax.runtime import checkpointing
from memagent_jax.experiment import assembly
from memagent_jax.rl import rollout
from memagent_jax.rl import trainer as trainer_lib
from memagent_jax.runtime.preemption import Preempted


def tiny(**overrides):
  c = toy_cpu.get_config("tiny")
  for key, value in overrides.items():
    node = c
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    with node.ignore_type():  # the type-safe ConfigDict refuses e.g. 1.5 for an int field
      node[leaf] = value
  return c


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _trained(workdir, steps: int) -> dict:
  """The tiny config trained `steps` steps in `workdir`: its history, initial and final params."""
  t = assembly.build_trainer(tiny(**{"train.steps": steps}), workdir=str(workdir))
  init = _leaves(t.state.params)
  history = t.train().history
  return {"workdir": workdir, "history": history, "init": init, "params": _leaves(t.state.params),
          "ref_params": t.state.ref_params}


# The plain tiny run several tests compare against (its first step, or its checkpoints), trained once per
# module (~10 s); tests that change a run's workdir work on a copy of it.
@pytest.fixture(scope="module")
def base2(tmp_path_factory):
  return _trained(tmp_path_factory.mktemp("base2"), steps=2)


def _answer_parity(answer, prediction, gold):
  return float(sum(map(ord, answer)) % 2)  # about half the answers score


# The tiny random model scores 0 on the task, so under the task's reward every advantage is 0 and an update
# leaves the params as they were: runs whose params are compared use a reward that moves them, and one
# mini-batch per step (with two, the second update of a step already sees moved params).
MOVING = {"train.steps": 2, "rl.reward": "answer_parity", "rl.ppo_mini_batch": 4}


@pytest.fixture(scope="module")
def parity_reward():
  with rollout.REWARD_FNS.registered("answer_parity", _answer_parity):
    yield


@pytest.fixture(scope="module")
def moving(tmp_path_factory, parity_reward):
  """MOVING trained 2 steps: initial params, after step 1 and after step 2, the metrics of both steps."""
  t = assembly.build_trainer(tiny(**MOVING), workdir=str(tmp_path_factory.mktemp("moving")))
  init = _leaves(t.state.params)
  history = t.train(until=1).history
  step1 = _leaves(t.state.params)
  history += t.train().history
  return {"init": init, "step1": step1, "params": _leaves(t.state.params), "ref_params": t.state.ref_params,
          "history": history}


def test_tiny_run_logs_every_metric_and_saves(tmp_path):
  # evaluation in the rollouts' batch and top-p: it runs the programs the rollouts compiled
  t = assembly.build_trainer(tiny(**{"train.steps": 2, "eval.every": 2, "eval.size": 8, "eval.batch_size": 8,
                                     "eval.top_p": 1.0}), workdir=str(tmp_path))
  out = t.train()
  assert out.step == 2 and [h.step for h in out.history] == [1, 2]
  assert out.history[0].eval is None and set(out.history[1].eval) >= {"score"}  # held-out scores on step 2 only
  lines = [json.loads(l) for l in open(tmp_path / "logs" / "metrics.jsonl")]
  train = [l for l in lines if "train/reward_mean" in l]
  assert [l["step"] for l in train] == [1, 2]
  for name in ("reward_mean", "accuracy", "kept_group_frac", "clip_frac", "kl", "entropy", "grad_norm",
               "memory_tokens", "update_tokens_per_s", "rollout_tokens_per_s", "step_seconds", "lr",
               "perf/host_rss_bytes"):
    assert f"train/{name}" in train[-1], name
  assert {f"train/{k}" for k in out.history[-1].scalars()} == set(train[-1]) - {"step"}  # what was logged
  assert [l["step"] for l in lines if "eval/score" in l] == [0, 2]  # the starting policy, then every 2
  events = EventAccumulator(str(tmp_path / "logs" / "tensorboard"))
  events.Reload()
  assert set(events.Tags()["scalars"]) == {k for l in lines for k in l} - {"step"}  # every logged scalar
  assert [(e.step, e.value) for e in events.Scalars("train/reward_mean")] == [
      (l["step"], pytest.approx(l["train/reward_mean"])) for l in train]
  assert checkpointing.Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 2
  assert train[-1]["train/perf/host_rss_bytes"] > 1e7  # a live Python with jax: tens of MB at least


def test_bad_configs_fail_before_any_work(tmp_path):
  from memagent_jax.agent.memagent import ContextBudgetError
  with pytest.raises(ContextBudgetError, match="context window is 4096 tokens"):
    assembly.build_trainer(tiny(**{"agent.chunk_tokens": 5000}), workdir=str(tmp_path / "a"))
  with pytest.raises(ValueError, match="group_size >= 2"):
    assembly.build_trainer(tiny(**{"rl.group_size": 1, "rl.rollout_batch": 4}), workdir=str(tmp_path / "b"))
  with pytest.raises(ValueError, match="does not match the 1 available devices"):
    assembly.build_trainer(tiny(**{"mesh.data": 3}), workdir=str(tmp_path / "c"))
  with pytest.raises(ValueError, match="ppo_mini_batch"):
    assembly.build_trainer(tiny(**{"rl.ppo_mini_batch": 3}), workdir=str(tmp_path / "d"))


def test_resume_from_another_model_shape_is_refused(tmp_path, base2):
  shutil.copytree(base2["workdir"], tmp_path, dirs_exist_ok=True)  # a 2-step tiny run
  with pytest.raises(checkpointing.CheckpointMismatchError):
    assembly.build_trainer(tiny(**{"model.source": "random:toy-1m"}), workdir=str(tmp_path))


def test_consecutive_non_finite_updates_stop_training(tmp_path):
  from memagent_jax.rl import update as upd

  def poisoned(params, opt, groups, **kw):  # every width group's advantages NaN
    groups = tuple(g.replace(advantages=g.advantages * np.nan) for g in groups)
    return upd.update_step(params, opt, groups, **kw)

  t = assembly.build_trainer(tiny(**{"train.steps": 2, "train.max_nan_steps": 3}), workdir=str(tmp_path),
                             programs=trainer_lib.StepPrograms(update_step=poisoned))
  before = _leaves(t.state.params)
  with pytest.raises(trainer_lib.NonFiniteLossError, match=r"step 2: 3 consecutive updates .*loss=nan"):
    t.train()
  assert all(np.array_equal(a, b) for a, b in zip(before, _leaves(t.state.params)))  # all skipped
  assert checkpointing.Checkpointer(str(tmp_path / "checkpoints")).all_steps() == [1]  # nothing of step 2


def test_non_finite_params_stop_the_run_before_their_checkpoint(tmp_path):
  """Params that turn non-finite (an overflowing update) stop the run at that step, naming it and a
  param leaf, and no checkpoint of it is written."""
  t = assembly.build_trainer(tiny(**{"train.steps": 2, "train.save_every": 1}), workdir=str(tmp_path))
  t.train(until=1)
  t.state.params = jax.tree_util.tree_map(lambda x: x * jnp.nan, t.state.params)  # as an overflow leaves them
  with pytest.raises(trainer_lib.NonFiniteStateError, match=r"step 2: \d+ leaves .* not finite \(params/embed"):
    t.train()
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"))
  assert ckpt.all_steps() == [1] and not (tmp_path / "checkpoints" / "2").exists()
  restored, _ = ckpt.restore()
  assert all(np.isfinite(x).all() for x in _leaves(restored))
  t.state.step = 2  # save_state itself refuses a non-finite state
  with pytest.raises(trainer_lib.NonFiniteStateError, match="step 2"):
    trainer_lib.save_state(t.checkpointer, t.state, mesh=t.mesh, meta=t.checkpoint_meta())


def test_resume_skips_an_unreadable_newest_checkpoint(tmp_path, caplog, base2):
  shutil.copytree(base2["workdir"], tmp_path, dirs_exist_ok=True)  # a 2-step tiny run
  ckpt_dir = tmp_path / "checkpoints"
  one, _ = checkpointing.Checkpointer(str(ckpt_dir)).restore(step=1)
  for root, _, files in os.walk(ckpt_dir / "2" / "state"):  # a half-written copy of step 2
    for f in files:
      with open(os.path.join(root, f), "r+b") as fh:
        fh.truncate(os.path.getsize(os.path.join(root, f)) // 3)
  with caplog.at_level(logging.INFO):
    t = assembly.build_trainer(tiny(**{"train.steps": 2}), workdir=str(tmp_path))
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1 and "\n" not in warnings[0], warnings
  assert "step 2" in warnings[0] and str(ckpt_dir / "2") in warnings[0]
  assert t.state.step == 1
  assert all(np.array_equal(a, b) for a, b in zip(_leaves(one["params"]), _leaves(t.state.params)))
  t.train()  # re-runs step 2 and saves it; the damaged copy is kept aside
  assert checkpointing.Checkpointer(str(ckpt_dir)).all_steps() == [1, 2]
  assert (ckpt_dir / "2.unreadable").is_dir()
  steps_logged = [json.loads(l)["step"] for l in open(tmp_path / "logs" / "metrics.jsonl")]
  assert steps_logged == [1, 2]


def test_recompute_old_logprobs_knob(tmp_path):
  """On: the first update's old log-probs come from its own forward pass (its params sampled), each
  later mini-batch's from a forward pass before the updates; off: from the sampler (equal to float
  rounding here, so the knob is checked by what runs). Without a fused attention kernel the memory
  rows' group runs the template opening once through a cache; the final-answer group has no room for it."""
  from memagent_jax.rl import update as upd
  calls, specs = [], []
  counting = trainer_lib.StepPrograms(
      batch_logprobs=lambda *a, **k: calls.append(1) or upd.batch_logprobs(*a, **k),
      update_step=lambda *a, **k: specs.append((k["spec"], len(a[2]))) or upd.update_step(*a, **k))
  t = assembly.build_trainer(tiny(**{"train.steps": 1}), workdir=str(tmp_path / "on"), programs=counting)
  history = t.train().history
  assert [s.old_is_current for s, _ in specs] == [True, False]  # two mini-batches
  assert len(calls) == specs[1][1] >= 1  # one pass per width group of the second
  assert history[0].prefix_shared_frac == 0.5  # one of each mini-batch's two width groups
  calls.clear(), specs.clear()
  assembly.build_trainer(tiny(**{"train.steps": 1, "rl.recompute_old_logprobs": False}),
                         workdir=str(tmp_path / "off"), programs=counting).train()
  assert not calls and [s.old_is_current for s, _ in specs] == [False, False]


def test_kl_pulls_towards_a_frozen_reference(tmp_path, base2, moving, parity_reward):
  """With a reward that moves the policy, the KL term is positive from the second step on and changes
  the update; the reference stays the initial params."""
  t = assembly.build_trainer(tiny(**MOVING, **{"rl.kl_coef": 5.0}), workdir=str(tmp_path / "kl"))
  init = _leaves(t.state.params)
  on = dict(init=init, history=t.train().history, params=_leaves(t.state.params), ref=t.state.ref_params)
  off = moving  # the same run without the KL term
  assert all(np.array_equal(a, b) for a, b in zip(on["init"], _leaves(on["ref"])))  # frozen
  assert all(np.array_equal(a, b) for a, b in zip(on["init"], off["init"]))
  assert off["ref_params"] is None and base2["ref_params"] is None
  assert off["history"][0].update.grad_norm > 0  # the reward moves the policy
  assert [h.updates for h in on["history"]] == [1, 1]
  assert on["history"][0].update.kl == 0 and on["history"][1].update.kl > 0  # equal at first, apart after a step
  diff = max(float(np.max(np.abs(x - y))) for x, y in zip(off["params"], on["params"]))
  assert diff > 1e-6


def test_max_chunks_truncates_training_documents_only(tmp_path, base2):
  """The training rollouts (what a step collects) read one chunk of documents that have two; the
  evaluation reader reads them whole."""
  assert base2["history"][0].rollout.chunks_per_doc == 2.0  # the same run without max_chunks
  run = assembly.build_experiment(tiny(**{"train.steps": 1, "agent.max_chunks": 1}), workdir=str(tmp_path))
  t = run.trainer
  assert t.collector.collect(t.batches, t._seed).metrics.chunks_per_doc == 1.0
  assert run.evaluator is None and run.agent.max_chunks == 1
  assert assembly.build_reader(run.cfg.agent, t.policy, training=False).max_chunks is None


@pytest.mark.parametrize("knob", ["train.seed", "data.seed", "model.seed"])
def test_seeds_change_the_run(tmp_path, knob, base2):
  a = base2["history"][0]  # its first step, against the first step of the same run with another seed
  b = assembly.build_trainer(tiny(**{"train.steps": 2, knob: 7}), workdir=str(tmp_path / "b")).train(until=1).history[0]
  keys = ("rollout_tokens", "memory_tokens", "answer_tokens", "entropy", "loss")
  assert any(a.scalars()[k] != b.scalars()[k] for k in keys)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_reaches_the_update(tmp_path, remat):
  """model.remat is the update's (that it changes how, not what, the update computes: test_update's remat
  and scanned-layer tests, on the update itself)."""
  trainer = assembly.build_trainer(tiny(**{"model.remat": remat}), workdir=str(tmp_path))
  assert trainer.update_spec.remat == remat


def test_micro_batches_change_how_not_what_the_trainer_updates(tmp_path, moving, parity_reward):
  """The trainer splits each mini-batch into micro-batches itself: after a step that moved the params,
  they equal the plain run's to float rounding."""
  other = assembly.build_trainer(tiny(**MOVING, **{"rl.micro_batches": 2}), workdir=str(tmp_path / "other"))
  update = other.train(until=1).history[0].update
  moved = max(float(np.max(np.abs(x - y))) for x, y in zip(moving["init"], moving["step1"]))
  assert moved > 1e-4  # the step changed the params (lr 5e-3 in the first warm-up step)
  assert update.grad_norm == pytest.approx(moving["history"][0].update.grad_norm, rel=1e-5)  # the same gradient
  diff = max(float(np.max(np.abs(x - y))) for x, y in zip(moving["step1"], _leaves(other.state.params)))
  assert diff <= 1e-5


class _SignalDuringCollect:
  """A collector that signals its own process in the middle of its first rollout."""

  def __init__(self, collector, signum):
    self.inner, self.signum, self.sent = collector, signum, False

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def collect(self, *args, **kw):
    if not self.sent:
      self.sent = True
      os.kill(os.getpid(), self.signum)  # the handler runs at once: the step must still finish
    return self.inner.collect(*args, **kw)


def test_signal_mid_step_finishes_saves_and_raises_in_process(tmp_path):
  """A library user (a notebook) gets an exception, not a dead interpreter: Ctrl-C in the first
  step lets it finish, saves it, raises Preempted (exit code 130), puts the handlers back and
  frees the workdir, whose checkpoint a new trainer resumes from."""
  before = signal.getsignal(signal.SIGINT)
  t = assembly.build_trainer(tiny(**{"train.steps": 2, "train.save_every": 100}), workdir=str(tmp_path))
  t.collector = _SignalDuringCollect(t.collector, signal.SIGINT)
  with pytest.raises(Preempted) as e:
    t.train()
  assert (e.value.step, e.value.signum, e.value.exit_code) == (1, signal.SIGINT, 130)
  assert str(e.value) == (f"preempted at step 1; checkpoint saved in {tmp_path / 'checkpoints'}; "
                          "run the same command to resume")
  assert signal.getsignal(signal.SIGINT) is before
  assert not (tmp_path / "run.lock").exists()
  assert checkpointing.Checkpointer(str(tmp_path / "checkpoints")).all_steps() == [1]
  again = assembly.build_trainer(tiny(**{"train.steps": 2}), workdir=str(tmp_path))
  assert again.state.step == 1  # step 1 was applied whole and saved
  assert all(np.array_equal(a, b) for a, b in zip(_leaves(t.state.params), _leaves(again.state.params)))


def test_resume_truncates_metrics_in_place(tmp_path):
  """Lines of steps after the checkpoint (and a line torn by a kill) go; the file stays the one
  the metric writer holds open for appending, so later steps still land in it."""
  from memagent_jax.rl import train_state
  (tmp_path / "logs").mkdir()
  path = tmp_path / "logs" / "metrics.jsonl"
  path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 1, 2, 3)) + '{"step": 4, "lo')
  with open(path, "a") as writer:
    train_state._truncate_metrics(str(path), 2)
    writer.write(json.dumps({"step": 3}) + "\n")
  assert [json.loads(l)["step"] for l in open(path)] == [1, 1, 2, 3]


def test_progress_bar_loss_says_none_when_no_update_ran():
  from memagent_jax.rl.rollout import RolloutMetrics
  from memagent_jax.rl.update import UpdateMetrics
  roll = RolloutMetrics(reward_mean=0.0, accuracy=0.0, kept_group_frac=0.0, memory_tokens=0.0, chunks_per_doc=1.0,
                        rollout_tokens=0.0, rollout_seconds=0.0)
  step = trainer_lib.StepMetrics(step=1, lr=1e-5, rollout=roll)
  losses = lambda loss: UpdateMetrics(**{n: 0.0 for n in UpdateMetrics.mean_names()} | {"loss": loss},
                                      tokens=1.0, finite=True)
  assert trainer_lib.loss_text(step) == "none"  # dynamic sampling kept no group
  assert "loss" not in step.scalars() and step.scalars()["updates"] == 0
  assert trainer_lib.loss_text(dataclasses.replace(step, update=losses(0.25), updates=1)) == "0.25"
  assert trainer_lib.loss_text(dataclasses.replace(step, update=losses(float("nan")), updates=1)) == "nan"
