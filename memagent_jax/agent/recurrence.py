"""The memory recurrence as compiled JAX: one `lax.scan` over chunks, then the final answer.

Each scan step assembles every row's prompt from pre-tokenised template pieces + question +
memory + chunk, compacts it to left padding (positions follow from the mask), samples the new
memory and writes it back without its stop token. Rows whose chunk is empty are inactive: they
generate nothing and keep their memory. A step where no row is active is skipped by `lax.cond`.

With a gate (`RecurrenceSpec.gate`, agent/gates.py) a reply may be a keep form (the memory stays:
the old memory tokens are selected) or a stop form (the row is halted: it reads no further chunk,
its later turns are inactive, and it answers from the memory it has).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.agent import gates
from memagent_jax.policy.compaction import Compaction, run_compacted
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.policy.sampling import (Generation, PromptRows, fold_rows, prefix_cache, row_prefix,
                                          sample_from_prompts)

FINAL_STREAM = 0xFFFFFFFF  # the final answer's key is fold_in(row key, FINAL_STREAM); chunk k uses k


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecurrenceSpec:
  """Static settings of the compiled recurrence (hashable: part of the jit cache key)."""
  memory_tokens: int  # new-token cap of each memory update
  answer_tokens: int  # new-token cap of the final answer
  stop_tokens: tuple[int, ...]
  pad_id: int
  keep_prompts: bool  # return the assembled prompts (RL needs them; long reads may not)
  reuse_prefix: bool  # compute each row's prompt opening (template piece, question, piece) once per block
  gate: gates.GateSpec | None = None  # gated memory: keep / stop forms (None: every reply overwrites)
  # batch sizes a memory turn's rows are compacted into (policy/compaction.py; 1: none): the rows that read a
  # chunk before the prefill, and with a gate the rows still decoding once a form could have ended
  decode_buckets: int = 1


class MemoryRows(NamedTuple):
  """Each row's state from block to block: its question, its memory so far and its PRNG key."""
  question: jax.Array  # [B, Q] int32 question ids, padded after q_len
  q_len: jax.Array  # [B] int32
  memory: jax.Array  # [B, M] int32 memory ids, padded after mem_len
  mem_len: jax.Array  # [B] int32
  keys: jax.Array  # [B, 2] uint32: chunk k samples with fold_in(keys[r], k), the answer with FINAL_STREAM
  halted: jax.Array | None = None  # [B] bool: the row replied with the stop form (gated memory only)


class ChunkBlock(NamedTuple):
  """The next K chunks of every row's document, read by one `memory_block`."""
  chunks: jax.Array  # [B, K, C] int32 chunk ids, padded after lengths
  lengths: jax.Array  # [B, K] int32 tokens per chunk (0: the row's document has ended, inactive)
  first: jax.Array  # [] int32 index in the document of this block's chunk 0


class StepOutputs(NamedTuple):
  """What each memory update (or the final answer) produced, stacked over steps [K, B, ...]."""
  response: jax.Array | None  # [K, B, N] int32 generated ids, the stop token included
  logprobs: jax.Array | None  # [K, B, N] float32 log p under the model (temperature 1)
  sample_logprobs: jax.Array | None  # [K, B, N] float32 log p under the sampling distribution
  response_len: jax.Array  # [K, B] int32
  stopped: jax.Array  # [K, B] bool: ended with a stop token (else truncated at the cap)
  prompt_len: jax.Array  # [K, B] int32 real prompt tokens
  active: jax.Array  # [K, B] bool: the row read a chunk at this step (its document had not ended)
  prompt: jax.Array | None = None  # [K, B, P] int32 left-padded prompts (None: not kept)
  gate: jax.Array | None = None  # [K, B] int32 gates.MEMORY / KEEP / STOP / INVALID (None: no gate)

  @classmethod
  def of(cls, gen: Generation, valid, active, prompt=None, gate=None) -> "StepOutputs":
    """One step's outputs [B, ...] from its generation and prompt mask valid [B, P]."""
    return cls(response=gen.tokens, logprobs=gen.logprobs, sample_logprobs=gen.sample_logprobs,
               response_len=gen.lengths, stopped=gen.stopped, prompt_len=jnp.sum(valid, axis=1),
               active=active, prompt=prompt, gate=gate)

  def counts(self) -> "StepOutputs":
    """Only the per-step counts (what a rollout brings to the host); token arrays dropped."""
    return self._replace(response=None, logprobs=None, sample_logprobs=None, prompt=None)


