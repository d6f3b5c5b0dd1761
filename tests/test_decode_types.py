"""The decode side's typed pieces: `DecodeSpec` checks and translates the sampling settings once,
`KVCache` moves its cursor and validity with every write, and both are pytrees jit can take."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.decoder import Decoder, forward_logits
from memagent_jax.models.kv_cache import KVCache
from memagent_jax.policy.decode_spec import GREEDY, DecodeSpec

TINY = ModelConfig(arch="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=-0.5), r"temperature=-0.5 must be a finite number >= 0"),
    (dict(temperature=float("nan")), r"temperature=nan must be a finite number"),
    (dict(temperature="hot"), r"temperature='hot' must be a finite number"),
    (dict(top_p=0.0), r"top_p=0.0 must be a number in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p=1.5 must be a number in \(0, 1\]"),
    (dict(top_k=-1), r"top_k=-1 must be an integer >= 0"),
    (dict(top_k=2.5), r"top_k=2.5 must be an integer >= 0"),
    (dict(top_k=True), r"top_k=True must be an integer"),
])
def test_bad_settings_are_clear_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    DecodeSpec(**kw)


def test_settings_become_the_samplers_switches_once():
  assert GREEDY.greedy and not GREEDY.use_top_p and GREEDY.top_k == 0
  spec = DecodeSpec(temperature=np.float32(0.7), top_p=0.9, top_k=np.int64(20))
  assert not spec.greedy and spec.use_top_p and spec.top_k == 20 and type(spec.top_k) is int
  assert not DecodeSpec(temperature=1.0).use_top_p
  with pytest.raises(TypeError):  # keyword-only
    DecodeSpec(1.0)
  with pytest.raises(AttributeError):  # frozen
    spec.temperature = 2.0
  assert hash(spec) == hash(DecodeSpec(temperature=np.float32(0.7), top_p=0.9, top_k=20))
  assert GREEDY.divisor == 1e-6 and DecodeSpec(temperature=2.0).divisor == 2.0  # never divides by ~0


def test_switches_are_static_and_temperatures_traced():
  """Temperature and top-p are leaves (a new value reuses the program); the switches are structure."""
  leaves, tree = jax.tree.flatten(DecodeSpec(temperature=0.7, top_p=0.9, top_k=5))
  assert leaves == [np.float32(0.7), np.float32(0.9), np.float32(0.7)]  # temperature, top_p, divisor
  assert tree != jax.tree.structure(DecodeSpec(temperature=0.7, top_k=5))  # top-p switched off
  assert tree == jax.tree.structure(DecodeSpec(temperature=1.3, top_p=0.5, top_k=5))
  traces = []

  @jax.jit
  def scaled(spec, x):
    traces.append(spec.greedy)
    return x / spec.divisor

  for t in (0.5, 2.0):
    np.testing.assert_allclose(scaled(DecodeSpec(temperature=t), jnp.ones(3)), 1 / t)
  assert traces == [False]


def test_cache_cursor_and_validity_follow_the_writes():
  model = Decoder(TINY, rngs=nnx.Rngs(0))
  cache = KVCache.init(TINY, 2, 5, jnp.float32)
  assert int(cache.cursor) == 0 and not cache.valid.any() and len(cache.k) == TINY.num_layers
  tokens, valid = jnp.asarray([[0, 7, 9], [4, 5, 6]], jnp.int32), jnp.asarray([[False, True, True], [True] * 3])
  _, cache = model(tokens, jnp.asarray([[0, 0, 1], [0, 1, 2]]), valid, cache)
  assert int(cache.cursor) == 3
  np.testing.assert_array_equal(cache.valid, [[0, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
  assert not jnp.any(cache.k[0][:, :, 3:])  # slots past the cursor untouched
  cache = cache.grow(8)
  assert cache.size == 8 and cache.k[1].shape == (2, TINY.num_kv_heads, 8, TINY.head_dim) and int(cache.cursor) == 3
  h, cache = model(jnp.asarray([[11], [12]]), jnp.asarray([[2], [3]]), jnp.ones((2, 1), bool), cache)
  assert int(cache.cursor) == 4
  np.testing.assert_array_equal(cache.valid[:, :5], [[0, 1, 1, 1, 0], [1, 1, 1, 1, 0]])
  want = forward_logits(model, jnp.asarray([[7, 9, 11]]))[0, -1]  # row 0 alone, unpadded
  np.testing.assert_allclose(model.logits(h[0, 0]), want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="cannot shrink"):
    cache.grow(4)


def test_cache_is_a_pytree_jit_carries():
  cache = KVCache.init(TINY, 1, 4, jnp.float32)
  moved = jax.jit(lambda c: c.replace(cursor=c.cursor + 2))(cache)
  assert isinstance(moved, KVCache) and int(moved.cursor) == 2 and moved.tokens is None
  assert len(jax.tree.leaves(cache)) == 2 * TINY.num_layers + 2
