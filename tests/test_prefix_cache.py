"""Reusing the keys of the template's opening piece (agent.template_prefix_cache): the same
trajectories as computing them in every row and chunk, for less compute, on a token-shift toy model
and a grouped-query SmolLM2-shaped one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import memagent_jax as mj
from memagent_jax.agent.memagent import MemAgent, question_bucket
from memagent_jax.agent.recurrence import ChunkBlock, MemoryRows, _fixed, memory_block, opening_cache, pack_left
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.data import tasks
from memagent_jax.policy import sampling


def _agents(policy, **kw):
  return [MemAgent(policy, template_prefix_cache=c, **kw) for c in ("off", "on")]


def _toy_batch(tokenizer, n=5):
  samples = [s for length in (96, 200, 330) for s in tasks.make_samples("toy_kv", length, n, length, tokenizer,
                                                                        chunk_tokens=32)]
  return [s["question"] for s in samples], [s["context"] for s in samples]


def test_reused_prefix_gives_the_same_trajectories(shifted_toy_policy):
  """Sampled (each token drawn with its row's own key): greedy with the cache on and off against
  transformers' generate is test_parity's SmolLM2 test."""
  off, on = _agents(shifted_toy_policy, chunk_tokens=32, memory_tokens=8, answer_tokens=4, block_chunks=3)
  assert on.reuse_prefix and not off.reuse_prefix
  questions, documents = _toy_batch(shifted_toy_policy.tokenizer)  # 1 to 11 chunks: rows end in different blocks
  want = off.answer_batch(questions, documents, temperature=1.0, seed=3)
  got = on.answer_batch(questions, documents, temperature=1.0, seed=3)
  assert sum(len(r.memories) for r in got) > 3 * len(got)
  for w, g in zip(want, got):
    assert g.memories == w.memories and g.answer == w.answer
    for cw, cg in zip(w.conversations, g.conversations, strict=True):
      np.testing.assert_array_equal(cg.prompt_ids, cw.prompt_ids)
      np.testing.assert_allclose(cg.response_logprobs, cw.response_logprobs, atol=1e-4)


def test_reused_prefix_on_one_row(shifted_toy_policy):
  """A batch of one row (its per-row opening was once placed as if it were the shared prefix, and every
  key after its first slot was wrong): the same trajectory with the cache on and off."""
  off, on = _agents(shifted_toy_policy, chunk_tokens=32, memory_tokens=8, answer_tokens=4, block_chunks=3)
  questions, documents = _toy_batch(shifted_toy_policy.tokenizer, n=1)
  question = questions[-1] + " lima ?"  # 10 tokens in a 16-wide bucket: the row's opening is left-padded
  width = len(shifted_toy_policy.tokenizer.encode(question))
  assert width < question_bucket(width), width
  want = off.answer(question, documents[-1], temperature=1.0, seed=3)  # 11 chunks
  got = on.answer(question, documents[-1], temperature=1.0, seed=3)
  assert got.num_chunks > 3 and got.memories == want.memories and got.answer == want.answer
  for cw, cg in zip(want.conversations, got.conversations, strict=True):
    np.testing.assert_array_equal(cg.prompt_ids, cw.prompt_ids)
    np.testing.assert_allclose(cg.response_logprobs, cw.response_logprobs, atol=1e-4)


def test_reused_prefix_on_a_grouped_query_model():
  policy = mj.load_policy("random:tiny-smollm2", seed=1)  # 4 query heads share 2 key heads; SmolLM2 chat template
  off, on = _agents(policy, chunk_tokens=24, memory_tokens=6, answer_tokens=4, block_chunks=2)
  questions = ["Where is it?", "Who wrote the letter to the mayor?"]
  documents = ["The key is under the mat by the door. " * 6, "A letter came on Tuesday. " * 9]
  want = off.answer_batch(questions, documents, temperature=1.0, seed=0)
  got = on.answer_batch(questions, documents, temperature=1.0, seed=0)
  for w, g in zip(want, got):
    assert g.memories == w.memories and g.answer == w.answer
    for cw, cg in zip(w.conversations, g.conversations, strict=True):
      np.testing.assert_allclose(cg.response_logprobs, cw.response_logprobs, atol=1e-4)


def _block_flops(agent, policy, b=4, k=2):
  m, q = agent.memory_width, 8
  rows = MemoryRows(question=jnp.ones((b, q), jnp.int32), q_len=jnp.full((b,), q), memory=jnp.ones((b, m), jnp.int32),
                    mem_len=jnp.full((b,), m), keys=jnp.zeros((b, 2), jnp.uint32))
  block = ChunkBlock(chunks=jnp.ones((b, k, agent.chunk_tokens), jnp.int32),
                     lengths=jnp.full((b, k), agent.chunk_tokens), first=jnp.int32(0))
  args = dict(pieces=agent._memory_pieces, rows=rows, block=block, decode=DecodeSpec(temperature=1.0),
              spec=agent._spec(keep_prompts=False))
  return memory_block.lower(policy.graphdef, policy.state, **args).compile().cost_analysis()["flops"]


def test_reused_prefix_saves_the_prefix_compute(shifted_toy_policy):
  """The toy template's opening piece is 69 of about 140 prompt tokens: the compiled block does
  markedly fewer FLOPs with it reused."""
  off, on = _agents(shifted_toy_policy, chunk_tokens=32, memory_tokens=8, answer_tokens=4, block_chunks=2)
  prefix = len(on.memory_segments.pieces[0])
  assert prefix > 0.3 * on.prompt_tokens(8)["memory update"]
  flops_off, flops_on = _block_flops(off, shifted_toy_policy), _block_flops(on, shifted_toy_policy)
  assert flops_on < 0.8 * flops_off, (flops_on, flops_off)


def test_auto_reuses_the_prefix_only_where_it_is_a_real_share():
  policy = mj.load_policy("random:tiny-smollm2", seed=1)
  assert MemAgent(policy, chunk_tokens=64, memory_tokens=16, answer_tokens=8).reuse_prefix
  # a released-size chunk: the ~100-token opening is 2% of the prompt; whole rows keep the fused kernels
  assert not MemAgent(policy, chunk_tokens=5000, memory_tokens=1024, answer_tokens=1024).reuse_prefix
  assert not MemAgent(policy, chunk_tokens=64, memory_tokens=16, answer_tokens=8,
                      template_prefix_cache="off").reuse_prefix
  with pytest.raises(ValueError, match="template_prefix_cache='yes'"):
    MemAgent(policy, chunk_tokens=64, memory_tokens=16, answer_tokens=8, template_prefix_cache="yes")


def test_each_rows_opening_is_placed_under_its_prompt(shifted_toy_policy):
  """The opening cache (piece 0 + question + piece 1, once per row) copied under prompts whose memories and
  chunks have other lengths gives the keys, values and next-token logits of the whole prompt run."""
  model = nnx.merge(shifted_toy_policy.graphdef, shifted_toy_policy.state)
  pieces = tuple(jnp.asarray(p) for p in ([5, 6, 7, 8, 9, 10], [11, 12], [13], [14, 15, 16]))
  b, q, m, c = 4, 8, 6, 10
  rng = np.random.default_rng(0)
  q_len, mem_len, clen = jnp.asarray([8, 1, 5, 3]), jnp.asarray([0, 6, 2, 4]), jnp.asarray([10, 3, 0, 7])
  ids = lambda w: jnp.asarray(rng.integers(20, 60, (b, w)), jnp.int32)
  rows = MemoryRows(question=ids(q), q_len=q_len, memory=ids(m), mem_len=mem_len, keys=jnp.zeros((b, 2), jnp.uint32))
  tokens, valid = pack_left([_fixed(pieces[0], b), (rows.question, q_len), _fixed(pieces[1], b), (rows.memory, mem_len),
                             _fixed(pieces[2], b), (ids(c), clen), _fixed(pieces[3], b)], 0)
  opening = opening_cache(model, pieces, rows, 0)
  assert opening.size == 6 + q + 2 and opening.valid.shape == (b, 16)
  np.testing.assert_array_equal(np.asarray(opening.valid).sum(1), 6 + np.asarray(q_len) + 2)
  p = tokens.shape[1]
  want_logits, want = sampling.prefill(model, tokens, valid, cache_size=p + 3)
  got_logits, got = sampling.prefill(model, tokens, valid, cache_size=p + 3, prefix=opening)
  np.testing.assert_allclose(got_logits, want_logits, atol=2e-5)
  np.testing.assert_array_equal(got.valid, want.valid)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  real = np.asarray(want.valid)[:, None, :, None]
  for g, w in zip(got.k + got.v, want.k + want.v):
    np.testing.assert_allclose(np.where(real, g, 0), np.where(real, w, 0), atol=2e-5)


def test_a_per_row_prefix_of_equal_rows_is_the_shared_prefix(shifted_toy_policy):
  model = nnx.merge(shifted_toy_policy.graphdef, shifted_toy_policy.state)
  tokens, valid = sampling.left_pad([[3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 9], [3, 4, 5, 6, 7, 8, 9, 10]], 0)
  shared = sampling.prefix_cache(model, jnp.asarray([3, 4, 5, 6]))
  rows = shared.replace(k=tuple(jnp.repeat(x, 3, 0) for x in shared.k), v=tuple(jnp.repeat(x, 3, 0) for x in shared.v),
                        valid=jnp.repeat(shared.valid, 3, 0), tokens=jnp.repeat(shared.tokens, 3, 0))
  want = sampling.cache_with_prefix(model, shared, jnp.asarray(tokens), jnp.asarray(valid), 9)
  got = sampling.cache_with_prefix(model, rows, jnp.asarray(tokens), jnp.asarray(valid), 9)
  for g, w in zip(got.k + got.v, want.k + want.v):
    np.testing.assert_array_equal(g, w)


def test_prefill_after_a_prefix_skips_what_only_hidden_states_need(shifted_toy_policy):
  """Every slot but the last only fills the cache: the last block's queries, attention and MLP run for
  one slot per row, not all (about a fifth of a 4-block model's prefill), with the same logits and cache."""
  model = nnx.merge(shifted_toy_policy.graphdef, shifted_toy_policy.state)
  prefix = sampling.prefix_cache(model, jnp.arange(3, 9))
  rows = [list(range(3, 9)) + [20 + i] * (30 + i) for i in range(4)]  # 6 prefix ids, then 30-33 more
  tokens, valid = (jnp.asarray(x) for x in sampling.left_pad(rows, 0))

  def whole(state):  # the fresh slots in one call, every hidden state computed
    m = nnx.merge(shifted_toy_policy.graphdef, state)
    cache = sampling.cache_with_prefix(m, prefix, tokens, valid, tokens.shape[1])
    positions = sampling.positions_from_mask(valid)
    hidden, cache = m(tokens[:, 6:], positions[:, 6:], valid[:, 6:], cache)
    return m.logits(hidden[:, -1]), cache.grow(tokens.shape[1] + 2)

  def split(state):
    return sampling.prefill(nnx.merge(shifted_toy_policy.graphdef, state), tokens, valid,
                            cache_size=tokens.shape[1] + 2, prefix=prefix)

  flops = [jax.jit(f).lower(shifted_toy_policy.state).compile().cost_analysis()["flops"] for f in (whole, split)]
  assert flops[1] < 0.85 * flops[0], flops
  (want_logits, want), (got_logits, got) = whole(shifted_toy_policy.state), split(shifted_toy_policy.state)
  np.testing.assert_allclose(got_logits, want_logits, atol=2e-5)
  assert int(got.cursor) == int(want.cursor) == tokens.shape[1]
  np.testing.assert_array_equal(got.valid, want.valid)
  for g, w in zip(got.k + got.v, want.k + want.v):
    np.testing.assert_allclose(g, w, atol=2e-5)


def test_prefill_after_a_prefix_needs_tokens_after_it(shifted_toy_policy):
  model = nnx.merge(shifted_toy_policy.graphdef, shifted_toy_policy.state)
  prefix = sampling.prefix_cache(model, jnp.arange(5))
  with pytest.raises(ValueError, match="nothing after the 5-token shared prefix"):
    sampling.prefill(model, jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5), bool), cache_size=8, prefix=prefix)


def test_question_widths_come_in_few_buckets():
  assert [question_bucket(n) for n in (1, 7, 8, 9, 33, 128, 129, 300, 1024)] == [8, 8, 8, 16, 64, 128, 256, 384, 1024]
  assert len({question_bucket(n) for n in range(1, 1025)}) == 12
