"""Compiled generation: one jitted prefill plus a `lax.while_loop` decode over a static KV cache.

Rows are left-padded; each row's positions come from its mask, so a batch decodes exactly
as each prompt would alone. The loop exits as soon as every row has emitted a stop token.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from memagent_jax.models.decoder import positions_from_mask
from memagent_jax.models.kv_cache import KVCache
from memagent_jax.policy.compaction import Compaction, run_compacted
from memagent_jax.policy.decode_spec import DecodeSpec


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


class PromptRows(NamedTuple):
  """The rows a sampler runs: left-padded prompts and each row's key, stop ids and activity."""
  tokens: jax.Array  # [B, P] int32 prompt ids, left-padded
  valid: jax.Array  # [B, P] bool: real prompt tokens
  keys: jax.Array  # [B, 2] uint32 one PRNG key per row: token t of row r uses fold_in(keys[r], t)
  stop_tokens: jax.Array  # [B, K] int32 ids that end a row (-1 = none)
  inactive: jax.Array  # [B] bool rows that generate nothing


@struct.dataclass
class DecodeState:
  """The decode loop's carry. The cache's cursor is the slot of the next token: P + steps run."""
  cache: KVCache
  logits: jax.Array  # [B, V] float32 logits of the next token
  pos: jax.Array  # [B] int32 position of the next token
  done: jax.Array  # [B] bool rows that emitted a stop token (or never ran)
  tokens: jax.Array  # [B, N] int32 generated ids, pad where nothing was generated
  logprobs: jax.Array  # [B, N] float32 model log-probs of those tokens
  sample_logprobs: jax.Array  # [B, N] float32 sampling log-probs of those tokens
  lengths: jax.Array  # [B] int32 tokens generated per row


def sort_descending(x):
  """x [..., V] float32 sorted from largest to smallest along its last axis: the values of
  -jnp.sort(-x) (0.0 and -0.0 may swap places, a subnormal ranks by its value where XLA's float
  comparison flushes it to zero; NaNs last). It sorts int32 keys whose order is the floats' order
  (a non-negative float's bits; a negative one's with the magnitude bits flipped): an integer sort
  with no NaN handling in its comparator. Not differentiable."""
  flip = lambda k: jnp.where(k < 0, k ^ jnp.int32(0x7FFFFFFF), k)  # its own inverse
  neg = jnp.where(jnp.isnan(x), jnp.nan, -x).astype(jnp.float32)  # a positive NaN: sorted after +inf
  keys = jnp.sort(flip(jax.lax.bitcast_convert_type(neg, jnp.int32)), axis=-1)
  return -jax.lax.bitcast_convert_type(flip(keys), jnp.float32)


def process_logits(logits, spec: DecodeSpec):
  """Temperature, then top-k, then top-p (nucleus) on float32 logits [B, V]."""
  x = logits / spec.divisor
  if spec.top_k > 0:
    kth = jax.lax.top_k(x, spec.top_k)[0][:, -1:]
    x = jnp.where(x < kth, -jnp.inf, x)
  if spec.use_top_p:
    desc = sort_descending(x)
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.sum(mass_before < spec.top_p, axis=-1, keepdims=True)  # >= 1
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


def _pick(logits, keys, spec: DecodeSpec):
  """One token per row (row r drawn with keys[r] alone), with its model log-prob and its
  sampling log-prob. logits [B, V], keys [B, 2]."""
  model_lp = jax.nn.log_softmax(logits, axis=-1)
  if spec.greedy:
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    sample_lp = jnp.zeros(tok.shape, jnp.float32)
  else:
    x = process_logits(logits, spec)
    tok = jax.vmap(jax.random.categorical)(keys, x).astype(jnp.int32)
    sample_lp = jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), tok[:, None], axis=-1)[:, 0]
  lp = jnp.take_along_axis(model_lp, tok[:, None], axis=-1)[:, 0]
  return tok, lp, sample_lp


def prefix_cache(model, prefix) -> KVCache:
  """KV (and token history) of one shared prompt prefix [L], computed once: a [1, K, L, D] cache.
  Every prompt that starts with it (left padding aside) holds these keys, since positions count
  from a row's first real token."""
  ids = jnp.asarray(prefix, jnp.int32)[None, :]  # [1, L]
  cache = KVCache.init(model.config, 1, ids.shape[1], model.dtype)
  _, cache = model(ids, jnp.arange(ids.shape[1])[None, :], jnp.ones(ids.shape, bool), cache)
  return cache


