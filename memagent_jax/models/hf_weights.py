"""Read and write transformers-style model directories (config.json + *.safetensors), torch-free."""

from __future__ import annotations

import glob
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from memagent_jax.runtime.atomic_io import atomic_directory
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.hf_layout import TensorSpec, hf_layout
from memagent_jax.models.safetensors_io import (WeightsError, check_finite, count_nonfinite, load_tensors,
                                                read_header, save_tensors)


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
WEIGHT_FILES = "config.json and *.safetensors weights"


def _listing(names: list[str], k: int = 5) -> str:
  """The first k names and how many more: long lists stay readable without hiding the count."""
  shown = ", ".join(repr(n) for n in names[:k])
  return shown + (f" and {len(names) - k} more" if len(names) > k else "")


def _ignored_extra(name: str, cfg: ModelConfig) -> bool:
  """Tensors a checkpoint may hold that the model does not read (all others are an error)."""
  # Older transformers saved each layer's RoPE buffer; we recompute it from rope_theta.
  if name.endswith(".rotary_emb.inv_freq"):
    return True
  # Some tied checkpoints also store the head; load_hf_params checks it equals the embedding.
  return cfg.tie_word_embeddings and name == "lm_head.weight"


def read_hf_config(model_dir: str) -> ModelConfig:
  """The ModelConfig of a model directory's config.json; errors name the file and the key."""
  path = os.path.join(model_dir, "config.json")
  if not os.path.isfile(path):
    held = sorted(os.listdir(model_dir))
    what = f"holds {_listing(held)}" if held else "is empty"
    raise WeightsError(f"model directory {model_dir!r} has no config.json ({what}); a model directory "
                       f"holds {WEIGHT_FILES}")
  try:
    with open(path, encoding="utf-8") as f:
      hf = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise WeightsError(f"{path}: not valid JSON ({e})") from None
  try:
    return ModelConfig.from_hf_dict(hf, source=path)
  except ValueError as e:
    raise WeightsError(str(e)) from None


def _check_shard_index(model_dir: str, files: list[str]):
  """A sharded checkpoint's index must not list shard files that are absent."""
  index = os.path.join(model_dir, "model.safetensors.index.json")
  if not os.path.isfile(index):
    return
  try:
    with open(index, encoding="utf-8") as f:
      shards = set(json.load(f)["weight_map"].values())
  except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
    raise WeightsError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})") from None
  absent = sorted(shards - {os.path.basename(p) for p in files})
  if absent:
    raise WeightsError(f"{index} lists {len(absent)} shard files that are absent: {_listing(absent)}")


def _index_tensors(model_dir: str) -> dict[str, tuple[str, dict]]:
  """Tensor name -> (the safetensors file that holds it, its header entry); handles shards."""
  files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
  if not files:
    raise WeightsError(f"model directory {model_dir!r} has no *.safetensors weights file "
                       f"(a model directory holds {WEIGHT_FILES})")
  _check_shard_index(model_dir, files)
  where = {}
  for path in files:
    header, _ = read_header(path)
    for name, entry in header.items():
      if name in where:
        raise WeightsError(f"tensor {name!r} is stored twice, in {where[name][0]} and {path}")
      where[name] = (path, entry)
  return where


def _layer_hint(cfg: ModelConfig, where: dict, cfg_path: str) -> str:
  """Names the layer-count mismatch, the commonest reason for missing or extra tensors."""
  layers = {int(m.group(1)) for n in where for m in [re.match(r"model\.layers\.(\d+)\.", n)] if m}
  held = max(layers) + 1 if layers else 0
  if held == cfg.num_layers:
    return ""
  return f"; the weights hold {held} layers but {cfg_path} says num_hidden_layers={cfg.num_layers}"


