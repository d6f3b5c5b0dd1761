"""Broken model sources fail with an error naming the file and the tensor or key, never load."""

import json
import os
import re
import shutil

import numpy as np
import pytest

import memagent_jax as mj
from conftest import make_tiny_hf_dir
from memagent_jax.models import gguf_weights
from memagent_jax.models.config import UnknownModelError
from memagent_jax.models.safetensors_io import load_tensors, save_tensors

WeightsError = mj.WeightsError


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  """A tiny tied Llama checkpoint (2 layers, vocab 128) written by transformers."""
  return make_tiny_hf_dir(tmp_path_factory, "llama")


@pytest.fixture
def broken(llama_dir, tmp_path):
  """A fresh copy of the tiny checkpoint to break: (dir, config.json path, weights path)."""
  d = str(tmp_path / "model")
  shutil.copytree(llama_dir, d)
  return d, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors")


def _edit_config(path, **changes):
  hf = json.load(open(path))
  hf.update(changes)
  for k in [k for k, v in changes.items() if v is None]:
    del hf[k]
  json.dump(hf, open(path, "w"))


def _edit_tensors(path, fn):
  tensors = {k: np.array(v) for k, v in load_tensors(path).items()}
  fn(tensors)
  save_tensors(path, tensors)


def test_intact_copy_loads(broken):
  assert mj.load_policy(broken[0]).config.num_layers == 2


def test_config_with_fewer_layers_than_the_weights(broken):
  d, cfg, weights = broken
  _edit_config(cfg, num_hidden_layers=1)
  with pytest.raises(WeightsError, match=r"model\.safetensors: tensor 'model\.layers\.1\.[\w.]+' is not used"
                                         r".*config\.json.*hold 2 layers.*num_hidden_layers=1"):
    mj.load_policy(d)


def test_config_with_more_layers_than_the_weights(broken):
  d, cfg, _ = broken
  _edit_config(cfg, num_hidden_layers=3)
  with pytest.raises(WeightsError, match=r"tensor 'model\.layers\.2\.input_layernorm\.weight' not found in "
                                         r"any \*\.safetensors file \(model\.safetensors\); 9 of the 29 "
                                         r"tensors that .*config\.json requires are missing.*hold 2 layers"):
    mj.load_policy(d)


def test_extra_tensor_is_an_error(broken):
  d, _, weights = broken
  _edit_tensors(weights, lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros(3, np.float32)}))
  with pytest.raises(WeightsError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.extra\.weight' "
                                         r"is not used by the model that .*config\.json describes"):
    mj.load_policy(d)


def test_documented_extras_are_ignored(broken):
  """RoPE inv_freq buffers and a tied checkpoint's copy of the head load (see _ignored_extra)."""
  d, _, weights = broken
  ids = np.arange(10)[None]
  before = np.asarray(mj.load_policy(d).logits(ids))

  def add(t):
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
  _edit_tensors(weights, add)
  np.testing.assert_array_equal(np.asarray(mj.load_policy(d).logits(ids)), before)


