"""Weight sources, the on-disk cache, HF export round trip, and clear errors on bad input."""

import json
import os
import shutil
import types

import numpy as np
import pytest

import memagent_jax as mj
from conftest import torch_logits
from memagent_jax.models import gguf_weights
from memagent_jax.models.config import PRESETS, ModelConfig
from memagent_jax.policy import loading
from memagent_jax.policy.decode_spec import GREEDY


def test_export_round_trip_through_transformers(tiny_hf_dir, tmp_path):
  _, path = tiny_hf_dir
  policy = mj.load_policy(path)
  out = str(tmp_path / "export")
  policy.export(out)
  ids = np.random.default_rng(0).integers(0, 128, size=(2, 24))
  ours = np.asarray(policy.logits(ids))
  np.testing.assert_allclose(torch_logits(out, ids), ours, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(mj.load_policy(out).logits(ids)), ours)


def test_random_policy_export_round_trip(tmp_path):
  """Our own initialisation (tied and untied, with biases) exports to a loadable checkpoint."""
  for name in ("tiny-llama", "tiny-qwen2"):
    policy = mj.load_policy(f"random:{name}", seed=1)
    policy.export(str(tmp_path / name))
    ids = np.arange(30)[None] % 256
    np.testing.assert_allclose(torch_logits(str(tmp_path / name), ids), np.asarray(policy.logits(ids)),
                               atol=1e-4)


@pytest.mark.slow
def test_smollm2_export_round_trip(smollm, tmp_path):
  out = str(tmp_path / "smollm2")
  smollm.export(out)
  ids = np.array([smollm.tokenizer.apply_chat_template("Hello there, how are you?")])
  np.testing.assert_allclose(torch_logits(out, ids), np.asarray(smollm.logits(ids)), atol=2e-3)
  from transformers import AutoTokenizer
  assert AutoTokenizer.from_pretrained(out).encode("memory agent") == smollm.tokenizer.encode("memory agent")


def test_embedded_default_is_cached(smollm):
  src = gguf_weights.convert_gguf(loading.embedded_gguf_path())
  assert os.path.isfile(os.path.join(src, "COMPLETE"))
  files = ("COMPLETE", "model.safetensors")
  stamp = lambda: [(os.stat(os.path.join(src, f)).st_ino, os.stat(os.path.join(src, f)).st_mtime_ns) for f in files]
  before = stamp()
  assert gguf_weights.convert_gguf(loading.embedded_gguf_path()) == src
  assert stamp() == before  # the same files: a redone conversion renames fresh ones into place
  assert smollm.config == PRESETS["smollm2-135m-instruct"]


def test_bfloat16_policy(tiny_hf_dir):
  _, path = tiny_hf_dir
  p32, p16 = mj.load_policy(path, "float32"), mj.load_policy(path, "bfloat16")
  assert p16.model.embed[...].dtype == np.dtype("bfloat16")
  ids = np.arange(20)[None] % 128
  l32, l16 = np.asarray(p32.logits(ids)), np.asarray(p16.logits(ids))
  assert l16.dtype == np.float32 and 0 < np.abs(l32 - l16).max() < 0.1


def test_every_parameter_has_logical_axis_names():
  from flax import nnx
  for preset in ("tiny-qwen2", "tiny-qwen3"):  # biases; q/k norms
    model = mj.load_policy(f"random:{preset}").model
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
      axes = var.get_metadata().get("out_sharding")
      assert axes is not None and len(axes) == var[...].ndim, f"{path}: axes {axes}"


def test_preset_config_round_trips_through_hf_dict():
  for name, cfg in PRESETS.items():
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg, name
  assert 134e6 < PRESETS["smollm2-135m-instruct"].num_params < 136e6
  assert 7.0e9 < PRESETS["qwen2.5-7b-instruct"].num_params < 7.7e9
  assert 14.0e9 < PRESETS["qwen2.5-14b-instruct"].num_params < 15.0e9


# ---- bad input ----------------------------------------------------------------------------