def cache_with_prefix(model, prefix: KVCache, tokens, valid, cache_size: int) -> KVCache:
  """A cache [B, ., cache_size, .] whose first L slots hold each row's share of the prefix, its
  cursor at slot L; tokens, valid [B, >= L] are the rows the prefix opens.

  Row b's real tokens start at its first valid slot f_b (left padding; a training row may also be
  right-padded after its response), so slot s < L holds prefix token s - f_b (padding where that
  is negative: valid masks it). Differentiable in the prefix's keys and values.

  A prefix of B rows (`row_prefix`: each row's own opening, left-padded to L slots, n_b real tokens)
  is placed the same way: slot s < L holds the row's prefix token s - f_b, which sits at prefix
  slot s - f_b + L - n_b; every row's prompt must hold its whole prefix within its first L slots."""
  b, l = tokens.shape[0], prefix.size
  cache = KVCache.init(model.config, b, cache_size, model.dtype)
  first = jnp.argmax(valid, axis=1)  # [B]: first real slot (0 for an all-padding row)
  # prefix slot of row slot 0: a shared prefix (every slot valid) starts at the row's first real slot, a
  # per-row one (n_b real tokens, left-padded) L - n_b slots later. One formula for both, so a per-row
  # prefix of ONE row is never taken for a shared prefix (it once was: every key after its first was wrong).
  shift = first - (l - jnp.sum(prefix.valid, axis=1))  # [B]
  index = jnp.clip(jnp.arange(l)[None, :] - shift[:, None], 0, l - 1)  # [B, L]

  def put(buf, shared):  # shared [1 or B, K, L, D] -> each row's slots 0..L-1 of buf [B, K, S, D]
    if shared.shape[0] == 1:
      rows = jnp.take(shared[0], index, axis=1).transpose(1, 0, 2, 3)  # [B, K, L, D]
    else:
      rows = jnp.take_along_axis(shared, index[:, None, :, None], axis=2)  # [B, K, L, D]
    return jax.lax.dynamic_update_slice(buf, rows.astype(buf.dtype), (0, 0, 0, 0))

  history = cache.tokens
  if history is not None:  # token-shift history: the prompt's own ids
    history = jax.lax.dynamic_update_slice(history, tokens[:, :l].astype(jnp.int32), (0, 0))
  return cache.replace(k=tuple(put(c, pre) for c, pre in zip(cache.k, prefix.k)),
                       v=tuple(put(c, pre) for c, pre in zip(cache.v, prefix.v)),
                       valid=cache.valid.at[:, :l].set(valid[:, :l]), cursor=jnp.int32(l), tokens=history)


def row_prefix(model, shared: KVCache, tokens, valid) -> KVCache:
  """Each row's own prompt opening, computed once and reused across its prompts: tokens, valid [B, L]
  left-padded, every row starting with the `shared` prefix (`prefix_cache`), whose keys are copied,
  not recomputed. -> a [B, K, L, D] cache for `cache_with_prefix` (valid [B, L] marks each row's tokens)."""
  _, cache = prefill(model, tokens, valid, cache_size=tokens.shape[1], prefix=shared)
  return cache


def prefill(model, tokens, valid, *, cache_size: int, prefix: KVCache | None = None):
  """Runs left-padded prompts [B, P] into the first P slots of a cache of `cache_size` slots,
  attending over those P slots alone (whole rows run on the square path); its cursor ends at slot P.

  With `prefix` (see `prefix_cache`: every row's real tokens start with its L ids), the first L
  slots are copied from it and only slots L.. run through the model: slots a row's prefix spills
  into are recomputed, exactly. Slots L..P-2 then only fill the cache (their hidden states are
  unused, so the compiled program drops the last block's queries, attention and MLP for them) and
  slot P-1 runs as one token against it. Returns (next-token logits [B, V] float32, cache)."""
  b, p = tokens.shape
  if cache_size < p:
    raise ValueError(f"prompts of {p} slots do not fit a cache of {cache_size}")
  positions = positions_from_mask(valid)
  if prefix is None:
    cache = KVCache.init(model.config, b, cache_size, model.dtype)
    hidden, cache = model(tokens, positions, valid, cache, attend_slots=p)
  else:
    l = prefix.size
    if p <= l:
      raise ValueError(f"prompts of {p} slots leave nothing after the {l}-token shared prefix")
    cache = cache_with_prefix(model, prefix, tokens, valid, cache_size)
    if p - 1 > l:  # the cache only: [B, P-1-L] slots
      _, cache = model(tokens[:, l:-1], positions[:, l:-1], valid[:, l:-1], cache, attend_slots=p)
    hidden, cache = model(tokens[:, -1:], positions[:, -1:], valid[:, -1:], cache, attend_slots=p)  # [B, 1, E]
  return model.logits(hidden[:, -1]), cache


