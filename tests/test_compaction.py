"""Row compaction (policy/compaction.py): bucket sizes by hand, the gather/scatter by hand, and a
compacted decode (the agent's memory turns, the sampler's second phase) giving the same tokens as the
uncompacted one for the same keys, on one device and split over two forced host devices."""

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import memagent_jax as mj
from memagent_jax.data import toy
from memagent_jax.policy import compaction
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.policy.sampling import PromptRows, left_pad, row_keys, sample_from_prompts
from test_parallel import run_on_emulated_devices


def test_bucket_sizes():
  assert compaction.bucket_sizes(8, 3) == (2, 4, 8)
  assert compaction.bucket_sizes(5, 3) == (2, 3, 5)
  assert compaction.bucket_sizes(8, 1) == (8,)
  assert compaction.bucket_sizes(1, 3) == (1,)
  assert compaction.bucket_sizes(4, 5) == (1, 2, 4)
  with pytest.raises(ValueError, match="decode_buckets=0"):
    compaction.bucket_sizes(8, 0)


@pytest.mark.parametrize("selected, bucket", [([1, 3], 2), ([0, 2, 5], 4), ([0, 1, 2, 3, 4, 5, 6], 8), ([], 2)])
def test_run_compacted_by_hand(selected, bucket):
  """fn sees the selected rows first (in row order) in the smallest bucket that holds them; selected
  rows get fn's values, the others the fallback's."""
  x = jnp.arange(8, dtype=jnp.int32) * 10  # [8]
  select = jnp.zeros(8, bool).at[jnp.asarray(selected, jnp.int32)].set(True)

  def fn(rows):
    size = rows.shape[0]
    return rows + 1, jnp.full((size,), size, jnp.int32), jnp.int32(size)  # row values, the bucket, a scalar

  fallback = (jnp.full(8, -1, jnp.int32), jnp.zeros(8, jnp.int32), jnp.int32(0))
  plus, size, scalar = jax.jit(lambda s, r: compaction.run_compacted(fn, s, r, fallback, buckets=3))(select, x)
  want = np.full(8, -1)
  want[selected] = np.asarray(selected) * 10 + 1
  np.testing.assert_array_equal(plus, want)
  want_size = np.zeros(8, int)
  want_size[selected] = bucket
  np.testing.assert_array_equal(size, want_size)
  assert int(scalar) == bucket


@pytest.fixture
def bucket_calls(monkeypatch):
  """The bucket sizes every compaction was traced with: a compacted run must have had several to choose from."""
  calls = []
  sizes = compaction.bucket_sizes
  monkeypatch.setattr(compaction, "bucket_sizes", lambda *a: calls.append(sizes(*a)) or calls[-1])
  return calls


