"""The compiled sampler: batching invariance, exact log-probs, stop tokens, sampling filters."""

import jax
import numpy as np
import pytest

import memagent_jax as mj
from memagent_jax.policy.decode_spec import GREEDY, DecodeSpec


@pytest.fixture(scope="module")
def tiny():
  return mj.load_policy("random:tiny-llama", seed=3)


def _ragged(seed, lengths, vocab):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _full_forward_logits(policy, prompt, generated):
  ids = np.array([list(prompt) + list(generated)])
  logits = np.asarray(policy.logits(ids))[0]
  return logits[len(prompt) - 1: len(prompt) - 1 + len(generated)]  # rows predicting each new token


def test_left_padded_batch_equals_each_prompt_alone(tiny):
  prompts = _ragged(0, [5, 17, 9, 30], 256)
  batch = tiny.sample(prompts, 24, params=GREEDY, stop_tokens=[])
  for i, p in enumerate(prompts):
    alone = tiny.sample([p], 24, params=GREEDY, stop_tokens=[])
    np.testing.assert_array_equal(batch.tokens[i], alone.tokens[0])
    np.testing.assert_allclose(batch.logprobs[i], alone.logprobs[0], atol=1e-5)


@pytest.mark.slow
def test_smollm2_batch_equals_alone(smollm):
  texts = ["What is 2 + 2?", "List three fruits that are red, and say why each one is red.", "Hi"]
  prompts = [smollm.tokenizer.apply_chat_template(t) for t in texts]
  batch = smollm.sample(prompts, 16, params=GREEDY)
  for i, p in enumerate(prompts):
    alone = smollm.sample([p], 16, params=GREEDY)
    n = int(alone.lengths[0])
    assert int(batch.lengths[i]) == n
    np.testing.assert_array_equal(batch.tokens[i, :n], alone.tokens[0, :n])


@pytest.mark.parametrize("params", [GREEDY, DecodeSpec(temperature=0.7, top_p=1.0, top_k=20),
                                    DecodeSpec(temperature=1.3, top_p=0.8, top_k=0)])
def test_logprobs_equal_full_forward(tiny, params):
  prompts = _ragged(1, [7, 12], 256)
  out = tiny.sample(prompts, 16, params=params, seed=5, stop_tokens=[])
  for i, p in enumerate(prompts):
    gen = out.tokens[i, :out.lengths[i]]
    logits = _full_forward_logits(tiny, p, gen)
    model_lp = _np_log_softmax(logits)[np.arange(len(gen)), gen]
    np.testing.assert_allclose(out.logprobs[i, :len(gen)], model_lp, atol=1e-4)
    # sampling distribution, rebuilt in numpy: temperature, top-k, then top-p
    if params.temperature == 0:
      np.testing.assert_array_equal(gen, logits.argmax(-1))
      continue
    x = logits / params.temperature
    if params.top_k:
      kth = np.sort(x, -1)[:, -params.top_k][:, None]
      x = np.where(x < kth, -np.inf, x)
    if params.top_p < 1:
      order = np.argsort(-x, -1)
      probs = np.exp(_np_log_softmax(np.take_along_axis(x, order, -1)))
      before = np.cumsum(probs, -1) - probs
      drop = np.zeros_like(x, bool)
      np.put_along_axis(drop, order, before >= params.top_p, -1)
      x = np.where(drop, -np.inf, x)
    sample_lp = _np_log_softmax(x)[np.arange(len(gen)), gen]
    assert np.all(np.isfinite(sample_lp)), "sampled a token outside the top-k / top-p set"
    np.testing.assert_allclose(out.sample_logprobs[i, :len(gen)], sample_lp, atol=1e-4)