def test_tied_head_that_differs_from_the_embedding(broken):
  d, _, weights = broken
  _edit_tensors(weights, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
  with pytest.raises(WeightsError, match=r"model\.safetensors: tensor 'lm_head\.weight' differs from "
                                         r"'model\.embed_tokens\.weight'.*tie_word_embeddings=true"):
    mj.load_policy(d)


def test_wrong_vocab_shape_names_tensor_and_shapes(broken):
  d, cfg, _ = broken
  _edit_config(cfg, vocab_size=130)
  with pytest.raises(WeightsError, match=r"model\.safetensors: tensor 'model\.embed_tokens\.weight' has "
                                         r"shape \(128, 64\) but the config expects \(130, 64\)"):
    mj.load_policy(d)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weight(broken, value):
  d, _, weights = broken

  def poison(t):
    t["model.layers.1.self_attn.v_proj.weight"][3, :2] = value
  _edit_tensors(weights, poison)
  with pytest.raises(WeightsError, match=r"model\.safetensors: tensor 'model\.layers\.1\.self_attn\.v_proj\."
                                         r"weight' has 2 non-finite values \(NaN or Inf\)"):
    mj.load_policy(d)


def test_bfloat16_nan_is_found(broken):
  import ml_dtypes
  d, _, weights = broken

  def to_bf16(t):
    for k in t:
      t[k] = t[k].astype(ml_dtypes.bfloat16)
    t["model.norm.weight"][5] = np.nan
  _edit_tensors(weights, to_bf16)
  with pytest.raises(WeightsError, match=r"tensor 'model\.norm\.weight' has 1 non-finite"):
    mj.load_policy(d, dtype="bfloat16")


def test_integer_tensor_is_an_error(broken):
  d, _, weights = broken
  _edit_tensors(weights, lambda t: t.update({"model.norm.weight": np.ones(64, np.int32)}))
  with pytest.raises(WeightsError, match=r"model\.safetensors: tensor 'model\.norm\.weight' has dtype I32"):
    mj.load_policy(d)


def test_tensor_stored_in_two_shards(broken):
  d, _, weights = broken
  save_tensors(os.path.join(d, "extra.safetensors"), {"model.norm.weight": np.ones(64, np.float32)})
  with pytest.raises(WeightsError, match=r"'model\.norm\.weight' is stored twice, in .*\.safetensors and "
                                         r".*\.safetensors"):
    mj.load_policy(d)


def test_shard_index_naming_an_absent_file(broken):
  d, _, _ = broken
  index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
  json.dump(index, open(os.path.join(d, "model.safetensors.index.json"), "w"))
  with pytest.raises(WeightsError, match=r"index\.json lists 1 shard files that are absent: "
                                         r"'model-00002-of-00002\.safetensors'"):
    mj.load_policy(d)


@pytest.mark.parametrize("header, why", [
    (b"[1, 2]", r"a JSON list, not an object"),
    (b'{"model.norm.weight": {"dtype": "F32", "shape": [64]}}',
     r"'model\.norm\.weight' has data_offsets None"),
    (b'{"model.norm.weight": {"dtype": "Q4", "shape": [64], "data_offsets": [0, 256]}}',
     r"'model\.norm\.weight' has unsupported dtype 'Q4'"),
    (b'{"model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}',
     r"'model\.norm\.weight' is truncated or corrupt"),
])
def test_malformed_safetensors_header(broken, header, why):
  d, _, weights = broken
  import struct
  with open(weights, "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + b"\0" * 16)
  with pytest.raises(WeightsError, match=r"model\.safetensors.*" + why):
    mj.load_policy(d)


def test_truncated_and_garbage_safetensors(broken):
  d, _, weights = broken
  data = open(weights, "rb").read()
  open(weights, "wb").write(data[:len(data) - 100])
  with pytest.raises(WeightsError, match=r"model\.safetensors: tensor '[\w.]+' is truncated or corrupt"):
    mj.load_policy(d)
  open(weights, "wb").write(os.urandom(64))
  with pytest.raises(WeightsError, match=r"model\.safetensors: corrupt safetensors"):
    mj.load_policy(d)
  open(weights, "wb").write(b"")
  with pytest.raises(WeightsError, match=r"model\.safetensors: corrupt safetensors file \(0 bytes"):
    mj.load_policy(d)


# ---- config.json -------------------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("{not json", r"config\.json: not valid JSON"),
    ("", r"config\.json: not valid JSON"),
    ("[1, 2]", r"config\.json: expected a JSON object, got a JSON list"),
])
def test_invalid_config_json(broken, text, why):
  d, cfg, _ = broken
  open(cfg, "w").write(text)
  with pytest.raises(WeightsError, match=why):
    mj.load_policy(d)


def test_config_json_not_utf8(broken):
  d, cfg, _ = broken
  open(cfg, "wb").write(b'{"a": "\xff\xfe"}')
  with pytest.raises(WeightsError, match=r"config\.json: not valid JSON"):
    mj.load_policy(d)


