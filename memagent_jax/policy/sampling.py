"""Compiled generation: one jitted prefill plus a `lax.while_loop` decode over a static KV cache.

Rows are left-padded; each row's positions come from its mask, so a batch decodes exactly
as each prompt would alone. The loop exits as soon as every row has emitted a stop token.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memagent_jax.models.decoder import LayerCache, init_cache, positions_from_mask


# Public (`mj.SamplingParams`, README): the defaults of the documented `Policy.generate`, greedy, no filter.
@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
  """temperature 0 = greedy; top_k 0 = off; top_p 1 = off."""
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature} must be >= 0")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k} must be >= 0")


GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0)  # argmax decoding, no truncation


class Generation(NamedTuple):
  tokens: jax.Array  # [B, N] generated ids (stop token included), pad after it
  logprobs: jax.Array  # [B, N] log p(token) under the model (temperature 1, no truncation)
  sample_logprobs: jax.Array  # [B, N] log p(token) under the sampled distribution (0 if greedy)
  lengths: jax.Array  # [B] generated tokens per row, stop token included
  stopped: jax.Array  # [B] True if the row emitted a stop token (False: hit max_new_tokens)
  steps: jax.Array  # [] decode iterations run (< N when every row stopped early)


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, length: int | None = None):
  """Ragged ids -> (tokens [B, P] int32, valid [B, P] bool), right-aligned."""
  p = length or max(len(s) for s in seqs)
  tokens = np.full((len(seqs), p), pad_id, np.int32)
  valid = np.zeros((len(seqs), p), bool)
  for i, s in enumerate(seqs):
    if len(s):
      tokens[i, p - len(s):] = s
      valid[i, p - len(s):] = True
  return tokens, valid


def process_logits(logits, temperature, top_p, *, top_k: int, use_top_p: bool):
  """Temperature, then top-k, then top-p (nucleus) on float32 logits [B, V]."""
  x = logits / temperature
  if top_k > 0:
    kth = jax.lax.top_k(x, top_k)[0][:, -1:]
    x = jnp.where(x < kth, -jnp.inf, x)
  if use_top_p:
    desc = -jnp.sort(-x, axis=-1)
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)  # >= 1
    threshold = jnp.take_along_axis(desc, n_keep - 1, axis=-1)
    x = jnp.where(x < threshold, -jnp.inf, x)
  return x


def row_keys(key, row_ids):
  """Row r's key is fold_in(key, row_ids[r]): a row samples the same tokens whatever batch,
  device or process it lands in. key: raw uint32 [2]; row_ids [B] -> keys [B, 2]."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(row_ids, jnp.uint32))


def fold_rows(keys, data):
  """fold_in(keys[r], data) for every row: keys [B, 2] -> [B, 2]."""
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, data)


def _pick(logits, keys, *, temperature, top_p, greedy, top_k, use_top_p):
  """One token per row (row r drawn with keys[r] alone), with its model log-prob and its
  sampling log-prob. logits [B, V], keys [B, 2]."""
  model_lp = jax.nn.log_softmax(logits, axis=-1)
  if greedy:
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    sample_lp = jnp.zeros(tok.shape, jnp.float32)
  else:
    x = process_logits(logits, temperature, top_p, top_k=top_k, use_top_p=use_top_p)
    tok = jax.vmap(jax.random.categorical)(keys, x).astype(jnp.int32)
    sample_lp = jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), tok[:, None], axis=-1)[:, 0]
  lp = jnp.take_along_axis(model_lp, tok[:, None], axis=-1)[:, 0]
  return tok, lp, sample_lp


def prefix_cache(model, prefix) -> list[LayerCache]:
  """KV (and token history) of one shared prompt prefix [L], computed once: [1, K, L, D] per layer.
  Every prompt that starts with it (left padding aside) holds these keys, since positions count
  from a row's first real token."""
  ids = jnp.asarray(prefix, jnp.int32)[None, :]  # [1, L]
  cache = init_cache(model.config, 1, ids.shape[1], model.dtype)
  _, cache = model(ids, jnp.arange(ids.shape[1])[None, :], jnp.ones(ids.shape, bool), cache, 0)
  return cache


def cache_with_prefix(model, prefix: list[LayerCache], tokens, valid, cache_size: int):
  """A fresh cache [B, ., cache_size, .] whose first L slots hold each row's share of the prefix.

  Row b's real tokens start at its first valid slot f_b (left padding; a training row may also be
  right-padded after its response), so slot s < L holds prefix token s - f_b (padding where that
  is negative: key_valid masks it). Differentiable in the prefix's keys and values."""
  b = tokens.shape[0]
  l = prefix[0].k.shape[2]
  cache = init_cache(model.config, b, cache_size, model.dtype)
  first = jnp.argmax(valid, axis=1)  # [B]: first real slot (0 for an all-padding row)
  index = jnp.clip(jnp.arange(l)[None, :] - first[:, None], 0, l - 1)  # [B, L]

  def put(buf, shared):  # shared [1, K, L, D] -> each row's slots 0..L-1 of buf [B, K, S, D]
    rows = jnp.take(shared[0], index, axis=1).transpose(1, 0, 2, 3)  # [B, K, L, D]
    return jax.lax.dynamic_update_slice(buf, rows.astype(buf.dtype), (0, 0, 0, 0))

  out = []
  for layer, pre in zip(cache, prefix):
    history = layer.tokens
    if history is not None:  # token-shift history: the prompt's own ids
      history = jax.lax.dynamic_update_slice(history, tokens[:, :l].astype(jnp.int32), (0, 0))
    out.append(LayerCache(put(layer.k, pre.k), put(layer.v, pre.v), history))
  return out


