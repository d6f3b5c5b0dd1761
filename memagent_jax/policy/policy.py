"""`Policy`: a decoder, its tokenizer and compiled entry points (logits, sampling, generate)."""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memagent_jax.policy import sampling
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.models.decoder import Decoder, forward_logits
from memagent_jax.models.hf_weights import export_hf
from memagent_jax.text.tokenizer import Tokenizer

PROMPT_BUCKET = 64  # prompt lengths are padded up to a multiple of this to bound recompiles


def check_token_ids(ids: np.ndarray, vocab_size: int, what: str = "ids"):
  """Integer ids inside the vocabulary; float or bool ids are refused, never silently cast."""
  if ids.size and ids.dtype.kind not in "iu":
    raise TypeError(f"{what} must be integer token ids, got dtype {ids.dtype} "
                    "(float and bool arrays are not cast: convert explicitly)")
  if ids.size:
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
      raise ValueError(f"token ids must lie in [0, {vocab_size}) (the vocabulary size); {what} holds "
                       f"{lo if lo < 0 else hi} (range [{lo}, {hi}])")


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _logits(graphdef, state, ids, *, valid):
  return forward_logits(nnx.merge(graphdef, state), ids, valid)


class Policy:
  """The language model the agent runs and RL trains; wraps an NNX `Decoder`."""

  def __init__(self, model: Decoder, tokenizer: Tokenizer | None = None, name: str = ""):
    self.model = model
    self.tokenizer = tokenizer
    self.name = name
    self.graphdef, self.state = nnx.split(model)

  @property
  def config(self):
    return self.model.config

  @property
  def dtype(self):
    return self.model.dtype

  def _require_tokenizer(self):
    if self.tokenizer is None:
      raise ValueError(f"policy {self.name!r} has no tokenizer (its source shipped none); "
                       "pass token ids instead of text")
    return self.tokenizer

  def logits(self, ids, attention_mask=None):
    """ids [B, T] -> float32 logits [B, T, V]; attention_mask [B, T] marks left padding."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
      raise ValueError(f"ids must be [B, T], got shape {ids.shape}")
    if ids.shape[1] > self.config.max_position_embeddings:
      raise ValueError(f"ids of length {ids.shape[1]} exceed the model's context window of "
                       f"{self.config.max_position_embeddings} tokens")
    check_token_ids(ids, self.config.vocab_size)
    valid = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask, bool)
    return _logits(self.graphdef, self.state, jnp.asarray(ids, jnp.int32), valid=jnp.asarray(valid))

  def default_stop_tokens(self) -> list[int]:
    return self.tokenizer.stop_token_ids if self.tokenizer is not None else []

  def sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, params: DecodeSpec, *,
             seed: int = 0, stop_tokens: Sequence[int] | Sequence[Sequence[int]] | None = None,
             cache_size: int | None = None) -> sampling.Generation:
    """Token-level generation for ragged prompts (lists of ids, or a numpy/jax [B, T] array whose every id is
    real; params: a DecodeSpec, e.g. GREEDY); host numpy arrays out."""
    if len(prompts) == 0:
      raise ValueError("no prompts given")
    longest = max(len(p) for p in prompts)
    if min(len(p) for p in prompts) == 0:
      raise ValueError("empty prompt: every prompt needs at least one token")
    for i, p in enumerate(prompts):
      a = np.asarray(p)
      if a.ndim != 1:
        raise ValueError(f"prompt {i} must be a flat sequence of token ids, got shape {a.shape}")
      check_token_ids(a, self.config.vocab_size, f"prompt {i}")
    size = cache_size or sampling.round_up(longest, PROMPT_BUCKET) + max_new_tokens
    sampling.check_budget(prompt_len=longest, max_new_tokens=max_new_tokens, cache_size=size,
                          context=self.config.max_position_embeddings)
    width = max(longest, min(sampling.round_up(longest, PROMPT_BUCKET), size - max_new_tokens))
    pad = self.tokenizer.pad_token_id if self.tokenizer is not None else 0
    tokens, valid = sampling.left_pad(prompts, pad, width)
    stops = self.default_stop_tokens() if stop_tokens is None else stop_tokens
    rows = [list(s) for s in stops] if stops and not np.isscalar(stops[0]) else [list(stops)] * len(prompts)
    if len(rows) != len(prompts):
      raise ValueError(f"per-row stop_tokens has {len(rows)} rows for {len(prompts)} prompts")
    for i, r in enumerate(rows):
      if r and np.asarray(r).dtype.kind not in "iu":
        raise TypeError(f"stop_tokens of row {i} must be integer token ids, got dtype {np.asarray(r).dtype}")
    k = max(1, max(len(r) for r in rows))
    stop_arr = np.full((len(rows), k), -1, np.int32)
    for i, r in enumerate(rows):
      stop_arr[i, :len(r)] = r
    rows = sampling.PromptRows(tokens=jnp.asarray(tokens), valid=jnp.asarray(valid),
                               keys=sampling.row_keys(jax.random.PRNGKey(seed), np.arange(len(prompts))),
                               stop_tokens=jnp.asarray(stop_arr), inactive=jnp.zeros((len(prompts),), bool))
    out = sampling.generate_tokens(self.graphdef, self.state, rows, params, max_new_tokens=max_new_tokens,
                                   cache_size=size, pad_id=pad)
    return sampling.Generation(*jax.device_get(out))

  # Documented public API (DESIGN.md): greedy by default, like `MemAgent.answer`.
  def generate(self, prompts: Sequence[str], max_new_tokens: int, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int = 0, chat: bool = True) -> list[str]:
    """Strings in, strings out; chat=True wraps each prompt as one user turn."""
    tok = self._require_tokenizer()
    if isinstance(prompts, str):
      raise TypeError("generate takes a list of prompts; wrap a single prompt in a list")
    ids = [tok.apply_chat_template(p) if chat else tok.encode(p, add_special_tokens=True)
           for p in prompts]
    spec = DecodeSpec(temperature=temperature, top_p=top_p, top_k=top_k)
    out = self.sample(ids, max_new_tokens, params=spec, seed=seed)
    return [tok.decode_response(row[:n]) for row, n in zip(out.tokens, out.lengths)]

  def export(self, out_dir: str, dtype: str = "float32"):
    """Writes an HF safetensors directory that transformers loads with equal logits (a token-shift
    model, `ModelConfig.token_shift`, reloads with equal logits only through `load_policy`)."""
    export_hf(self.model, out_dir, self.tokenizer.hf if self.tokenizer else None, dtype)
