"""Config validation: every numeric key finite and in range, each error naming key, value and range."""

import importlib
import os
import math

import pytest

from configs import toy_cpu
from memagent_jax.experiment import config_checks
from memagent_jax.experiment.config_checks import RANGES, validate_config

from test_trainer import tiny

NAN, INF = float("nan"), float("inf")

# (key, bad value): nan / inf everywhere, plus 0, negatives and out-of-range values per key.
BAD = [(key, v) for key, valid in RANGES.items() for v in ((NAN, INF, -INF) if not valid.integer else (NAN, 1.5))]
BAD += [
    ("optim.lr", 0.0), ("optim.lr", -1e-3), ("rl.temperature", 0.0), ("rl.temperature", -1.0),
    ("rl.top_p", 0.0), ("rl.top_p", 1.5), ("rl.top_p", -0.1), ("rl.clip_low", 1.0), ("rl.clip_low", -0.1),
    ("rl.clip_high", -0.2), ("rl.clip_c", 1.0), ("rl.clip_c", 0.5), ("rl.clip_c", -3.0),
    ("rl.kl_coef", -0.001), ("rl.entropy_coef", -0.01), ("rl.eps", -1e-6),
    ("optim.weight_decay", -0.01), ("optim.grad_clip", -1.0), ("optim.warmup_steps", -1),
    ("optim.min_lr_ratio", 1.5), ("optim.min_lr_ratio", -0.1), ("optim.b1", 1.0), ("optim.b2", 1.0),
    ("optim.b1", -0.1), ("optim.eps", 0.0), ("optim.eps", -1e-8),
    ("rl.group_size", 0), ("rl.questions_per_step", 0), ("rl.ppo_mini_batch", -1), ("rl.micro_batches", 0),
    ("rl.rollout_batch", 0), ("agent.chunk_tokens", 0), ("agent.memory_tokens", -16), ("agent.answer_tokens", 0),
    ("agent.question_tokens", 0), ("agent.block_chunks", 0), ("agent.max_chunks", -1), ("data.length", 0),
    ("data.train_size", 0), ("train.steps", 0), ("train.save_every", 0), ("train.keep_checkpoints", 0),
    ("train.log_every", 0), ("train.max_nan_steps", 0), ("train.seed", -1), ("model.seed", -1),
    ("eval.every", -1), ("eval.temperature", -0.5), ("eval.top_p", 0.0), ("eval.batch_size", 0),
    ("rl.max_extra_gen_batches", -1), ("rl.overlong.max_tokens", 0), ("rl.overlong.cache_tokens", -1),
    ("mesh.data", 0), ("mesh.tensor", -2), ("distributed.num_processes", -1), ("distributed.process_id", -2),
]


@pytest.mark.parametrize("key,value", BAD, ids=[f"{k}={v}" for k, v in BAD])
def test_bad_value_names_key_value_and_range(key, value):
  with pytest.raises(ValueError) as e:
    validate_config(tiny(**{key: value}))
  msg = str(e.value)
  assert f"{key}={value!r}" in msg and "must be" in msg, msg
  assert "\n" not in msg


@pytest.mark.parametrize("key", ["optim.lr", "rl.temperature"])
def test_nan_is_refused_before_anything_is_compiled(key, tmp_path):
  """The issue's two reports: both fail in Trainer.__init__ before any JAX work or file. Two processes
  without a coordinator would fail in the runtime's start, the first step after validation."""
  from memagent_jax.experiment import assembly
  with pytest.raises(ValueError, match="needs coordinator_address"):  # what getting past validation does
    assembly.build_trainer(tiny(**{"distributed.num_processes": 2}), workdir=str(tmp_path / "run"))
  with pytest.raises(ValueError, match=f"config: {key}=nan must be a finite number > 0"):
    assembly.build_trainer(tiny(**{key: NAN, "distributed.num_processes": 2}), workdir=str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key,value", [("rl.clip_c", 0.0), ("optim.grad_clip", 0.0), ("mesh.data", -1),
                                       ("rl.clip_low", 0.0), ("rl.top_p", 1.0), ("eval.temperature", 0.0),
                                       ("optim.warmup_steps", 0), ("rl.kl_coef", 0.0), ("optim.min_lr_ratio", 1.0),
                                       ("distributed.process_id", -1), ("agent.max_chunks", 0)])
