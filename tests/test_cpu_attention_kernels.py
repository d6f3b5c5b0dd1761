"""The CPU attention kernels (runtime/cpu_attention_kernels.cc: flash for long rows, few queries for decoding):
outputs against a float64 numpy reference, their routing inside `attend`, and gradients equal to XLA's."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memagent_jax.models import attention
from memagent_jax.models.attention import AttentionSpec
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.decoder import Decoder, positions_from_mask
from memagent_jax.models.kv_cache import KVCache
from memagent_jax.runtime import cpu_attention_kernels, cpu_kernels

# the kernels run in CPU programs only (`usable` checks the default backend): a GPU or TPU host skips these
needs_kernel = pytest.mark.skipif(cpu_kernels.precondition_failure() is not None or jax.default_backend() != "cpu",
                                  reason="needs x86-64 with AVX-512F, a C++ compiler and JAX's CPU backend")
CPU = AttentionSpec(backend="xla", platform="cpu")


def _reference(q, k, v, key_valid, q_offset):
  """Masked softmax attention in float64 numpy; also which queries see at least one key."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, h, d = q.shape
  s = key_valid.shape[1]
  g = h // k.shape[1]
  seen = ((q_offset + np.arange(t))[:, None] >= np.arange(s)[None])[None] & np.asarray(key_valid)[:, None]
  out = np.zeros((b, t, h, d))
  for bi in range(b):
    for hi in range(h):
      scores = np.where(seen[bi], q[bi, :, hi] @ k[bi, hi // g, :s].T / np.sqrt(d), -np.inf)
      p = np.exp(scores - np.max(scores, axis=1, keepdims=True, initial=-1e300))  # 0 where nothing is seen
      out[bi, :, hi] = (p / np.maximum(p.sum(1, keepdims=True), 1e-300)) @ v[bi, hi // g, :s]
  return out, seen.any(-1)


def _operands(b, t, s, slots, h, kv_heads, d, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, h, d)).astype(np.float32)
  k, v = (rng.normal(size=(b, kv_heads, slots, d)).astype(np.float32) for _ in range(2))
  key_valid = rng.random((b, s)) > 0.2
  key_valid[0, :5] = False  # left padding: the first queries of row 0 see no key
  return q, k, v, key_valid


@needs_kernel
def test_kernel_is_built_where_it_can_be():
  assert cpu_attention_kernels.unavailable_reason() is None


@needs_kernel
@pytest.mark.parametrize("b, t, s, slots, h, kv_heads, d, q_offset", [
    (1, 100, 100, 100, 9, 3, 64, 0),  # SmolLM2's heads; partial query and key tiles
    (2, 70, 130, 140, 4, 2, 128, 60),  # queries after a prefix, a longer cache, head dim 128
    (1, 257, 257, 300, 6, 3, 64, 0),  # several tiles each way
    (3, 33, 33, 33, 7, 1, 64, 0),  # seven query heads on one key head
    (8, 88, 168, 184, 4, 4, 32, 80),  # the toy reader's memory update after its template opening, head dim 32
])
def test_kernel_matches_float64_reference(b, t, s, slots, h, kv_heads, d, q_offset):
  q, k, v, key_valid = _operands(b, t, s, slots, h, kv_heads, d)
  got = np.asarray(jax.jit(cpu_attention_kernels.flash)(q, k, v, key_valid, q_offset))
  want, sees = _reference(q, k, v, key_valid, q_offset)
  assert np.isfinite(got).all()  # queries that see no key: finite, unspecified
  assert q_offset or not sees.all()  # left padding leaves the first queries without a key
  np.testing.assert_allclose(got[sees], want[sees], atol=5e-6, rtol=0)


@needs_kernel
@pytest.mark.parametrize("b, t, s, slots, h, kv_heads, d, q_offset", [
    (8, 1, 100, 192, 9, 3, 64, 99),  # one decode step of SmolLM2's heads, a decode-sized cache
    (2, 1, 50, 64, 14, 2, 64, 20),  # seven query heads a key head; slots after the query unread
    (3, 4, 70, 80, 4, 2, 128, 66),  # a few queries a row, head dim 128
    (1, 16, 40, 40, 6, 3, 64, 24),  # the most queries it takes
    (8, 1, 170, 184, 4, 4, 32, 169),  # one decode step of the toy reader (head dim 32)
])
def test_few_queries_kernel_matches_float64_reference(b, t, s, slots, h, kv_heads, d, q_offset):
  q, k, v, key_valid = _operands(b, t, s, slots, h, kv_heads, d)
  k[:, :, s:] = np.nan  # slots past key_valid's S are never read
  got = np.asarray(jax.jit(cpu_attention_kernels.few_queries)(q, k, v, key_valid, q_offset))
  want, sees = _reference(q, k, v, key_valid, q_offset)
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got[sees], want[sees], atol=5e-6, rtol=0)


@needs_kernel
def test_attend_decodes_on_the_few_queries_kernel():
  q, k, v, key_valid = _operands(8, 1, 192, 192, 9, 3, 64)
  call = jax.jit(lambda q, k, v, kv, off: attention.attend(q, k, v, kv, q_offset=off, spec=CPU))
  assert cpu_attention_kernels.FEW_QUERIES_TARGET in call.lower(q, k, v, key_valid, 150).as_text()
  want, sees = _reference(q, k, v, key_valid, 150)
  np.testing.assert_allclose(np.asarray(call(q, k, v, key_valid, 150))[sees], want[sees], atol=5e-6)
  many = _operands(1, 17, 192, 192, 9, 3, 64)  # more queries than it takes: XLA's
  assert cpu_attention_kernels.FEW_QUERIES_TARGET not in call.lower(*many, 150).as_text()


@needs_kernel
def test_attend_runs_long_rows_on_the_kernel_and_short_ones_on_xla():
  spec = dataclasses.replace(CPU, query_block=64)
  q, k, v, key_valid = _operands(1, 160, 160, 160, 9, 3, 64)
  hlo = lambda q, k, v, kv, spec: jax.jit(lambda *a: attention.attend(*a, spec=spec)).lower(q, k, v, kv).as_text()
  assert cpu_attention_kernels.TARGET in hlo(q, k, v, key_valid, spec)
  assert cpu_attention_kernels.TARGET not in hlo(q[:, :64], k[:, :, :64], v[:, :, :64], key_valid[:, :64], spec)
  narrow = [x[..., :16] for x in (q, k, v)]  # a head dim without tiles in the kernel
  assert cpu_attention_kernels.TARGET not in hlo(*narrow, key_valid, spec)
  half = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  assert cpu_attention_kernels.TARGET not in hlo(*half, key_valid, spec)
  got = jax.jit(lambda *a: attention.attend(*a, spec=spec))(q, k, v, key_valid)
  want = attention.xla_attention(q, k, v, key_valid, query_block=64)
  sees = _reference(q, k, v, key_valid, 0)[1]
  np.testing.assert_allclose(np.asarray(got)[sees], np.asarray(want)[sees], atol=5e-6)


@needs_kernel
def test_prefill_against_a_cache_runs_on_the_kernel():
  """Queries after a prefix, against a decode-sized cache with more slots than attended (T < S < S')."""
  spec = dataclasses.replace(CPU, query_block=32)
  q, k, v, key_valid = _operands(2, 96, 160, 192, 4, 2, 64)
  call = jax.jit(lambda q, k, v, kv, off: attention.attend(q, k, v, kv, q_offset=off, spec=spec))
  assert cpu_attention_kernels.TARGET in call.lower(q, k, v, key_valid, 64).as_text()
  want, sees = _reference(q, k, v, key_valid, 64)
  np.testing.assert_allclose(np.asarray(call(q, k, v, key_valid, 64))[sees], want[sees], atol=5e-6)


@needs_kernel
def test_a_decoding_prefill_after_a_prefix_runs_on_the_kernel_and_training_on_the_row_steps():
  """T < S within one query block (the memory update's prompt after its shared template opening): flash
  in a prefill for decoding (forward checked, gradients those of the row steps), row steps in training."""
  q, k, v, key_valid = _operands(8, 88, 168, 184, 4, 4, 32)
  key_valid[:] = True  # every query sees keys: the outputs, and so the gradients, are specified
  w = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)
  loss = lambda fn: jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w), argnums=(0, 1, 2)))
  sampling = dataclasses.replace(CPU, decoding_prefill=True)
  kernel = loss(lambda q, k, v: attention.attend(q, k, v, key_valid, q_offset=80, spec=sampling))
  rows = loss(lambda q, k, v: attention.cpu_cache_attention(q, k, v, key_valid, q_offset=80))
  training = loss(lambda q, k, v: attention.attend(q, k, v, key_valid, q_offset=80, spec=CPU))
  assert cpu_attention_kernels.TARGET in kernel.lower(q, k, v).as_text()
  assert cpu_attention_kernels.TARGET not in training.lower(q, k, v).as_text()
  forward = jax.jit(lambda q, k, v: attention.attend(q, k, v, key_valid, q_offset=80, spec=sampling))(q, k, v)
  np.testing.assert_allclose(np.asarray(forward), _reference(q, k, v, key_valid, 80)[0], atol=5e-6)
  (value, got), (rows_value, want) = kernel(q, k, v), rows(q, k, v)
  np.testing.assert_allclose(value, rows_value, rtol=1e-5)
  for g, r in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)