def check_tensors(model_dir: str, cfg: ModelConfig, specs: list[TensorSpec], where: dict):
  """Every tensor the config needs is present with its shape and a float dtype; no unused extras.
  Uses only the file headers, so a mismatch is reported before any data is read."""
  cfg_path = os.path.join(model_dir, "config.json")
  missing = [s.hf_name for s in specs if s.hf_name not in where]
  if missing:
    files = ", ".join(sorted({os.path.basename(p) for p, _ in where.values()}))
    raise WeightsError(f"{model_dir}: tensor {missing[0]!r} not found in any *.safetensors file ({files}); "
                       f"{len(missing)} of the {len(specs)} tensors that {cfg_path} requires are missing: "
                       f"{_listing(missing)}{_layer_hint(cfg, where, cfg_path)}")
  needed = {s.hf_name for s in specs}
  extra = sorted(n for n in where if n not in needed and not _ignored_extra(n, cfg))
  if extra:
    raise WeightsError(f"{where[extra[0]][0]}: tensor {extra[0]!r} is not used by the model that {cfg_path} "
                       f"describes; {len(extra)} unused tensors: {_listing(extra)}"
                       f"{_layer_hint(cfg, where, cfg_path)}")
  tied_head = where.get("lm_head.weight") if cfg.tie_word_embeddings else None
  checks = [(s.hf_name, s.hf_shape) for s in specs]
  if tied_head:  # a stored copy of the tied head has the embedding's shape
    checks.append(("lm_head.weight", (cfg.vocab_size, cfg.hidden_size)))
  for name, shape in checks:
    path, entry = where[name]
    if tuple(entry["shape"]) != shape:
      raise WeightsError(f"{path}: tensor {name!r} has shape {tuple(entry['shape'])} but the config "
                         f"expects {shape} ({cfg_path})")
    if entry["dtype"] not in FLOAT_DTYPES:
      raise WeightsError(f"{path}: tensor {name!r} has dtype {entry['dtype']}; weights must be one of "
                         f"{', '.join(FLOAT_DTYPES)}")


def load_hf_params(model_dir: str, cfg: ModelConfig, dtype) -> dict[tuple, np.ndarray]:
  """Every parameter in our layout, keyed by nnx state path, checked against cfg (names, shapes,
  dtypes, no unused tensors) and finite; errors name the file and the tensor."""
  where = _index_tensors(model_dir)
  specs = hf_layout(cfg)
  check_tensors(model_dir, cfg, specs, where)
  opened: dict[str, dict[str, np.ndarray]] = {}

  def tensor(name):
    path = where[name][0]
    if path not in opened:
      opened[path] = load_tensors(path)
    return path, opened[path][name]

  params = {}
  for spec in specs:
    path, a = tensor(spec.hf_name)
    out = np.asarray(spec.to_ours(a)).astype(dtype)
    if count_nonfinite(out):
      check_finite(a, path, spec.hf_name)  # NaN/Inf in the file itself
      raise WeightsError(f"{path}: tensor {spec.hf_name!r} overflows {np.dtype(dtype)} when converted")
    params[spec.path] = out
  if cfg.tie_word_embeddings and "lm_head.weight" in where:
    (path, head), (_, embed) = tensor("lm_head.weight"), tensor("model.embed_tokens.weight")
    if not np.array_equal(head, embed):
      raise WeightsError(f"{path}: tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' but "
                         f"{os.path.join(model_dir, 'config.json')} says tie_word_embeddings=true "
                         "(set it to false to use the separate output head)")
  return params


def build_model(cfg: ModelConfig, params: dict[tuple, np.ndarray], dtype) -> Decoder:
  """A Decoder whose parameters are `params` (no random initialisation is run)."""
  abstract = nnx.eval_shape(lambda: Decoder(cfg, dtype, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  nested = traverse_util.unflatten_dict({k: jnp.asarray(v, dtype) for k, v in params.items()})
  nnx.replace_by_pure_dict(state, nested)
  return nnx.merge(graphdef, state)


def model_params(model: Decoder) -> dict[tuple, np.ndarray]:
  """Our parameters as host numpy arrays keyed by nnx state path."""
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return {k: np.asarray(jax.device_get(v)) for k, v in traverse_util.flatten_dict(pure).items()}


def export_hf(model: Decoder, out_dir: str, tokenizer=None, dtype: str = "float32"):
  """Writes an HF directory that `transformers.AutoModelForCausalLM` loads with equal logits.
  Written beside `out_dir` and swapped in whole on success: a failure leaves `out_dir` as it was."""
  if (os.path.isdir(out_dir) and os.listdir(out_dir)
      and not os.path.isfile(os.path.join(out_dir, "config.json"))):
    raise FileExistsError(f"export directory {out_dir} is not empty and holds no config.json; export "
                          "replaces the whole directory, so pass a new or empty one (or an earlier export)")
  cfg = model.config
  np_dtype = np.dtype(jnp.dtype(dtype))
  params = model_params(model)
  tensors = {s.hf_name: np.asarray(s.to_hf(params[s.path])).astype(np_dtype) for s in hf_layout(cfg)}
  for name, a in tensors.items():  # never publish a checkpoint that would not load back
    check_finite(a, out_dir, name)
  hf = cfg.to_hf_dict(dtype=str(jnp.dtype(dtype)))
  with atomic_directory(out_dir) as tmp:
    save_tensors(os.path.join(tmp, "model.safetensors"), tensors, {"format": "pt"})
    if tokenizer is not None:
      hf.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
      tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2)