def test_missing_weights_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.gguf|not found"):
    mj.load_policy(str(tmp_path / "nope.gguf"))
  with pytest.raises(FileNotFoundError, match="not found"):
    mj.load_policy(str(tmp_path / "missing_dir" / "model"))
  d = tmp_path / "empty"
  d.mkdir()
  with pytest.raises(mj.WeightsError, match="no config.json"):
    mj.load_policy(str(d))


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def test_corrupt_safetensors(tiny_hf_dir, tmp_path):
  _, path = tiny_hf_dir
  bad = _copy(path, tmp_path / "bad")
  weights = os.path.join(bad, "model.safetensors")
  with open(weights, "r+b") as f:  # truncate the data section
    f.truncate(os.path.getsize(weights) // 2)
  with pytest.raises(mj.WeightsError, match=r"model\.safetensors.*(truncated|corrupt)"):
    mj.load_policy(bad)
  with open(weights, "wb") as f:
    f.write(b"\x00garbage")
  with pytest.raises(mj.WeightsError, match=r"model\.safetensors.*corrupt"):
    mj.load_policy(bad)


def test_corrupt_gguf(tmp_path):
  bad = tmp_path / "broken.gguf"
  bad.write_bytes(b"GGUF" + os.urandom(200))
  with pytest.raises(mj.WeightsError, match="broken.gguf.*corrupt"):
    mj.load_policy(str(bad))


def test_tensor_shape_mismatch_names_tensor(tiny_hf_dir, tmp_path):
  _, path = tiny_hf_dir
  bad = _copy(path, tmp_path / "shape")
  cfg_path = os.path.join(bad, "config.json")
  hf = json.load(open(cfg_path))
  hf["intermediate_size"] = 100  # the weights were saved with 96
  json.dump(hf, open(cfg_path, "w"))
  with pytest.raises(mj.WeightsError, match=r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape "
                                            r"\(96, 64\) but the config expects \(100, 64\)"):
    mj.load_policy(bad)


def test_missing_tensor_names_tensor(tiny_hf_dir, tmp_path):
  from memagent_jax.models.safetensors_io import load_tensors, save_tensors
  _, path = tiny_hf_dir
  bad = _copy(path, tmp_path / "missing")
  weights = os.path.join(bad, "model.safetensors")
  tensors = {k: np.array(v) for k, v in load_tensors(weights).items() if "layers.1.mlp.up_proj" not in k}
  save_tensors(weights, tensors)
  with pytest.raises(mj.WeightsError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' not found"):
    mj.load_policy(bad)


def test_unknown_preset():
  with pytest.raises(KeyError, match="unknown model preset.*'qwen9-huge'.*known presets"):
    mj.load_policy("qwen9-huge")
  with pytest.raises(KeyError, match="unknown model preset 'nano'"):
    mj.load_policy("random:nano")
  with pytest.raises(ValueError, match="dtype"):
    mj.load_policy("random:tiny-llama", dtype="float16")


def test_prompt_longer_than_cache_and_cache_overflow():
  policy = mj.load_policy("random:tiny-llama")
  prompt = list(range(100))
  with pytest.raises(ValueError, match=r"prompt of 100 tokens is longer than the KV cache \(cache_size=64"):
    policy.sample([prompt], 8, params=GREEDY, cache_size=64)
  with pytest.raises(ValueError, match=r"max_new_tokens=40 would overflow the KV cache: prompt 100 \+ 40"):
    policy.sample([prompt], 40, params=GREEDY, cache_size=128)
  with pytest.raises(ValueError, match="exceeds the model's context window of 512"):
    policy.sample([list(range(200)) * 2], 200, params=GREEDY)
  with pytest.raises(ValueError, match="empty prompt"):
    policy.sample([[]], 4, params=GREEDY)
  with pytest.raises(ValueError, match=r"token ids must lie in \[0, 256\)"):
    policy.logits(np.array([[1, 999]]))


def test_export_replaces_the_directory_atomically(tmp_path):
  """A failed export leaves the previous one intact; a finished one leaves no stale shards."""
  policy = mj.load_policy("random:tiny-llama", seed=2)
  out = tmp_path / "export"
  policy.export(str(out))
  (out / "model-00001-of-00002.safetensors").write_bytes(b"stale shard")
  policy.export(str(out))
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  before = {f: (out / f).read_bytes() for f in os.listdir(out)}

  class DiskFullTokenizer:  # the disk fills up after the weights, while the tokenizer files are written
    bos_token_id = eos_token_id = pad_token_id = 0

    def save_pretrained(self, directory):
      open(os.path.join(directory, "tokenizer.json"), "wb").write(b"half")
      raise OSError(28, "No space left on device")
  model = mj.load_policy("random:tiny-llama", seed=3).model
  failing = mj.Policy(model, types.SimpleNamespace(hf=DiskFullTokenizer()))
  with pytest.raises(OSError, match="No space left"):
    failing.export(str(out))
  assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
  assert sorted(os.listdir(tmp_path)) == ["export"]  # no temporary directory left behind


def test_export_refuses_unrelated_directory_and_nan_weights(tmp_path):
  policy = mj.load_policy("random:tiny-llama")
  other = tmp_path / "notes"
  other.mkdir()
  (other / "todo.txt").write_text("keep me")
  with pytest.raises(FileExistsError, match=r"notes is not empty and holds no config\.json"):
    policy.export(str(other))
  assert os.listdir(other) == ["todo.txt"]
  policy.model.final_norm.scale[...] = np.full(policy.config.hidden_size, np.nan, np.float32)
  with pytest.raises(mj.WeightsError, match=r"tensor 'model\.norm\.weight' has 64 non-finite"):
    policy.export(str(tmp_path / "nan"))
  assert not os.path.exists(tmp_path / "nan")