@needs_kernel
def test_gradients_are_xlas():
  spec = dataclasses.replace(CPU, query_block=64)
  q, k, v, key_valid = _operands(1, 130, 130, 130, 4, 2, 64)
  key_valid[:] = True  # every query sees keys: the outputs, and so the gradients, are specified
  w = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)
  loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v) * w)
  kernel = loss(lambda q, k, v: attention.attend(q, k, v, key_valid, spec=spec))
  plain = loss(lambda q, k, v: attention.xla_attention(q, k, v, key_valid, query_block=64))
  with_grads = lambda fn: jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))
  assert cpu_attention_kernels.TARGET in with_grads(kernel).lower(q, k, v).as_text()
  (value, got), (plain_value, want) = with_grads(kernel)(q, k, v), with_grads(plain)(q, k, v)
  np.testing.assert_allclose(value, plain_value, rtol=1e-5)
  for g, r in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)


@needs_kernel
# flash on whole rows; few queries on a cache; flash on a cache within one query block (row-step gradients)
@pytest.mark.parametrize("t, s, q_offset", [(130, 130, 0), (4, 130, 100), (40, 130, 90)])
def test_gradients_with_the_mask_and_offset_traced_inside_remat_and_scan(t, s, q_offset):
  """The mask and the first query's slot made inside a remat block and a scan step (as the decoder's blocks
  make them): the backward pass, run outside those traces, still gets them, and equals XLA's."""
  spec = dataclasses.replace(CPU, query_block=64)
  q, k, v, key_valid = _operands(2, t, s, s, 4, 2, 64)
  key_valid[:] = True
  w = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)

  def loss(fn):
    def block(q, k, v, valid, cursor):  # the mask and the offset are tracers of this block
      return jnp.sum(fn(q, k, v, valid[:, :s], cursor + 0) * w)

    def scanned(q, k, v):
      step = lambda carry, valid: (carry + jax.checkpoint(block)(q, k, v, valid, jnp.int32(q_offset)), None)
      return jax.lax.scan(step, 0.0, jnp.stack([jnp.asarray(key_valid)] * 2))[0]
    return jax.jit(jax.value_and_grad(scanned, argnums=(0, 1, 2)))

  spec = dataclasses.replace(spec, decoding_prefill=True)  # (40, 130, 90): flash only in a prefill for decoding
  kernel = loss(lambda q, k, v, valid, off: attention.attend(q, k, v, valid, q_offset=off, spec=spec))
  plain = loss(lambda q, k, v, valid, off: attention.xla_attention(q, k, v, valid, q_offset=off, query_block=64))
  targets = (cpu_attention_kernels.TARGET, cpu_attention_kernels.FEW_QUERIES_TARGET)
  assert any(name in kernel.lower(q, k, v).as_text() for name in targets)
  (value, got), (plain_value, want) = kernel(q, k, v), plain(q, k, v)
  np.testing.assert_allclose(value, plain_value, rtol=1e-5)
  for g, r in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-4)


