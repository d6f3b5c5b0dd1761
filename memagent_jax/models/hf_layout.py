"""The map between our parameter tree and transformers' Llama/Qwen2/Qwen3 tensor names and layouts."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from memagent_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  path: tuple  # our nnx state path, e.g. ("layers", 3, "attn", "q")
  hf_name: str  # e.g. "model.layers.3.self_attn.q_proj.weight"
  hf_shape: tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def hf_layout(cfg: ModelConfig) -> list[TensorSpec]:
  """Every tensor the model needs, with its HF name, HF shape and layout converters."""
  e, f, h, k, d, v = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                      cfg.head_dim, cfg.vocab_size)
  same = lambda a: a
  transpose = lambda a: a.T
  specs = [TensorSpec(("embed",), "model.embed_tokens.weight", (v, e), same, same),
           TensorSpec(("final_norm", "scale"), "model.norm.weight", (e,), same, same)]
  if not cfg.tie_word_embeddings:
    specs.append(TensorSpec(("lm_head",), "lm_head.weight", (v, e), transpose, transpose))
  if cfg.token_shift:  # ours only (config key memagent_token_shift): [N, V, E] both ways
    specs.append(TensorSpec(("token_shift",), "model.token_shift.weight", (cfg.token_shift, v, e), same, same))

  def proj_in(heads):  # HF [heads*D, E] <-> ours [E, heads, D]
    return (lambda a: a.T.reshape(e, heads, d), lambda a: a.reshape(e, heads * d).T)

  for i in range(cfg.num_layers):
    p, n = ("layers", i), f"model.layers.{i}."
    specs += [
        TensorSpec(p + ("attn_norm", "scale"), n + "input_layernorm.weight", (e,), same, same),
        TensorSpec(p + ("mlp_norm", "scale"), n + "post_attention_layernorm.weight", (e,), same, same),
        TensorSpec(p + ("attn", "q"), n + "self_attn.q_proj.weight", (h * d, e), *proj_in(h)),
        TensorSpec(p + ("attn", "k"), n + "self_attn.k_proj.weight", (k * d, e), *proj_in(k)),
        TensorSpec(p + ("attn", "v"), n + "self_attn.v_proj.weight", (k * d, e), *proj_in(k)),
        TensorSpec(p + ("attn", "o"), n + "self_attn.o_proj.weight", (e, h * d),
                   lambda a: a.T.reshape(h, d, e), lambda a: a.reshape(h * d, e).T),
        TensorSpec(p + ("mlp", "gate"), n + "mlp.gate_proj.weight", (f, e), transpose, transpose),
        TensorSpec(p + ("mlp", "up"), n + "mlp.up_proj.weight", (f, e), transpose, transpose),
        TensorSpec(p + ("mlp", "down"), n + "mlp.down_proj.weight", (e, f), transpose, transpose),
    ]
    if cfg.qk_norm:  # [D] both ways
      specs += [TensorSpec(p + ("attn", f"{name}_norm", "scale"), n + f"self_attn.{name}_norm.weight", (d,),
                           same, same) for name in ("q", "k")]
    if cfg.attention_bias:
      for name, heads in (("q", h), ("k", k), ("v", k)):
        specs.append(TensorSpec(p + ("attn", f"{name}_bias"), n + f"self_attn.{name}_proj.bias",
                                (heads * d,), lambda a, hh=heads: a.reshape(hh, d),
                                lambda a: a.reshape(-1)))
  return specs