def test_stop_tokens_end_rows_early_and_per_row(tiny):
  prompts = _ragged(2, [6, 11], 256)
  hot = DecodeSpec(temperature=1.0, top_p=1.0, top_k=0)  # a random tiny model repeats one token when greedy
  free = tiny.sample(prompts, 20, params=hot, seed=4, stop_tokens=[])
  assert int(free.steps) == 20 and not free.stopped.any()
  first_new = lambda row: next(j for j in range(2, 20) if row[j] not in row[:j])
  j0, j1 = first_new(free.tokens[0].tolist()), first_new(free.tokens[1].tolist()[3:]) + 3
  out = tiny.sample(prompts, 20, params=hot, seed=4,
                    stop_tokens=[[int(free.tokens[0, j0])], [int(free.tokens[1, j1])]])
  assert out.lengths.tolist() == [j0 + 1, j1 + 1]
  assert out.stopped.all()
  assert int(out.steps) == max(j0, j1) + 1  # the loop exits once every row has stopped
  np.testing.assert_array_equal(out.tokens[0, :j0 + 1], free.tokens[0, :j0 + 1])
  assert (out.tokens[0, j0 + 1:] == 0).all() and (out.logprobs[0, j0 + 1:] == 0).all()


def test_seeds_top_k_one_and_tiny_top_p_are_greedy(tiny):
  prompts = _ragged(3, [8, 8], 256)
  greedy = tiny.sample(prompts, 12, params=GREEDY, stop_tokens=[])
  hot = DecodeSpec(temperature=1.0, top_p=1.0, top_k=0)
  a = tiny.sample(prompts, 12, params=hot, seed=1, stop_tokens=[])
  b = tiny.sample(prompts, 12, params=hot, seed=1, stop_tokens=[])
  c = tiny.sample(prompts, 12, params=hot, seed=2, stop_tokens=[])
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)
  for p in (DecodeSpec(temperature=1.0, top_p=1.0, top_k=1),
            DecodeSpec(temperature=1.0, top_p=1e-6, top_k=0)):
    out = tiny.sample(prompts, 12, params=p, seed=9, stop_tokens=[])
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.sample_logprobs, 0.0, atol=1e-6)


def test_temperature_sampling_matches_the_model_distribution():
  """First-token frequencies over 8000 samples agree with softmax(logits / T), not softmax(logits)."""
  model = mj.load_policy("random:tiny-llama", seed=4).model
  model.embed[...] = model.embed[...] * 3.0  # a peaked (non-uniform) next-token distribution
  policy = mj.Policy(model)
  prompt = _ragged(4, [10], 256)[0]
  t = 0.5
  hot = DecodeSpec(temperature=t, top_p=1.0, top_k=0)
  # cache_size = prompt + 1: the 8000 rows are not padded to the 64-slot prompt bucket
  out = policy.sample([prompt] * 8000, 1, params=hot, seed=0, stop_tokens=[], cache_size=len(prompt) + 1)
  logits = np.asarray(policy.logits(np.array([prompt])))[0, -1]
  freq = np.bincount(out.tokens[:, 0], minlength=256) / 8000
  tv = lambda p: 0.5 * np.abs(freq - p).sum()
  tempered, untempered = np.exp(_np_log_softmax(logits / t)), np.exp(_np_log_softmax(logits))
  assert tempered.max() > 0.1 and tv(untempered) > 0.3  # the check can tell temperatures apart
  assert tv(tempered) < 0.08, f"total variation {tv(tempered):.3f}"


def test_generate_returns_text(smollm):
  # 16 new tokens: the one-row greedy program test_smollm2_batch_equals_alone compiled (the same shapes)
  out = smollm.generate(["What is the capital of France? Answer in one word."], 16)
  assert isinstance(out[0], str) and "Paris" in out[0]


def test_chat_stop_tokens_include_every_terminator(smollm):
  """SmolLM2 ends replies with <|im_end|> (its EOS) but may also emit <|endoftext|> (id 0,
  which is also its unknown-token id): both must stop generation."""
  names = smollm.tokenizer.hf.convert_ids_to_tokens(smollm.default_stop_tokens())
  assert set(names) == {"<|im_end|>", "<|endoftext|>"}


