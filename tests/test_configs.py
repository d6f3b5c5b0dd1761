"""Config files: released settings as in MEMAGENT_FACTS.md section 3, variants, and sweeps."""

import importlib
import os
import subprocess
import sys

import pytest

from memagent_jax.experiment.config_checks import validate_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ["base", "toy_cpu", "memagent_qwen2_5_7b", "memagent_qwen2_5_14b", "memagent_qwen3"]


def _get(name, variant=""):
  return importlib.import_module(f"configs.{name}").get_config(variant)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_and_variant_is_valid(name):
  validate_config(_get(name))
  if name != "base":
    validate_config(_get(name, "dapo"))
  with pytest.raises(ValueError, match="unknown variant"):
    _get(name if name != "base" else "toy_cpu", "nope")


@pytest.mark.parametrize("name,questions,mini", [("memagent_qwen2_5_7b", 128, 8), ("memagent_qwen2_5_14b", 256, 16)])
def test_released_settings(name, questions, mini):
  c = _get(name)
  assert (c.agent.chunk_tokens, c.agent.memory_tokens, c.agent.answer_tokens) == (5000, 1024, 1024)
  assert c.rl.group_size == 16 and c.rl.questions_per_step == questions and c.rl.ppo_mini_batch == mini
  assert c.rl.questions_per_step // c.rl.ppo_mini_batch == 16  # 16 optimizer updates per step
  assert (c.optim.lr, c.optim.warmup_steps, c.optim.weight_decay, c.optim.grad_clip) == (1e-6, 20, 0.01, 1.0)
  assert (c.rl.kl_coef, c.rl.kl_kind) == (0.001, "low_var_kl")
  assert (c.rl.clip_low, c.rl.clip_high, c.rl.clip_c, c.rl.agg) == (0.2, 0.2, 3.0, "token-mean")
  assert c.rl.advantage == "mean_centred" and not c.rl.dynamic_sampling and not c.rl.overlong.enable
  assert (c.rl.temperature, c.rl.top_p, c.eval.temperature, c.eval.top_p) == (1.0, 1.0, 1.0, 0.7)
  assert c.model.dtype == "bfloat16" and c.mesh.fsdp * c.mesh.tensor >= 32
  d = _get(name, "dapo")
  assert (d.rl.clip_low, d.rl.clip_high, d.rl.kl_coef) == (0.2, 0.28, 0.0)
  assert d.rl.dynamic_sampling and d.rl.overlong.enable and d.rl.max_extra_gen_batches > 0


@pytest.mark.parametrize("size,pod,fsdp,tensor", [("1.7b", "v5e-8", 4, 2), ("4b", "v6e-8", 4, 2),
                                                   ("8b", "v5p-8", 2, 2)])
def test_qwen3_configs_keep_the_released_objective(size, pod, fsdp, tensor):
  """configs/memagent_qwen3.py: each size, and its dapo variant, validates and runs the Qwen3 preset with the
  released verifier, KL and clipping, mean-centred advantages and the released reader, on every chip of the
  one host it is sized for."""
  from configs import memagent_qwen3
  from memagent_jax.models.config import get_preset
  from memagent_jax.runtime.tpu_targets import parse_topology
  c = _get("memagent_qwen3", size)
  validate_config(c)
  assert c.model.source == f"qwen3-{size}" and get_preset(c.model.source).arch == "qwen3"
  assert (c.agent.chunk_tokens, c.agent.memory_tokens, c.agent.answer_tokens) == (5000, 1024, 1024)
  assert c.rl.reward == "memagent_verifier" and c.rl.advantage == "mean_centred"
  assert (c.rl.kl_coef, c.rl.kl_kind) == (0.001, "low_var_kl")
  assert (c.rl.clip_low, c.rl.clip_high, c.rl.clip_c) == (0.2, 0.2, 3.0)
  assert c.rl.group_size == 16 and not c.rl.dynamic_sampling and not c.rl.overlong.enable
  assert (c.mesh.fsdp, c.mesh.tensor) == (fsdp, tensor) and 8 % tensor == 0  # tensor divides the 8 kv heads
  assert memagent_qwen3.POD[size] == pod and fsdp * tensor == parse_topology(pod).chips
  # one host's batch: 32 questions in 8 updates of 4, one trajectory per update micro-batch
  assert (c.rl.questions_per_step, c.rl.ppo_mini_batch, c.rl.micro_batches) == (32, 4, 64)
  assert c.train.workdir == f"runs/memagent_qwen3_{size}"
  d = _get("memagent_qwen3", f"{size},dapo")
  validate_config(d)
  assert d.model.source == c.model.source and d.train.workdir == f"runs/memagent_qwen3_{size}_dapo"
  assert (d.rl.clip_low, d.rl.clip_high, d.rl.kl_coef, d.rl.advantage) == (0.2, 0.28, 0.0, "grpo")
  assert d.rl.dynamic_sampling and d.rl.overlong.enable
  assert _get("memagent_qwen3", "dapo").model.source == "qwen3-4b"
  for bad in ("14b", "4b,8b", "4b,dapo,dapo"):
    with pytest.raises(ValueError, match="unknown variant"):
      _get("memagent_qwen3", bad)


