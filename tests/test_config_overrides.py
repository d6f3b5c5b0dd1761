"""A mistyped config key is one line naming the nearest valid key, exit 2, at every entry point: train,
sweep, toy_reproduction (its --steps stages and flags) and `memagent compile`; before any model is built."""

import os
import subprocess
import sys

import pytest

from configs import toy_cpu
from memagent_jax import cli
from memagent_jax.experiment import config_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("key,nearest", [
    ("rl.clip_hihg", "rl.clip_high"),  # a typo of the field
    ("clip_high", "rl.clip_high"),  # the field without its section
    ("train.clip_high", "rl.clip_high"),  # the field in another section
    ("rl.overlong.enabel", "rl.overlong.enable"),
    ("agnet.chunk_tokens", "agent.chunk_tokens"),
])
def test_the_nearest_valid_key_is_named(key, nearest):
  cfg = toy_cpu.get_config("tiny")
  with pytest.raises(config_overrides.ConfigKeyError) as e:
    config_overrides.check_key(cfg, key)
  assert str(e.value) == f"--config.{key}: no such config key; did you mean --config.{nearest}?"


def test_valid_keys_pass_and_far_ones_point_to_the_base_config():
  cfg = toy_cpu.get_config("tiny")
  for key in ("rl.clip_high", "rl.overlong", "rl.overlong.enable", "data.options", "model"):
    config_overrides.check_key(cfg, key)
  with pytest.raises(config_overrides.ConfigKeyError, match="--config.zzzzzz: no such config key; the keys and "
                                                            "their meanings are in configs/base.py"):
    config_overrides.check_key(cfg, "zzzzzz")
  with pytest.raises(config_overrides.ConfigKeyError, match="no such config key"):  # a field has no sub-keys
    config_overrides.check_key(cfg, "rl.clip_high.x")


def _run(*argv):
  return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_train_names_the_nearest_key_in_one_line(tmp_path):
  out = _run("experiments.train", "--config=configs/toy_cpu.py:tiny", "--config.rl.clip_hihg=0.3",
             f"--workdir={tmp_path}")
  assert out.returncode == 2
  assert out.stderr.strip() == "train: error: --config.rl.clip_hihg: no such config key; did you mean --config.rl.clip_high?"
  assert not os.listdir(tmp_path)  # nothing built, nothing written


def test_sweep_checks_every_key_before_its_first_run(tmp_path):
  out = _run("experiments.sweep", "--sweep=configs/sweeps/clip_high.py", f"--root={tmp_path}",
             "--set=rl.clip_hihg=0.3")
  assert out.returncode == 2 and out.stdout == ""  # no run was started
  assert out.stderr.strip() == "sweep: error: --set rl.clip_hihg: no such config key; did you mean --set rl.clip_high?"
  sweep = tmp_path / "typo.py"
  sweep.write_text('def get_sweep():\n  return {"config": "configs/toy_cpu.py", "runs": {"a": {"rl.clip_hihg": 0.3}}}\n')
  out = _run("experiments.sweep", f"--sweep={sweep}", "--dry_run")
  assert out.returncode == 2
  assert out.stderr.strip() == (f"sweep: error: {sweep}, run 'a': rl.clip_hihg: no such config key; "
                                "did you mean rl.clip_high?")


def test_toy_reproduction_names_the_nearest_stage_and_flag():
  out = _run("experiments.toy_reproduction", "--steps=warm_strat=3", "--scale=demo")
  assert out.returncode == 2
  assert out.stderr.strip() == ("toy_reproduction: error: flag --steps=warm_strat=3: no stage 'warm_strat'; "
                                "did you mean 'warm_start'?")
  out = _run("experiments.toy_reproduction", "--scael=demo")
  assert out.returncode == 2
  assert out.stderr.strip() == "toy_reproduction: error: Unknown command line flag 'scael'. Did you mean: scale ?"


def test_memagent_compile_names_the_nearest_key(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["compile", "--config", "configs/toy_cpu.py:tiny", "--topology", "v5p-8", "--config.rl.clip_hihg=0.3"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2
  assert err == ["memagent: error: --config.rl.clip_hihg: no such config key; did you mean --config.rl.clip_high?"]