def _decode(model, s: DecodeState, keys, stop_tokens, spec: DecodeSpec, *, prompt_slots: int, pad_id: int,
            until: int | None = None) -> DecodeState:
  """The decode loop from state s until every row is done, its token buffers [B, N] are full, or (with
  `until`) that many tokens are generated. keys [B, 2], stop_tokens [B, K] are the rows' own."""
  p, n = prompt_slots, s.tokens.shape[1]
  last = n if until is None else min(until, n)
  b = s.done.shape[0]

  def cond(s: DecodeState):
    return (s.cache.cursor - p < last) & ~jnp.all(s.done)

  def body(s: DecodeState) -> DecodeState:
    step = s.cache.cursor - p
    tok, lp, slp = _pick(s.logits, fold_rows(keys, step), spec)
    live = ~s.done
    tok = jnp.where(live, tok, pad_id)
    col = lambda buf, v: jax.lax.dynamic_update_slice(buf, v[:, None].astype(buf.dtype), (0, step))
    done = s.done | (live & jnp.any(tok[:, None] == stop_tokens, axis=-1))
    h, cache = model(tok[:, None], s.pos[:, None], jnp.ones((b, 1), bool), s.cache)
    return DecodeState(cache=cache, logits=model.logits(h[:, 0]), pos=s.pos + 1, done=done,
                       tokens=col(s.tokens, tok), logprobs=col(s.logprobs, jnp.where(live, lp, 0.0)),
                       sample_logprobs=col(s.sample_logprobs, jnp.where(live, slp, 0.0)),
                       lengths=s.lengths + live.astype(jnp.int32))

  return jax.lax.while_loop(cond, body, s)


def sample_from_prompts(model, rows: PromptRows, spec: DecodeSpec, *, max_new_tokens: int, pad_id: int,
                        cache_size: int | None = None, prefix: KVCache | None = None,
                        compaction: Compaction | None = None) -> Generation:
  """Traceable core of generation (used inside `generate_tokens` and the agent's `lax.scan`): up
  to max_new_tokens new tokens per active row, picked as `spec` says; one prefill, then one decode loop.

  cache_size: slots of the KV cache (default P + max_new_tokens, the least that fits); prefix: the
  KV of a prefix every prompt starts with (see `prefill`). With a `compaction`, after its first tokens
  the rows still decoding continue in the smallest of its batch sizes that holds them
  (policy/compaction.py): each row's tokens are the same, fewer rows run."""
  b, p = rows.tokens.shape
  n = max_new_tokens
  cache_size = cache_size or p + n
  logits, cache = prefill(model, rows.tokens, rows.valid, cache_size=cache_size, prefix=prefix)
  init = DecodeState(cache=cache, logits=logits, pos=jnp.sum(rows.valid, 1).astype(jnp.int32), done=rows.inactive,
                     tokens=jnp.full((b, n), pad_id, jnp.int32), logprobs=jnp.zeros((b, n), jnp.float32),
                     sample_logprobs=jnp.zeros((b, n), jnp.float32), lengths=jnp.zeros((b,), jnp.int32))
  loop = functools.partial(_decode, model, spec=spec, prompt_slots=p, pad_id=pad_id)
  if compaction is not None and 0 < compaction.after < n and compaction.buckets > 1:
    s = loop(init, rows.keys, rows.stop_tokens, until=compaction.after)
    # the rows not yet done, gathered into a bucket, to the end; the done ones keep s (their later steps
    # would write nothing); the cursor is shared, taken from the bucket's run
    s = run_compacted(lambda t: loop(*t), ~s.done, (s, rows.keys, rows.stop_tokens), s, buckets=compaction.buckets)
  else:
    s = loop(init, rows.keys, rows.stop_tokens)
  stopped = s.done & ~rows.inactive  # inactive rows neither stopped nor ran
  return Generation(s.tokens, s.logprobs, s.sample_logprobs, s.lengths, stopped, s.cache.cursor - p)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "cache_size", "pad_id"))
def generate_tokens(graphdef, state, rows: PromptRows, spec: DecodeSpec, *, max_new_tokens: int, cache_size: int,
                    pad_id: int) -> Generation:
  """`sample_from_prompts` as one compiled program; spec's switches are static, its temperature
  and top-p traced. Needs P + max_new_tokens <= cache_size."""
  return sample_from_prompts(nnx.merge(graphdef, state), rows, spec, max_new_tokens=max_new_tokens,
                             pad_id=pad_id, cache_size=cache_size)


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
