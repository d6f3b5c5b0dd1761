"""Read and write transformers-style model directories (config.json + *.safetensors), torch-free."""

from __future__ import annotations

import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.hf_layout import hf_layout
from memagent_jax.models.safetensors_io import WeightsError, load_tensors, read_header, save_tensors


def read_hf_config(model_dir: str) -> ModelConfig:
  path = os.path.join(model_dir, "config.json")
  if not os.path.isfile(path):
    raise WeightsError(f"model directory {model_dir!r} has no config.json")
  try:
    with open(path) as f:
      hf = json.load(f)
  except json.JSONDecodeError as e:
    raise WeightsError(f"{path}: not valid JSON ({e})") from None
  return ModelConfig.from_hf_dict(hf, source=path)


def _index_tensors(model_dir: str) -> dict[str, str]:
  """Tensor name -> the safetensors file that holds it (handles sharded checkpoints)."""
  files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
  if not files:
    raise WeightsError(f"model directory {model_dir!r} has no *.safetensors weights file")
  where = {}
  for path in files:
    header, _ = read_header(path)
    for name in header:
      where[name] = path
  return where


def load_hf_params(model_dir: str, cfg: ModelConfig, dtype) -> dict[tuple, np.ndarray]:
  """Every parameter in our layout, keyed by nnx state path, with shapes checked against cfg."""
  where = _index_tensors(model_dir)
  opened: dict[str, dict[str, np.ndarray]] = {}
  params = {}
  for spec in hf_layout(cfg):
    path = where.get(spec.hf_name)
    if path is None:
      raise WeightsError(f"{model_dir}: tensor {spec.hf_name!r} not found in any *.safetensors file")
    if path not in opened:
      opened[path] = load_tensors(path)
    a = opened[path][spec.hf_name]
    if tuple(a.shape) != spec.hf_shape:
      raise WeightsError(f"{path}: tensor {spec.hf_name!r} has shape {tuple(a.shape)} but the "
                         f"config expects {spec.hf_shape}")
    params[spec.path] = np.asarray(spec.to_ours(a)).astype(dtype)
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
  """Writes an HF directory that `transformers.AutoModelForCausalLM` loads with equal logits."""
  cfg = model.config
  np_dtype = np.dtype(jnp.dtype(dtype))
  params = model_params(model)
  tensors = {s.hf_name: np.asarray(s.to_hf(params[s.path])).astype(np_dtype) for s in hf_layout(cfg)}
  os.makedirs(out_dir, exist_ok=True)
  save_tensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
  hf = cfg.to_hf_dict(dtype=str(jnp.dtype(dtype)))
  if tokenizer is not None:
    hf.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id)
    tokenizer.save_pretrained(out_dir)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
