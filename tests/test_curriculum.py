"""data.phases: parsing and checks, the cut to a shorter run, and the runner's phase order and resume."""

import json
import types

import pytest

from configs import toy_cpu, toy_memagent
from memagent_jax.data import curriculum, toy
from memagent_jax.experiment import assembly, phase_configs
from memagent_jax.experiment.config_checks import validate_config
from memagent_jax.rl.trainer import TrainResult

LOOKUP_RL = "rl,full,lookup"


def _curriculum_config():
  """Full-scale lookup RL: make reproduce's 550-step curriculum (configs/toy_memagent.LOOKUP_CURRICULUM)."""
  cfg = toy_memagent.get_config(LOOKUP_RL)
  assert (cfg.data.phases, cfg.train.steps) == (toy_memagent.LOOKUP_CURRICULUM, 550)
  return cfg


def _options():
  return toy_memagent.get_config(LOOKUP_RL).data.options


def test_phases_parse_into_typed_option_settings():
  phases = curriculum.parse_phases(toy_memagent.LOOKUP_CURRICULUM, _options(), 550)
  assert phases == [(200, {}), (300, {"distractor_keys": "mixed"}),
                    (400, {"distractor_keys": "mixed", "late_fact_share": 1.0}),
                    (550, {"distractor_keys": "mixed", "late_fact_share": 1.0, "num_distractors": 8})]
  assert curriculum.parse_phases("", _options(), 400) == []


@pytest.mark.parametrize("spec,steps,message", [
    ("200:;100:", 100, "must increase"),
    ("0:", 0, "must increase"),
    ("200:;300:colour=red", 300, "existing data.options key"),
    ("200:distractor_keys", 200, "existing data.options key"),
    ("200:;300:", 400, "train.steps is 400"),
    ("x:", 1, "until step"),
])
def test_bad_phases_are_refused_with_the_reason(spec, steps, message):
  with pytest.raises(ValueError, match=message):
    curriculum.parse_phases(spec, _options(), steps)


def test_a_phase_value_of_the_wrong_type_fails_validation():
  cfg = _curriculum_config()
  validate_config(cfg)  # the shipped curriculum is valid
  with cfg.unlocked():
    cfg.data.phases = "200:;550:late_fact_share=late"
  with pytest.raises(ValueError, match="late_fact_share"):
    validate_config(cfg)


def test_phase_config_changes_only_its_options():
  cfg = toy_memagent.get_config(LOOKUP_RL)
  out = phase_configs.phase_config(cfg, {"distractor_keys": "mixed", "late_fact_share": 1.0})
  assert out.data.options.distractor_keys == "mixed" and out.data.options.late_fact_share == 1.0
  assert cfg.data.options.distractor_keys == "askable" and cfg.data.options.late_fact_share == 0.0
  # the options reach the generator: the phase's documents differ from the first phase's
  first = toy.generate(4, makeup=toy.Makeup(**{k: v for k, v in cfg.data.options.items()}))
  later = toy.generate(4, makeup=toy.Makeup(**{k: v for k, v in out.data.options.items()}))
  assert [s["context"] for s in first] != [s["context"] for s in later]


@pytest.mark.parametrize("steps,expected", [
    (2, "2:"), (200, "200:"), (250, "200:;250:distractor_keys=mixed"),
    (400, "200:;300:distractor_keys=mixed;400:late_fact_share=1.0"),
    (500, "200:;300:distractor_keys=mixed;500:late_fact_share=1.0")])
def test_with_steps_keeps_the_first_steps_of_the_curriculum(steps, expected):
  assert curriculum.with_steps("200:;300:distractor_keys=mixed;400:late_fact_share=1.0", steps) == expected
  assert curriculum.with_steps("", steps) == ""


class _FakeTrainer:
  """Records the options it was built with and the steps it ran; starts at the saved step."""

  saved = 0
  runs = []

  def __init__(self, cfg):
    self.cfg, self.state = cfg, types.SimpleNamespace(step=_FakeTrainer.saved)

  def close(self):
    _FakeTrainer.runs.append(("closed", self.state.step))

  def train(self, until=None):
    until = until or self.cfg.train.steps
    _FakeTrainer.runs.append((self.state.step, until, self.cfg.data.options.to_dict()))
    history = [types.SimpleNamespace(step=s) for s in range(self.state.step + 1, until + 1)]  # as StepMetrics
    _FakeTrainer.saved = self.state.step = max(until, self.state.step)
    return TrainResult(step=self.state.step, history=history)


