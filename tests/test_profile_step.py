"""The profile script's core at tiny sizes: every row is measured, and the rows add up to the
separately measured wall time of what was profiled."""

import numpy as np

from configs import toy_memagent
from experiments.benchmarks import profile_step


def _tiny_rl_config():
  cfg = toy_memagent.get_config("rl,lookup")
  cfg.model.source = "random:toy-tiny"
  cfg.data.update(phases="", train_size=16)
  # one mini-batch: one update program (a second would compile again with old log-probs no longer current)
  cfg.rl.update(group_size=2, questions_per_step=2, ppo_mini_batch=2, rollout_batch=4, dynamic_sampling=False)
  cfg.train.update(steps=3, progress=False)
  cfg.eval.every = 0
  return cfg


def _check(result, expected_keys):
  rows = result["rows"]
  assert set(k for k, *_ in profile_step.ROWS if k in rows) == expected_keys
  for key in ("prefill", "sampling", "agent_host", "collector_host"):  # timed directly (decode is a difference)
    assert rows[key] > 0, (key, rows[key])
  leaves = sum(rows[k] for k in expected_keys)
  # the rows come from separate clocks (trainer, agent, wrapped programs, isolated pieces); their sum must
  # match the total measured around the whole call, and the in-situ total must match its own clock
  np.testing.assert_allclose(leaves, result["total"], rtol=1e-6)
  assert result["total"] <= result["wall"] * 1.001 + 1e-3
  assert result["wall"] - result["total"] < 0.05 * result["wall"] + 0.05


def test_rl_step_rows_sum_to_the_step():
  # the isolated pieces take milliseconds here; backward is a difference of two of them, so a single
  # timing of each under a loaded CI runner can come out negative: take medians of 7 (about 0.3 s)
  result = profile_step.profile_rl(_tiny_rl_config(), measured_steps=1, repeats=7)
  _check(result, {k for k, *_ in profile_step.ROWS})
  d = result["details"]
  assert d["memory_blocks"] >= 1 and d["mem_iters"] >= d["mem_steps"] >= 1 and d["answer_calls"] == 1
  rows = result["rows"]
  for key in ("forward", "backward", "optimizer", "logprobs"):  # KL on: the reference pass runs
    assert rows[key] > 0, (key, rows[key])
  text = profile_step.markdown(result, None, command="cmd", sweep_desc="")
  assert text.count("\n|") == len(profile_step.ROWS) + 4  # header, rule, rows, evaluation, total


def test_sweep_batch_rows_sum_to_the_batch(tmp_path):
  cfg = toy_memagent.get_config("rl,full,lookup")
  result = profile_step.profile_sweep(cfg, "random:toy-tiny", length=256, batch=3, seed=1000, repeats=1)
  rollout = {k for k, phase, *_ in profile_step.ROWS if phase == "rollout"}
  _check(result, rollout)
  assert result["details"]["rows"] == 3 and result["details"]["mem_steps"] >= 4
  profile_step.plot(None, result, str(tmp_path / "p.png"))
  assert (tmp_path / "p.png").stat().st_size > 1000