def test_non_integer_and_out_of_range_ids_are_refused(tiny):
  """Float and bool ids are never cast silently; ids outside the vocabulary name the bad value."""
  for bad in (np.array([[1.0, 2.0]]), np.array([[1.5, 2.0]], np.float32), np.array([[True, False]])):
    with pytest.raises(TypeError, match=rf"ids must be integer token ids, got dtype {bad.dtype}"):
      tiny.logits(bad)
  with pytest.raises(ValueError,
                     match=r"token ids must lie in \[0, 256\) \(the vocabulary size\); ids holds -1"):
    tiny.logits(np.array([[3, -1, 4]]))
  with pytest.raises(ValueError, match=r"\[0, 256\).*ids holds 256"):
    tiny.logits(np.array([[3, 256]], np.uint16))
  assert tiny.logits(np.array([[3, 255]], np.uint8)).shape == (1, 2, 256)
  with pytest.raises(TypeError, match=r"prompt 1 must be integer token ids, got dtype float64"):
    tiny.sample([[1, 2], [3.0, 4.0]], 2, params=GREEDY)
  with pytest.raises(TypeError, match=r"prompt 0 must be integer token ids, got dtype bool"):
    tiny.sample([np.array([True, True])], 2, params=GREEDY)
  with pytest.raises(ValueError, match=r"\[0, 256\).*prompt 1 holds 300"):
    tiny.sample([[1, 2], [3, 300]], 2, params=GREEDY)
  with pytest.raises(ValueError, match=r"prompt 0 must be a flat sequence of token ids"):
    tiny.sample([[[1, 2]]], 2, params=GREEDY)
  with pytest.raises(TypeError, match=r"stop_tokens of row 0 must be integer token ids, got dtype float64"):
    tiny.sample([[1, 2]], 2, params=GREEDY, stop_tokens=[2.0])