def test_sweeps_list_overrides_of_real_fields():
  sweeps = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "configs", "sweeps")) if f.endswith(".py")
                  and not f.startswith("_"))
  assert {"memory_size", "chunk_size", "clip_high", "advantage"} <= set(sweeps)
  for s in sweeps:
    sweep = importlib.import_module(f"configs.sweeps.{s}").get_sweep()
    base = _get(os.path.splitext(os.path.basename(sweep["config"]))[0])
    for run, overrides in sweep["runs"].items():
      for key, value in overrides.items():
        node = base
        *path, leaf = key.split(".")
        for p in path:
          node = node[p]
        assert leaf in node, f"{s}/{run}: {key} is not a config field"
        node[leaf] = value
      validate_config(base)


def test_sweep_dry_run_prints_one_command_per_run(tmp_path):
  out = subprocess.run([sys.executable, "-m", "experiments.sweep", "--sweep=configs/sweeps/clip_high.py",
                        "--dry_run", f"--root={tmp_path}"], cwd=REPO, capture_output=True, text=True, check=True)
  cmds = [l for l in out.stdout.splitlines() if "experiments.train" in l]
  assert len(cmds) == 3 and all("--config.rl.clip_high=" in c for c in cmds)


def test_sweep_summary_table(tmp_path):
  import json
  from experiments import sweep
  for run, rewards in (("a", [0.1, 0.2, 0.5]), ("b", [0.0, 0.0, 0.1])):
    os.makedirs(tmp_path / run / "logs")
    with open(tmp_path / run / "logs" / "metrics.jsonl", "w") as f:
      for i, r in enumerate(rewards):
        f.write(json.dumps({"step": i + 1, "train/reward_mean": r, "train/accuracy": r}) + "\n")
  rows = [sweep.summarize(r, str(tmp_path / r), 1.0) for r in ("a", "b")]
  assert rows[0]["reward_first"] == 0.1 and rows[0]["reward_last"] == 0.5 and rows[0]["steps"] == 3
  table = sweep.write_table(rows, str(tmp_path))
  assert "| a | 3 |" in table and os.path.exists(tmp_path / "summary.csv")