def pack_left(parts, pad_id: int):
  """Concatenates ragged parts row by row into left-padded tokens, valid [B, W].

  parts: sequence of (ids [B, w_i], lengths [B]); only the first lengths[b] ids of each part
  count. W = sum(w_i), so every row fits.
  """
  ids = jnp.concatenate([p for p, _ in parts], axis=1)  # [B, W]
  valid = jnp.concatenate([jnp.arange(p.shape[1])[None, :] < n[:, None] for p, n in parts], axis=1)
  b, w = ids.shape
  count = jnp.sum(valid, axis=1)  # [B]
  target = (w - count)[:, None] + jnp.cumsum(valid, axis=1) - 1
  target = jnp.where(valid, target, w)  # out of range: dropped
  rows = jnp.arange(b)[:, None]
  tokens = jnp.full((b, w), pad_id, jnp.int32).at[rows, target].set(ids, mode="drop")
  return tokens, jnp.arange(w)[None, :] >= (w - count)[:, None]


def _fixed(piece, b):
  """A template piece [L] as a part of every row."""
  return jnp.broadcast_to(piece[None, :], (b, piece.shape[0])), jnp.full((b,), piece.shape[0])


def _strip_stop(gen: Generation, width: int, pad_id: int):
  """Generated ids -> memory ids [B, width] without the stop token, and their lengths [B]."""
  n = gen.tokens.shape[1]
  length = gen.lengths - gen.stopped.astype(jnp.int32)
  ids = jnp.where(jnp.arange(n)[None, :] < length[:, None], gen.tokens, pad_id)
  return jnp.pad(ids, ((0, 0), (0, width - n)), constant_values=pad_id), length


def _strip_eos(gen: Generation, width: int, pad_id: int, gate: gates.GateSpec):
  """As `_strip_stop`, but only a model stop token is removed: a form token that ended the turn stays
  (a reply such as "facts <keep>" is all memory when invalid replies become the memory)."""
  n = gen.tokens.shape[1]
  length = gates.strip_eos(gen.tokens, gen.lengths, gate)
  ids = jnp.where(jnp.arange(n)[None, :] < length[:, None], gen.tokens, pad_id)
  return jnp.pad(ids, ((0, 0), (0, width - n)), constant_values=pad_id), length


def _empty_generation(b: int, n: int, pad_id: int) -> Generation:
  z = jnp.zeros((b, n), jnp.float32)
  return Generation(jnp.full((b, n), pad_id, jnp.int32), z, z, jnp.zeros((b,), jnp.int32),
                    jnp.zeros((b,), bool), jnp.int32(0))


def _prompt_rows(tokens, valid, keys, inactive, spec: RecurrenceSpec, extra_stops: tuple[int, ...] = ()) -> PromptRows:
  """Left-padded prompts tokens, valid [B, P] with their keys [B, 2], the stop tokens of every row
  (and extra_stops: a gate's single-token forms end a memory turn); inactive [B] rows generate nothing."""
  b = tokens.shape[0]
  ids = spec.stop_tokens + tuple(t for t in extra_stops if t not in spec.stop_tokens)
  stops = jnp.broadcast_to(jnp.asarray(ids or (-1,), jnp.int32)[None], (b, max(1, len(ids))))
  return PromptRows(tokens=tokens, valid=valid, keys=keys, stop_tokens=stops, inactive=inactive)


def _sample(model, rows: PromptRows, *, n: int, decode: DecodeSpec, spec: RecurrenceSpec, prefix=None,
            compact_after: int = 0):
  """Up to n new tokens for each row. prefix: the KV of the template piece every prompt starts with
  (`sampling.prefix_cache`) or None; compact_after: the tokens after which the rows still decoding are
  compacted into the spec's buckets (0: never; see `sample_from_prompts`)."""
  return sample_from_prompts(model, rows, decode, max_new_tokens=n, pad_id=spec.pad_id, prefix=prefix,
                             compaction=Compaction(after=compact_after, buckets=spec.decode_buckets))


def _sample_active(model, rows: PromptRows, *, n: int, decode: DecodeSpec, spec: RecurrenceSpec, prefix=None):
  """A memory turn's generation: only the rows not `inactive` run, compacted into a bucket when the spec
  has several; the others get an empty generation, as an inactive row does uncompacted."""
  after = spec.gate.form_tokens + 1 if spec.gate is not None else 0  # a form and its stop token

  def sample(operands):
    prompt_rows, pre = operands
    return _sample(model, prompt_rows, n=n, decode=decode, spec=spec, prefix=pre, compact_after=after)

  b = rows.tokens.shape[0]
  return run_compacted(sample, ~rows.inactive, (rows, prefix), _empty_generation(b, n, spec.pad_id),
                       buckets=spec.decode_buckets)