def test_prefill_writes_the_decode_sized_cache_as_the_prompt_sized_one_grown(tiny):
  """`prefill` fills the first P slots of a cache already sized for decoding (`attend_slots`): the
  same logits and cache, bit for bit, as a prompt-sized cache grown after (its old path), and the
  same FLOPs (its attention spans the P prompt slots, not the cache's P + 6)."""
  from flax import nnx
  import jax.numpy as jnp
  from memagent_jax.models.kv_cache import KVCache
  from memagent_jax.policy import sampling
  tokens, valid = (jnp.asarray(x) for x in sampling.left_pad(_ragged(5, [9, 14, 3], 256), 0))
  model = nnx.merge(tiny.graphdef, tiny.state)
  p = tokens.shape[1]
  positions = sampling.positions_from_mask(valid)

  def grown(state):
    m = nnx.merge(tiny.graphdef, state)
    hidden, cache = m(tokens, positions, valid, KVCache.init(m.config, 3, p, m.dtype))
    return m.logits(hidden[:, -1]), cache.grow(p + 6)

  def unwindowed(state):  # what prefill would run if attend_slots were ignored
    m = nnx.merge(tiny.graphdef, state)
    hidden, cache = m(tokens, positions, valid, KVCache.init(m.config, 3, p + 6, m.dtype))
    return m.logits(hidden[:, -1]), cache

  def direct(state):
    return sampling.prefill(nnx.merge(tiny.graphdef, state), tokens, valid, cache_size=p + 6)

  want_logits, want = jax.jit(grown)(tiny.state)
  got_logits, got = jax.jit(direct)(tiny.state)
  np.testing.assert_array_equal(np.asarray(got_logits), np.asarray(want_logits))
  assert got.size == want.size == p + 6 and int(got.cursor) == int(want.cursor) == p
  for g, w in zip(got.k + got.v + (got.valid,), want.k + want.v + (want.valid,)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  flops = {f.__name__: jax.jit(f).lower(tiny.state).compile().cost_analysis()["flops"]
           for f in (grown, direct, unwindowed)}
  assert flops["direct"] < flops["unwindowed"], flops  # the window is what the program attends over
  np.testing.assert_allclose(flops["direct"], flops["grown"], rtol=0.02)

  cache = KVCache.init(model.config, 3, p, model.dtype)
  with pytest.raises(ValueError, match="do not fit a cache of"):
    sampling.prefill(model, tokens, valid, cache_size=p - 1)
  with pytest.raises(ValueError, match=f"attend_slots=4 must lie between this call's {p} tokens"):
    model(tokens, positions, valid, cache, attend_slots=4)
  with pytest.raises(ValueError, match=f"cache's {p} slots"):
    model(tokens, positions, valid, cache, attend_slots=p + 1)
  with pytest.raises(ValueError, match="needs a cache"):
    model(tokens, positions, valid, attend_slots=p)
  with pytest.raises(ValueError, match="past the attended ones"):  # cursor 2: slots 2..p+1 of a p-slot window
    model(tokens, positions, valid, KVCache.init(model.config, 3, p + 6, model.dtype).replace(cursor=jnp.int32(2)),
          attend_slots=p)


def test_sort_descending_gives_the_values_of_the_float_sort_and_process_logits_is_unchanged():
  """The integer-key sort behind top-p returns -sort(-x) value for value (signed zeros may swap places,
  NaNs last, subnormals rank by value where the float sort flushes them to zero), infinities included;
  process_logits with it equals the float sort's bit for bit."""
  import jax.numpy as jnp
  from memagent_jax.policy import sampling
  rng = np.random.default_rng(11)
  x = rng.standard_normal((6, 300)).astype(np.float32) * 30
  x[0, :8] = [0.0, -0.0, np.inf, -np.inf, 1e-42, -1e-42, np.nan, 3.0]
  x[1, :4] = 7.25  # ties
  x[2] = -np.inf
  x[2, 5] = 1.0
  got = np.asarray(jax.jit(sampling.sort_descending)(jnp.asarray(x)))
  want = np.asarray(jax.jit(lambda v: -jnp.sort(-v, axis=-1))(jnp.asarray(x)))
  flush = lambda v: np.where(np.abs(v) < np.finfo(np.float32).tiny, 0.0, v)  # XLA compares subnormals as 0
  np.testing.assert_array_equal(flush(got), flush(want))  # equal as values: 0.0 == -0.0, NaN matches NaN
  sub = int(np.flatnonzero(got[0] == np.float32(1e-42))[0])
  assert got[0, sub + 1] == 0 == got[0, sub + 2]  # the subnormal by its value: above both zeros
  assert np.isnan(got[0, -1]) and not np.isnan(got[0, :-1]).any()

  def reference(logits, spec):  # process_logits with the float sort it replaced
    v = logits / spec.divisor
    if spec.top_k:
      v = jnp.where(v < jax.lax.top_k(v, spec.top_k)[0][:, -1:], -jnp.inf, v)
    desc = -jnp.sort(-v, axis=-1)
    probs = jax.nn.softmax(desc, axis=-1)
    n_keep = jnp.sum(jnp.cumsum(probs, axis=-1) - probs < spec.top_p, axis=-1, keepdims=True)
    return jnp.where(v < jnp.take_along_axis(desc, n_keep - 1, axis=-1), -jnp.inf, v)

  logits = rng.standard_normal((64, 192)).astype(np.float32) * 4
  logits[:8, :20] = np.round(logits[:8, :20])  # ties, and zeros of both signs
  logits[8:16, :10] = -0.0
  logits = jnp.asarray(logits)
  for spec in (DecodeSpec(temperature=0.7, top_p=0.95), DecodeSpec(temperature=1.3, top_p=0.5),
               DecodeSpec(temperature=1.0, top_p=0.9, top_k=12)):  # top-k first: -inf in the sort
    assert spec.use_top_p
    np.testing.assert_array_equal(np.asarray(jax.jit(sampling.process_logits, static_argnums=1)(logits, spec)),
                                  np.asarray(jax.jit(reference, static_argnums=1)(logits, spec)))


def test_a_numpy_array_of_prompts_samples_as_the_list_of_its_rows(tiny):
  """`policy.sample` takes a [B, T] array (every id real) as well as ragged lists."""
  ids = np.random.default_rng(4).integers(0, 256, size=(3, 11))
  from_array = tiny.sample(ids, 8, params=GREEDY, stop_tokens=[])
  from_lists = tiny.sample(ids.tolist(), 8, params=GREEDY, stop_tokens=[])
  np.testing.assert_array_equal(from_array.tokens, from_lists.tokens)
  assert from_array.tokens.shape == (3, 8)