def prefill(model, tokens, valid, *, cache_size: int, prefix: list[LayerCache] | None = None):
  """Runs left-padded prompts [B, P] into a fresh cache of `cache_size` slots.

  With `prefix` (see `prefix_cache`: every row's real tokens start with its L ids), the first L
  slots are copied from it and only slots L.. run through the model: slots a row's prefix spills
  into are recomputed, exactly. Returns (next-token logits [B, V] float32, cache)."""
  if prefix is None:
    cache = init_cache(model.config, tokens.shape[0], cache_size, model.dtype)
    hidden, cache = model(tokens, positions_from_mask(valid), valid, cache, 0)
    return model.logits(hidden[:, -1]), cache
  l = prefix[0].k.shape[2]
  if tokens.shape[1] <= l:
    raise ValueError(f"prompts of {tokens.shape[1]} slots leave nothing after the {l}-token shared prefix")
  cache = cache_with_prefix(model, prefix, tokens, valid, cache_size)
  hidden, cache = model(tokens[:, l:], positions_from_mask(valid)[:, l:], valid, cache, l)
  return model.logits(hidden[:, -1]), cache


def sample_from_prompts(model, tokens, valid, *, stop_tokens, keys, temperature, top_p, done,
                        max_new_tokens: int, cache_size: int, greedy: bool, top_k: int,
                        use_top_p: bool, pad_id: int, prefix: list[LayerCache] | None = None) -> Generation:
  """Traceable core of generation (used inside `generate_tokens` and the agent's `lax.scan`).

  tokens, valid [B, P] left-padded; stop_tokens [B, K] (-1 = none); keys [B, 2] one PRNG key
  per row (token t of row r uses fold_in(keys[r], t)); done [B] rows that generate nothing
  (inactive); prefix: the KV of a prefix every prompt starts with (see `prefill`). Needs
  P + max_new_tokens <= cache_size.
  """
  b, p = tokens.shape
  n = max_new_tokens
  logits, cache = prefill(model, tokens, valid, cache_size=cache_size, prefix=prefix)
  key_valid = jnp.zeros((b, cache_size), bool).at[:, :p].set(valid)

  def cond(c):
    return (c["step"] < n) & ~jnp.all(c["done"])

  def body(c):
    step = c["step"]
    tok, lp, slp = _pick(c["logits"], fold_rows(keys, step), temperature=temperature, top_p=top_p,
                         greedy=greedy, top_k=top_k, use_top_p=use_top_p)
    live = ~c["done"]
    tok = jnp.where(live, tok, pad_id)
    col = lambda buf, v: jax.lax.dynamic_update_slice(buf, v[:, None].astype(buf.dtype), (0, step))
    done = c["done"] | (live & jnp.any(tok[:, None] == stop_tokens, axis=-1))
    slot = p + step
    kv = jax.lax.dynamic_update_slice(c["key_valid"], jnp.ones((b, 1), bool), (0, slot))
    h, cache = model(tok[:, None], c["pos"][:, None], kv, c["cache"], slot)
    return dict(step=step + 1, done=done, pos=c["pos"] + 1, key_valid=kv, cache=cache,
                logits=model.logits(h[:, 0]), tokens=col(c["tokens"], tok),
                lp=col(c["lp"], jnp.where(live, lp, 0.0)), slp=col(c["slp"], jnp.where(live, slp, 0.0)),
                lengths=c["lengths"] + live.astype(jnp.int32))

  init = dict(step=jnp.int32(0), done=done, pos=jnp.sum(valid, 1).astype(jnp.int32),
              key_valid=key_valid, cache=cache, logits=logits,
              tokens=jnp.full((b, n), pad_id, jnp.int32), lp=jnp.zeros((b, n), jnp.float32),
              slp=jnp.zeros((b, n), jnp.float32), lengths=jnp.zeros((b,), jnp.int32))
  c = jax.lax.while_loop(cond, body, init)
  stopped = c["done"] & ~done  # inactive rows neither stopped nor ran
  return Generation(c["tokens"], c["lp"], c["slp"], c["lengths"], stopped, c["step"])


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "cache_size", "greedy",
                                             "top_k", "use_top_p", "pad_id"))
def generate_tokens(graphdef, state, tokens, *, valid, stop_tokens, key, temperature, top_p,
                    max_new_tokens: int, cache_size: int, greedy: bool, top_k: int,
                    use_top_p: bool, pad_id: int) -> Generation:
  """tokens, valid [B, P] left-padded; stop_tokens [B, K] (-1 = none); key [2] (row r samples
  with fold_in(key, r)). Needs P + N <= cache_size."""
  return sample_from_prompts(
      nnx.merge(graphdef, state), tokens, valid, stop_tokens=stop_tokens,
      keys=row_keys(key, jnp.arange(tokens.shape[0])), temperature=temperature, top_p=top_p,
      done=jnp.zeros((tokens.shape[0],), bool), max_new_tokens=max_new_tokens, cache_size=cache_size,
      greedy=greedy, top_k=top_k, use_top_p=use_top_p, pad_id=pad_id)


def check_budget(*, prompt_len: int, max_new_tokens: int, cache_size: int, context: int):
  """Clear errors for prompts or generation lengths that do not fit the cache or the model."""
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
  if prompt_len > cache_size:
    raise ValueError(f"prompt of {prompt_len} tokens is longer than the KV cache "
                     f"(cache_size={cache_size} tokens)")
  if prompt_len + max_new_tokens > cache_size:
    raise ValueError(f"max_new_tokens={max_new_tokens} would overflow the KV cache: prompt "
                     f"{prompt_len} + {max_new_tokens} new > cache_size={cache_size}")
  if prompt_len + max_new_tokens > context:
    raise ValueError(f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} exceeds the "
                     f"model's context window of {context} tokens")