def opening_cache(model, pieces, rows: MemoryRows, pad_id: int):
  """Each row's memory-update prompt opening, template piece 0 + question + piece 1 (left-padded to
  [B, L0 + Q + L1]), as a [B, K, L, D] cache: piece 0's keys computed once for all rows, the question's
  once per row. Every prompt of the row holds it within its first L slots, whatever its memory and chunk."""
  b = rows.question.shape[0]
  tokens, valid = pack_left([_fixed(pieces[0], b), (rows.question, rows.q_len), _fixed(pieces[1], b)], pad_id)
  return row_prefix(model, prefix_cache(model, pieces[0]), tokens, valid)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def memory_block(graphdef, state, *, pieces, rows: MemoryRows, block: ChunkBlock, decode: DecodeSpec,
                 spec: RecurrenceSpec):
  """K memory updates in one scan: pieces are the 4 template pieces [L_i]. Chunk block.first + k of
  row r samples with fold_in(rows.keys[r], block.first + k), so a row's trajectory depends on its
  own key alone (not on the batch, the block size or the device count).
  Returns (rows with the new memories, StepOutputs stacked [K, B, ...])."""
  model = nnx.merge(graphdef, state)
  b, m = rows.memory.shape
  n = spec.memory_tokens
  prefix = opening_cache(model, pieces, rows, spec.pad_id) if spec.reuse_prefix else None  # the same every step

  gate = spec.gate
  extra_stops = gate.end_tokens if gate is not None else ()

  def step(carry, xs):
    memory, mem_len, halted = carry
    chunk, clen, k = xs  # [B, C], [B], []
    active = clen > 0 if halted is None else (clen > 0) & ~halted  # a halted row reads no further chunk
    step_keys = fold_rows(rows.keys, (block.first + k).astype(jnp.uint32))
    tokens, valid = pack_left([_fixed(pieces[0], b), (rows.question, rows.q_len), _fixed(pieces[1], b),
                               (memory, mem_len), _fixed(pieces[2], b), (chunk, clen),
                               _fixed(pieces[3], b)], spec.pad_id)
    gen = jax.lax.cond(
        jnp.any(active),
        lambda: _sample_active(model, _prompt_rows(tokens, valid, step_keys, ~active, spec, extra_stops), n=n,
                               decode=decode, spec=spec, prefix=prefix),
        lambda: _empty_generation(b, n, spec.pad_id))
    if gate is None:
      new_memory, new_len = _strip_stop(gen, m, spec.pad_id)
      code = None
    else:
      new_memory, new_len = _strip_eos(gen, m, spec.pad_id, gate)
      code = jnp.where(active, gates.gate_codes(gen.tokens, gen.lengths, gate), gates.MEMORY)  # [B]
      active_writes = active & ~gates.kept(code, gate)
      halted = halted | (active & (code == gates.STOP))
    writes = active if gate is None else active_writes
    memory = jnp.where(writes[:, None], new_memory, memory)
    mem_len = jnp.where(writes, new_len, mem_len)
    return (memory, mem_len, halted), StepOutputs.of(gen, valid, active, tokens if spec.keep_prompts else None,
                                                     code)

  xs = (jnp.swapaxes(block.chunks, 0, 1), jnp.swapaxes(block.lengths, 0, 1), jnp.arange(block.chunks.shape[1]))
  halted = None if gate is None else (rows.halted if rows.halted is not None else jnp.zeros((b,), bool))
  (memory, mem_len, halted), outs = jax.lax.scan(step, (rows.memory, rows.mem_len, halted), xs)
  return rows._replace(memory=memory, mem_len=mem_len, halted=halted), outs


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def answer_block(graphdef, state, *, pieces, rows: MemoryRows, decode: DecodeSpec, spec: RecurrenceSpec):
  """The final conversation: question + final memory -> answer, row r sampled with
  fold_in(rows.keys[r], FINAL_STREAM); pieces are the 3 final-template pieces. Returns (prompt [B, P], valid, gen)."""
  model = nnx.merge(graphdef, state)
  b = rows.question.shape[0]
  tokens, valid = pack_left([_fixed(pieces[0], b), (rows.question, rows.q_len), _fixed(pieces[1], b),
                             (rows.memory, rows.mem_len), _fixed(pieces[2], b)], spec.pad_id)
  keys = fold_rows(rows.keys, jnp.uint32(FINAL_STREAM))
  gen = _sample(model, _prompt_rows(tokens, valid, keys, jnp.zeros((b,), bool), spec), n=spec.answer_tokens,
                decode=decode, spec=spec)
  return tokens, valid, gen