@needs_kernel
def test_a_nan_score_gives_nan_outputs_as_xla_does():
  q, k, v, key_valid = _operands(1, 100, 100, 100, 9, 3, 64)
  key_valid[:] = True
  q[0, 70, 0, 0] = np.nan  # query 70 of head 0: every score it has is NaN
  got = np.asarray(jax.jit(cpu_attention_kernels.flash)(q, k, v, key_valid))
  assert np.isnan(got[0, 70, 0]).all() and np.isfinite(np.delete(got[0, :, 0], 70, axis=0)).all()
  few = np.asarray(jax.jit(cpu_attention_kernels.few_queries)(q[:, 70:71], k, v, key_valid, 70))
  assert np.isnan(few[0, 0, 0]).all() and np.isfinite(few[0, 0, 1:]).all()


_MESH_SCRIPT = """
import dataclasses, jax, numpy as np
from memagent_jax.models import attention
spec = attention.AttentionSpec(backend="xla", platform="cpu", query_block=32)
rng = np.random.default_rng(0)
q = rng.normal(size=(2, 80, 4, 64)).astype(np.float32)
k, v = (rng.normal(size=(2, 2, 80, 64)).astype(np.float32) for _ in range(2))
key_valid = np.ones((2, 80), bool)
plain = np.asarray(jax.jit(lambda *a: attention.attend(*a, spec=spec))(q, k, v, key_valid))  # 2 devices, no mesh
mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
with jax.set_mesh(mesh):
  call = jax.jit(lambda *a: attention.attend(*a, spec=spec))
  text = call.lower(q, k, v, key_valid).as_text()
  got = np.asarray(call(q, k, v, key_valid))
calls = [line for line in text.splitlines() if "memagent_flash_attention" in line]
print("CALLS", len(calls), "ONE_ROW", all("tensor<1x80x4x64xf32>" in line for line in calls))
print("ERR", float(np.abs(got - plain).max()))
"""