@pytest.mark.parametrize("changes, why", [
    (dict(vocab_size=None), r"config\.json: missing required key 'vocab_size'"),
    (dict(num_attention_heads=None), r"config\.json: missing required key 'num_attention_heads'"),
    (dict(num_hidden_layers="two"), r"config\.json: num_hidden_layers='two' must be a positive integer"),
    (dict(num_key_value_heads=0), r"config\.json: num_key_value_heads=0 must be a positive integer"),
    (dict(hidden_size=64.5), r"config\.json: hidden_size=64\.5 must be a positive integer"),
    (dict(rms_norm_eps=-1), r"config\.json: rms_norm_eps=-1 must be a positive finite number"),
    (dict(num_key_value_heads=3), r"config\.json: .*num_heads=4 is not a multiple of num_kv_heads=3"),
    (dict(model_type="gpt2"), r"config\.json: model_type='gpt2' is not supported"),
    (dict(rope_scaling={"rope_type": "llama3"}), r"config\.json: rope_scaling=.* is not supported"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
     r"config\.json: rope_parameters=.* is not supported"),
])
def test_config_missing_or_bad_keys(broken, changes, why):
  d, cfg, _ = broken
  _edit_config(cfg, **changes)
  with pytest.raises(WeightsError, match=why):
    mj.load_policy(d)


# ---- paths ---------------------------------------------------------------------------------

def test_missing_empty_and_weightless_paths(tmp_path, llama_dir):
  with pytest.raises(FileNotFoundError, match=r"model source not found: .*nowhere"):
    mj.load_policy(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match=r"GGUF file not found: .*nope\.gguf"):
    mj.load_policy(str(tmp_path / "nope.gguf"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(WeightsError, match=r"model directory '.*empty' has no config\.json \(is empty\)"):
    mj.load_policy(str(tmp_path / "empty"))
  (tmp_path / "cfg_only").mkdir()
  shutil.copy(os.path.join(llama_dir, "config.json"), tmp_path / "cfg_only")
  with pytest.raises(WeightsError, match=r"model directory '.*cfg_only' has no \*\.safetensors weights file"):
    mj.load_policy(str(tmp_path / "cfg_only"))
  with pytest.raises(WeightsError, match=r"model source .*model\.safetensors is a file but not a \.gguf"):
    mj.load_policy(os.path.join(llama_dir, "model.safetensors"))


def test_corrupt_tokenizer_names_directory(broken):
  d, _, _ = broken
  open(os.path.join(d, "tokenizer.json"), "w").write("{garbage")
  with pytest.raises(WeightsError, match=r"model[/\\]?: the tokenizer files could not be read"):
    mj.load_policy(d)


def test_unknown_preset_is_key_and_value_error():
  for source, pattern in (("qwen9-huge", r"unknown model preset or source 'qwen9-huge'"),
                          ("random:nano", r"unknown model preset 'nano'; known presets: .*tiny-llama")):
    with pytest.raises(UnknownModelError, match=pattern) as info:
      mj.load_policy(source)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value).startswith("unknown model preset")  # not quoted like a plain KeyError


def test_hub_id_offline_lists_local_sources(monkeypatch):
  import huggingface_hub
  from huggingface_hub.errors import LocalEntryNotFoundError

  def offline(*args, **kwargs):
    raise LocalEntryNotFoundError("Connection error, and we cannot find the requested files\nin the cache.")
  monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
  with pytest.raises(WeightsError) as info:
    mj.load_policy("someorg/somemodel")
  msg = str(info.value)
  assert "\n" not in msg
  assert "cannot download 'someorg/somemodel'" in msg and "no network connection" in msg
  assert "smollm2-135m-instruct" in msg and ".gguf" in msg and "config.json" in msg


# ---- GGUF ----------------------------------------------------------------------------------

def _write_gguf(path, blocks=1, block_count=1, tensor_fn=None, extra_tensors=()):
  """A tiny Llama GGUF (no tokenizer) whose tensors are float32."""
  import gguf
  e, f, heads = 16, 32, 2
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(block_count)
  w.add_embedding_length(e)
  w.add_feed_forward_length(f)
  w.add_head_count(heads)
  w.add_head_count_kv(heads)
  w.add_context_length(64)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_vocab_size(8)
  rng = np.random.default_rng(0)
  tensors = {"token_embd.weight": (8, e), "output_norm.weight": (e,)}
  for i in range(blocks):
    tensors.update({f"blk.{i}.attn_norm.weight": (e,), f"blk.{i}.ffn_norm.weight": (e,),
                    f"blk.{i}.attn_q.weight": (e, e), f"blk.{i}.attn_k.weight": (e, e),
                    f"blk.{i}.attn_v.weight": (e, e), f"blk.{i}.attn_output.weight": (e, e),
                    f"blk.{i}.ffn_gate.weight": (f, e), f"blk.{i}.ffn_up.weight": (f, e),
                    f"blk.{i}.ffn_down.weight": (e, f)})
  tensors.update(dict(extra_tensors))
  arrays = {k: rng.standard_normal(s).astype(np.float32) for k, s in tensors.items()}
  if tensor_fn:
    tensor_fn(arrays)
  for k, a in arrays.items():
    w.add_tensor(k, a)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


@pytest.fixture
def gguf_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path / "cache"))
  return tmp_path