def test_boundary_values_that_mean_off_are_accepted(key, value):
  validate_config(tiny(**{key: value}))


def test_combinations_and_divisibility():
  with pytest.raises(ValueError, match="rl.questions_per_step=4 is not a multiple of rl.ppo_mini_batch=3"):
    validate_config(tiny(**{"rl.ppo_mini_batch": 3}))
  with pytest.raises(ValueError, match="rl.rollout_batch=7 must be a multiple of rl.group_size=2"):
    validate_config(tiny(**{"rl.rollout_batch": 7}))
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    validate_config(tiny(**{"mesh.data": -1, "mesh.fsdp": -1}))
  with pytest.raises(ValueError, match=r"distributed.process_id=2 must be in \[0, distributed.num_processes=2\)"):
    validate_config(tiny(**{"distributed.num_processes": 2, "distributed.process_id": 2}))
  with pytest.raises(ValueError, match="eval.size=0 must be an integer >= 1 when eval.every=2"):
    validate_config(tiny(**{"eval.every": 2, "eval.size": 0}))
  with pytest.raises(ValueError, match=r"model.remat='some'; choose one of \['none', 'dots', 'full'\]"):
    validate_config(tiny(**{"model.remat": "some"}))
  with pytest.raises(ValueError, match="teacher.options.overwrite_prob=nan must be a finite number"):
    validate_config(tiny(**{"teacher.options.overwrite_prob": NAN}))


def test_every_numeric_field_of_base_has_a_range():
  """A numeric field added to configs/base.py without a range here would escape validation."""
  from configs import base
  ranged = set(RANGES) | set(config_checks.BOOLS)

  def numeric(node, prefix=""):
    for k, v in node.items():
      if hasattr(v, "items"):
        if k != "options":  # teacher.options: keyword arguments of the chosen teacher
          yield from numeric(v, f"{prefix}{k}.")
      elif isinstance(v, (int, float)):
        yield f"{prefix}{k}"
  missing = sorted(set(numeric(base.get_config())) - ranged)
  assert not missing, missing


VARIANTS = [("base", ""), ("toy_cpu", ""), ("toy_cpu", "tiny"), ("toy_cpu", "dapo"),
            ("memagent_qwen2_5_7b", ""), ("memagent_qwen2_5_7b", "dapo"),
            ("memagent_qwen2_5_14b", ""), ("memagent_qwen2_5_14b", "dapo"),
            ("smollm2_niah_rl", ""), ("smollm2_niah_rl", "smoke"),
            ("own_data", ""), ("own_data", "smoke"), ("own_data", "tiny")]
VARIANTS += [("toy_memagent", f"{stage}{scale}{world}")
             for stage in ("pretrain", "warm_start", "rl", "full_attention")
             for scale in ("", ",demo") for world in ("", ",lookup")]


@pytest.mark.parametrize("name,variant", VARIANTS)
def test_every_shipped_config_validates(name, variant):
  cfg = importlib.import_module(f"configs.{name}").get_config(variant)
  validate_config(cfg)
  assert math.isfinite(cfg.optim.lr)


def test_train_script_reports_a_bad_config_in_one_line(tmp_path):
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-m", "experiments.train", "--config=configs/toy_cpu.py:tiny",
                        "--config.rl.temperature=nan", f"--workdir={tmp_path}"], cwd=repo,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip() == "train: error: config: rl.temperature=nan must be a finite number > 0"
  assert not os.listdir(tmp_path)  # nothing written


def test_unknown_attention_backend_is_a_config_error():
  with pytest.raises(ValueError, match=r"model.attention='flash'; choose one of \['auto', 'xla', 'cudnn', 'splash'\]"):
    validate_config(tiny(**{"model.attention": "flash"}))


@pytest.mark.parametrize("advantage", ["grpo", "batch_std"])
def test_std_dividing_advantages_need_a_positive_eps(advantage):
  cfg = tiny()
  cfg.rl.update(advantage=advantage, eps=0.0, group_size=2, rollout_batch=2)
  with pytest.raises(ValueError, match=rf"rl.eps=0.0 must be > 0 with rl.advantage='{advantage}'"):
    validate_config(cfg)
  cfg.rl.eps = 1e-6
  validate_config(cfg)