def test_real_model_rl_config_fits_smollm2_and_draws_8k_multikey_documents(smollm):
  """configs/smollm2_niah_rl.py (issue 16, item 5) builds a reader on the embedded model: every
  prompt plus its cap fits the 8192-token window, and documents are niah_multikey_1 at 8K."""
  from memagent_jax.experiment import assembly
  from memagent_jax.rl import rollout
  c = _get("smollm2_niah_rl")
  assert c.model.source == "smollm2-135m-instruct" and c.data.length >= 8192
  assert c.rl.dynamic_sampling and c.rl.clip_high > c.rl.clip_low and c.eval.every > 0  # DAPO, curve
  rollout.get_reward_fn(c.rl.reward)  # a registered reward
  agent = assembly.build_reader(c.agent, smollm, training=True)  # raises when a prompt overflows
  assert smollm.config.max_position_embeddings == 8192
  [doc] = assembly.sample_pool(c.data, chunk_tokens=c.agent.chunk_tokens, size=1, seed=c.eval.seed,
                               length=c.data.length, tokenizer=agent.tokenizer)
  tokens = len(agent.tokenizer.encode(doc["context"]))
  assert 0.9 * c.data.length <= tokens <= c.data.length, tokens
  assert -(-tokens // c.agent.chunk_tokens) == 8  # eight memory updates per trajectory
  with pytest.raises(ValueError, match="unknown variant"):
    _get("smollm2_niah_rl", "nope")


@pytest.mark.parametrize("variant", ["0.5b", "1.5b", "3b"])
def test_one_host_configs_are_valid(variant):
  """configs/memagent_qwen2_5_small.py: each size validates and its mesh fills every chip of its pod."""
  from configs import memagent_qwen2_5_small
  from memagent_jax.runtime.tpu_targets import parse_topology
  c = _get("memagent_qwen2_5_small", variant)
  validate_config(c)
  assert c.model.source.startswith("qwen2.5-") and c.mesh.rollout == "replicated"
  assert c.mesh.fsdp * c.mesh.tensor == parse_topology(memagent_qwen2_5_small.POD[variant]).chips
  with pytest.raises(ValueError, match="unknown variant"):
    _get("memagent_qwen2_5_small", "7b")


def _variants():
  """Every config file with every variant it names."""
  from configs import memagent_qwen2_5_small, memagent_qwen3, toy_memagent
  yield from (("base", ""), ("toy_cpu", ""), ("toy_cpu", "tiny"), ("toy_cpu", "dapo"), ("smollm2_niah_rl", ""),
              ("smollm2_niah_rl", "smoke"))
  yield from ((n, v) for n in ("memagent_qwen2_5_7b", "memagent_qwen2_5_14b") for v in ("", "dapo"))
  yield from (("memagent_qwen2_5_small", v) for v in memagent_qwen2_5_small.SIZES)
  yield from (("memagent_qwen3", f"{size}{dapo}") for size in memagent_qwen3.SIZES for dapo in ("", ",dapo"))
  yield from (("toy_memagent", ",".join((stage, scale, world))) for stage in toy_memagent.STAGES
              for scale in toy_memagent.SCALES for world in toy_memagent.WORLDS)


def test_every_configs_sharding_rules_shard_every_param_without_a_collision():
  """The rules of each config (training and rollout layout) map no two logical axes of any param
  (Llama, Qwen2 and Qwen3 layouts, token shift) to one mesh axis; a collision would raise."""
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import AbstractMesh
  from memagent_jax.models.config import get_preset
  from memagent_jax.experiment import specs
  from memagent_jax.models.decoder import Decoder
  from memagent_jax.runtime import parallel
  states = [nnx.state(nnx.eval_shape(lambda p=p: Decoder(get_preset(p), jnp.float32, rngs=nnx.Rngs(0))), nnx.Param)
            for p in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "toy-1m-shift2")]
  mesh = AbstractMesh((2, 2, 2), parallel.MESH_AXES)
  seen = 0
  for name, variant in _variants():
    mesh_spec = specs.mesh_spec(_get(name, variant))
    rules = mesh_spec.axis_rules()
    for layout in {"train", mesh_spec.rollout}:
      for state in states:
        parallel.param_shardings(state, mesh, parallel.rollout_rules(rules, layout))
    seen += 1
  assert seen >= 20


def test_no_config_key_is_shadowed_by_a_configdict_method():
  """`--config.a.update=1` cannot set a key named like a ConfigDict method (update, get, items, ...): the
  flag parser finds the method. Every key of the base config is settable from the command line."""
  import ml_collections
  from configs import base
  reserved = {name for name in dir(ml_collections.ConfigDict) if not name.startswith("_")}

  def keys(c, prefix=""):
    for k, v in c.items():
      yield f"{prefix}{k}"
      if isinstance(v, ml_collections.ConfigDict):
        yield from keys(v, f"{prefix}{k}.")
  shadowed = [k for k in keys(base.get_config()) if k.rsplit(".", 1)[-1] in reserved]
  assert not shadowed, shadowed