def test_gguf_non_finite_tensor(gguf_cache):
  def poison(t):
    t["blk.0.ffn_up.weight"][1, 2] = np.nan
  path = _write_gguf(gguf_cache / "nan.gguf", tensor_fn=poison)
  with pytest.raises(WeightsError, match=r"nan\.gguf: tensor 'blk\.0\.ffn_up\.weight' has 1 non-finite"):
    mj.load_policy(path)
  cache = gguf_cache / "cache" / "gguf"
  assert not cache.exists() or not os.listdir(cache)  # nothing cached


def test_gguf_blocks_beyond_block_count(gguf_cache):
  path = _write_gguf(gguf_cache / "extra.gguf", blocks=2, block_count=1)
  with pytest.raises(WeightsError, match=r"extra\.gguf: tensor 'model\.layers\.1\.[\w.]+' \(HF name\) is not "
                                         r"used by the model"):
    mj.load_policy(path)
  path = _write_gguf(gguf_cache / "short.gguf", blocks=1, block_count=2)
  with pytest.raises(WeightsError,
                     match=r"short\.gguf: tensor 'model\.layers\.1\.[\w.]+' \(HF name\) is missing"):
    mj.load_policy(path)


def test_gguf_unknown_tensor_and_rope_freqs(gguf_cache):
  path = _write_gguf(gguf_cache / "odd.gguf", extra_tensors={"mystery.weight": (4,)})
  with pytest.raises(WeightsError, match=r"odd\.gguf: tensor 'mystery\.weight' is not a parameter"):
    mj.load_policy(path)
  path = _write_gguf(gguf_cache / "rope.gguf", extra_tensors={"rope_freqs.weight": (4,)})
  with pytest.raises(WeightsError, match=r"rope\.gguf: RoPE scaling \(rope_freqs\) is not supported"):
    mj.load_policy(path)


def test_garbage_empty_and_truncated_gguf(gguf_cache):
  for name, data in (("garbage.gguf", b"GGUF" + os.urandom(300)), ("empty.gguf", b""),
                     ("text.gguf", b"this is not a model\n" * 20)):
    (gguf_cache / name).write_bytes(data)
    with pytest.raises(WeightsError, match=rf"{name.replace('.', '[.]')}: corrupt"):
      mj.load_policy(str(gguf_cache / name))
  good = open(_write_gguf(gguf_cache / "good.gguf"), "rb").read()
  (gguf_cache / "cut.gguf").write_bytes(good[:len(good) * 2 // 3])
  with pytest.raises(WeightsError, match=r"cut\.gguf: "):
    mj.load_policy(str(gguf_cache / "cut.gguf"))


def test_corrupt_cached_conversion_says_how_to_rebuild(gguf_cache, llama_dir):
  gguf_path = _write_gguf(gguf_cache / "m.gguf")
  cached = gguf_weights.conversion_dir(gguf_path)  # a finished conversion whose weights were damaged since
  shutil.copytree(llama_dir, cached)
  open(os.path.join(cached, "COMPLETE"), "w").write(gguf_path + "\n")
  open(os.path.join(cached, "model.safetensors"), "wb").write(b"junk")
  converted = re.escape(os.path.basename(cached))
  with pytest.raises(WeightsError, match=rf"{converted}[/\\]model\.safetensors: corrupt.*cached conversion of "
                                         rf".*m\.gguf; delete .*{converted} to convert it again"):
    mj.load_policy(gguf_path)
  assert gguf_weights.CONVERTER_VERSION >= 2