@needs_kernel
def test_each_device_runs_its_own_rows_under_a_mesh():
  """Two CPU devices with a mesh in context: the kernel runs on each device's one row (a shard_map), with
  the outputs of XLA's attention, which two devices without a mesh keep."""
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("CALLS", "ERR")))
  assert lines["CALLS"].startswith("1 ONE_ROW True"), out.stdout
  assert float(lines["ERR"]) < 5e-6, out.stdout


def _one_layer_decoder_with_head_dim_32():
  """(cfg, graphdef, params, tokens, positions, valid): a one-layer decoder on the kernels' smallest head dim
  and two rows of 50 tokens, the second left-padded by 4."""
  cfg = ModelConfig(arch="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                    num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=128,
                    tie_word_embeddings=True, attention_bias=False)
  graphdef, params = nnx.split(Decoder(cfg, attention=CPU, rngs=nnx.Rngs(0)))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(2, 50)), jnp.int32)
  valid = jnp.ones((2, 50), bool).at[1, :4].set(False)
  return cfg, graphdef, params, tokens, positions_from_mask(valid), valid


@needs_kernel
def test_the_decoder_runs_a_decoding_prefill_on_the_kernel_and_a_training_forward_on_the_row_steps():
  """Decoder(attend_slots=): the queries after a cached prefix run on flash; the same tokens through a cache
  of exactly their slots (training's shared-prefix forward) keep the row steps. Their hidden states agree."""
  cfg, graphdef, params, tokens, positions, valid = _one_layer_decoder_with_head_dim_32()

  def after_prefix(params, slots, attend_slots):
    model = nnx.merge(graphdef, params)
    _, cache = model(tokens[:, :20], positions[:, :20], valid[:, :20], KVCache.init(cfg, 2, slots, model.dtype))
    return model(tokens[:, 20:], positions[:, 20:], valid[:, 20:], cache, attend_slots=attend_slots)[0]

  decoding = jax.jit(lambda p: after_prefix(p, 60, 50))
  training = jax.jit(lambda p: after_prefix(p, 50, None))
  assert cpu_attention_kernels.TARGET in decoding.lower(params).as_text()
  assert cpu_attention_kernels.TARGET not in training.lower(params).as_text()
  np.testing.assert_allclose(np.asarray(decoding(params)), np.asarray(training(params)), atol=2e-5)


@needs_kernel
def test_the_updates_response_slots_run_on_the_few_queries_kernel():
  """A training forward at only its last 10 slots (the update's `out_slots`): those queries against the
  row are few_queries' case, in the forward and (through XLA's reference) the gradients."""
  _, graphdef, params, tokens, positions, valid = _one_layer_decoder_with_head_dim_32()
  forward = lambda p, out_slots=None: nnx.merge(graphdef, p)(tokens, positions, valid, out_slots=out_slots)[0]
  last = jax.jit(lambda p: forward(p, (40, 50)))
  assert cpu_attention_kernels.FEW_QUERIES_TARGET in last.lower(params).as_text()
  np.testing.assert_allclose(np.asarray(last(params)), np.asarray(jax.jit(forward)(params))[:, 40:], atol=2e-5)
  grad = jax.jit(jax.grad(lambda p: jnp.sum(forward(p, (40, 50)) ** 2)))(params)
  want = jax.jit(jax.grad(lambda p: jnp.sum(forward(p)[:, 40:] ** 2)))(params)
  for g, w in zip(jax.tree.leaves(grad), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