def test_train_phases_runs_each_phase_on_its_documents_and_resumes_in_its_phase():
  cfg = _curriculum_config()
  _FakeTrainer.saved, _FakeTrainer.runs = 0, []
  out = assembly.train_phases(cfg, build=lambda c, w: _FakeTrainer(c))
  assert [(a, b, o["distractor_keys"], o["late_fact_share"], o["num_distractors"])
          for a, b, o in _FakeTrainer.runs] == [
      (0, 200, "askable", 0.0, 3), (200, 300, "mixed", 0.0, 3), (300, 400, "mixed", 1.0, 3), (400, 550, "mixed", 1.0, 8)]
  assert [h.step for h in out.history] == list(range(1, 551)) and out.step == 550
  # a run killed at step 250 resumes in the second phase, on its documents
  _FakeTrainer.saved, _FakeTrainer.runs = 250, []
  assembly.train_phases(cfg, build=lambda c, w: _FakeTrainer(c))
  assert _FakeTrainer.runs[0] == ("closed", 250)  # the finished first phase's trainer lets go of the workdir
  assert [(a, b, o["distractor_keys"]) for a, b, o in _FakeTrainer.runs[1:]] == [
      (250, 300, "mixed"), (300, 400, "mixed"), (400, 550, "mixed")]


def test_a_real_run_switches_documents_at_the_phase_end(tmp_path, caplog):
  """The tiny config trained 2 steps in 2 phases: the second phase resumes the first's checkpoint
  and reads documents of its own options; step 2 equals step 2 of a run resumed by hand. Run again,
  the finished run trains nothing and no phase takes the workdir lock over from another."""
  c = toy_cpu.get_config("tiny")
  with c.unlocked():
    c.train.steps = 2
    c.data.options = toy_memagent.get_config(LOOKUP_RL).data.options
    c.data.task = toy.TASK
    c.data.phases = "1:;2:distractor_keys=mixed"
  out = assembly.train_phases(c, workdir=str(tmp_path / "phased"))
  assert out.step == 2 and [h.step for h in out.history] == [1, 2]
  with caplog.at_level("WARNING"):
    again = assembly.train_phases(c, workdir=str(tmp_path / "phased"))
  assert again.step == 2 and again.history == []
  assert not [r for r in caplog.records if "taking over the workdir lock" in r.getMessage()]
  # by hand: step 1 on the first options, then a resumed run on the second's
  first = phase_configs.phase_config(c, {})
  with first.unlocked():
    first.data.phases = ""
  assembly.build_trainer(first, workdir=str(tmp_path / "hand")).train(until=1)
  second = phase_configs.phase_config(first, {"distractor_keys": "mixed"})
  hand = assembly.build_trainer(second, workdir=str(tmp_path / "hand")).train()
  lines = lambda d: [json.loads(l) for l in open(tmp_path / d / "logs" / "metrics.jsonl")]
  phased, by_hand = lines("phased"), lines("hand")
  assert [l["step"] for l in phased] == [1, 2]
  assert phased[-1]["train/reward_mean"] == by_hand[-1]["train/reward_mean"]
  assert phased[-1]["train/loss"] == by_hand[-1]["train/loss"]
  assert hand.step == 2


def test_the_report_names_each_phase_documents():
  """toy_report's sentence on the training documents gives a curriculum's step ranges."""
  from experiments import toy_report
  configs = lambda v: _curriculum_config() if v == LOOKUP_RL.replace(",full", "") else toy_memagent.get_config(v)
  told = toy_report._training_documents("lookup", "full", get_config=configs)
  assert ("rl on 1x documents generated with, in turn, steps 1-200 distractor_keys=askable, num_distractors=3; "
          "steps 201-300 distractor_keys=mixed, num_distractors=3; steps 301-400 distractor_keys=mixed, "
          "late_fact_share=1.0, num_distractors=3; steps 401-550 distractor_keys=mixed, late_fact_share=1.0, "
          "num_distractors=8;") in told


def test_a_later_phase_reuses_the_compiled_update(tmp_path):
  """Each phase builds its own trainer; the optimizer transform, a static argument of the update
  program, is shared by trainers of one optimizer spec, so a phase whose rows have shapes already
  seen compiles no new update (the reproduction's phase switches recompiled for ~10 s per shape)."""
  from memagent_jax.agent import recurrence
  from memagent_jax.rl import update as upd
  programs = (upd.update_step, upd.batch_logprobs, recurrence.memory_block, recurrence.answer_block)
  c = toy_cpu.get_config("tiny")
  with c.unlocked():
    c.train.steps = 1
  first = assembly.build_trainer(c, workdir=str(tmp_path / "a"))
  first.train()
  compiled = [p._cache_size() for p in programs]
  second = assembly.build_trainer(c, workdir=str(tmp_path / "b"))  # the same rows: same data seed and config
  assert second.tx is first.tx
  second.train()
  assert [p._cache_size() for p in programs] == compiled
