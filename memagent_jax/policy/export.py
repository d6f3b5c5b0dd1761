"""`memagent export`: a training checkpoint's params as an HF directory that transformers loads."""

from __future__ import annotations

import jax.numpy as jnp
from etils import epath
from flax import nnx

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.hf_weights import export_hf
from memagent_jax.policy.loading import load_tokenizer
from memagent_jax.runtime.checkpointing import Checkpointer


def export_checkpoint(ckpt_dir, out_dir, step: int | None = None, dtype: str = "float32") -> int:
  """Writes the params of a checkpoint step as an HF directory (config.json + safetensors
  [+ tokenizer]) that transformers loads; returns the exported step."""
  if not epath.Path(ckpt_dir).is_dir():
    raise FileNotFoundError(f"checkpoint directory not found: {ckpt_dir}")
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  try:
    step, meta = ckpt.restore_meta(step)
    mc = meta.get("model_config")
    if not isinstance(mc, dict):
      raise ValueError(f"checkpoint {ckpt.step_dir(step)}: meta has no 'model_config' dict")
    try:
      cfg = ModelConfig(**mc)
    except (TypeError, ValueError) as e:
      raise ValueError(f"checkpoint {ckpt.step_dir(step)}: model_config is not a valid "
                       f"ModelConfig ({e})") from None
    abstract = nnx.eval_shape(lambda: Decoder(cfg, jnp.float32, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    params, _ = ckpt.restore_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)), step)
  finally:
    ckpt.close()
  nnx.replace_by_pure_dict(state, params)
  model = nnx.merge(graphdef, state)
  source = meta.get("tokenizer_source")
  tokenizer = load_tokenizer(source).hf if source else None
  export_hf(model, str(out_dir), tokenizer, dtype)
  return step