def test_sampler_second_phase_same_tokens(bucket_calls):
  """sample_from_prompts with the rows still decoding after 2 tokens compacted: the same tokens,
  log-probs, lengths and stops as one batch to the end (rows sampled at temperature 1, some inactive)."""
  policy = mj.load_policy("random:toy-tiny", seed=4)
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(5, 150, size=int(n))) for n in rng.integers(3, 12, size=8)]
  tokens, valid = left_pad(prompts, pad_id=0)
  vocab = policy.config.vocab_size
  stops = np.stack([rng.choice(vocab, vocab // 5, replace=False) for _ in range(8)]).astype(np.int32)  # frequent stops
  rows = PromptRows(tokens=jnp.asarray(tokens), valid=jnp.asarray(valid),
                    keys=row_keys(jax.random.PRNGKey(1), np.arange(8)), stop_tokens=jnp.asarray(stops),
                    inactive=jnp.asarray([False, False, True, False, False, False, True, False]))
  model = policy.model
  run = jax.jit(lambda r, after, buckets: sample_from_prompts(
      model, r, DecodeSpec(temperature=1.0), max_new_tokens=12, pad_id=0,
      compaction=compaction.Compaction(after=after, buckets=buckets)), static_argnums=(1, 2))
  plain = run(rows, 0, 1)
  assert bucket_calls == []  # no compaction asked: none traced
  compact = run(rows, 2, 3)
  assert bucket_calls == [(2, 4, 8)]  # the second phase chose among three sizes
  for a, b in zip(plain, compact):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  lengths = np.asarray(plain.lengths)
  assert 0 < np.sum(lengths > 2) < 6 and np.any((lengths > 0) & (lengths <= 2))  # some rows ended before the split


def _read(buckets: int, docs):
  policy = mj.load_policy("random:toy-tiny", seed=2)
  agent = mj.MemAgent(policy, chunk_tokens=toy.CHUNK_TOKENS, memory_tokens=toy.MEMORY_TOKENS,
                      answer_tokens=toy.ANSWER_TOKENS, question_tokens=16, block_chunks=2, memory="gated",
                      gate_forms="keep_stop", decode_buckets=buckets)
  results = agent.answer_batch([d["question"] for d in docs], [d["context"] for d in docs], temperature=1.0, seed=3)
  return [(r.gates, r.memories, [[int(t) for t in c.response_ids] for c in r.conversations]) for r in results]


def _docs():
  """Toy documents of 1 to 4 chunks: rows end at different turns (inactive rows)."""
  return [toy.generate(1, k * toy.CHUNK_TOKENS, seed=10 + k)[0] for k in (1, 4, 2, 4, 3, 1, 4, 2)]


@pytest.fixture(scope="module")
def plain_read():
  """The gated agent's read of _docs() with every row in every memory turn, on one device."""
  return _read(1, _docs())


def test_compacted_memory_turns_same_conversations(plain_read, bucket_calls):
  """A gated agent with memory turns compacted into 3 bucket sizes reads exactly as with every row in every turn."""
  plain, compact = plain_read, _read(3, _docs())
  assert plain == compact
  # the rows before the prefill among (2, 4, 8); then inside each of those buckets, the rows still decoding
  # after the form among that bucket's own halvings (an uncompacted read has one size: no choice)
  assert sorted(c for c in bucket_calls if len(c) > 1) == [(1, 2), (1, 2, 4), (2, 4, 8), (2, 4, 8)]
  assert {g for gates, _, _ in plain for g in gates} >= {"memory"}


MESH_SCRIPT = textwrap.dedent("""
  import json
  import jax
  import numpy as np
  import memagent_jax as mj
  from memagent_jax.data import toy
  from memagent_jax.policy import compaction
  from memagent_jax.runtime import parallel

  seen = []  # the row groups each compaction was traced with: 2, one per device, when the mesh is in context
  row_groups = compaction.row_groups
  compaction.row_groups = lambda rows: seen.append(row_groups(rows)) or seen[-1]
  mesh = parallel.make_mesh(parallel.MeshSpec(data=2, fsdp=1, tensor=1))
  docs = [toy.generate(1, k * toy.CHUNK_TOKENS, seed=10 + k)[0] for k in (1, 4, 2, 4, 3, 1, 4, 2)]  # _docs()
  policy = mj.load_policy("random:toy-tiny", seed=2)
  agent = mj.MemAgent(policy, chunk_tokens=toy.CHUNK_TOKENS, memory_tokens=toy.MEMORY_TOKENS,
                      answer_tokens=toy.ANSWER_TOKENS, question_tokens=16, block_chunks=2, memory="gated",
                      gate_forms="keep_stop", decode_buckets=3, mesh=mesh)
  results = agent.answer_batch([d["question"] for d in docs], [d["context"] for d in docs], temperature=1.0, seed=3)
  read = [[r.gates, r.memories, [[int(t) for t in c.response_ids] for c in r.conversations]] for r in results]
  print(json.dumps(dict(read=read, devices=len(jax.devices()), groups=sorted(set(seen)))))
""")


def test_compacted_memory_turns_on_two_devices(plain_read):
  """The same reads with rows split over a data axis of 2, each device compacting its own rows, as the
  uncompacted read on one device (a row's tokens do not depend on the device count: test_rollout_sharding)."""
  result = run_on_emulated_devices(MESH_SCRIPT, n=2, timeout=600)  # the tests' compile flags and cache
  assert result["devices"] == 2 and result["groups"] == [2]
  assert result["read"] == json.loads(json.dumps(plain_read))  # as JSON: tuples -> lists
