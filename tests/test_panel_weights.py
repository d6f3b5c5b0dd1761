"""The CPU panel kernel for decode's few-row products (runtime/cpu_panel_matmul.cc, models/panel_weights):
the products against a float64 reference, the panel layout, gradients, and a decode loop on panels
against the same loop on XLA's products."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import memagent_jax as mj
from memagent_jax.models import panel_weights
from memagent_jax.models.panel_weights import PanelWeight
from memagent_jax.policy import sampling
from memagent_jax.policy.decode_spec import GREEDY
from memagent_jax.runtime import cpu_kernels, cpu_panel_matmul


# the kernels run in CPU programs only (`usable` checks the default backend): a GPU or TPU host skips these
needs_kernel = pytest.mark.skipif(cpu_kernels.precondition_failure() is not None or jax.default_backend() != "cpu",
                                  reason="needs x86-64 with AVX-512F, a C++ compiler and JAX's CPU backend")


@needs_kernel
def test_kernel_is_built_where_it_can_be():
  """On a machine that can build it (this project's CI hosts), the kernel is there: its tests never skip."""
  assert cpu_panel_matmul.unavailable_reason() is None


def test_pack_puts_48_columns_per_panel_row_after_row():
  w = np.arange(3 * 100, dtype=np.float32).reshape(3, 100)  # [K, N]
  panels = np.asarray(cpu_panel_matmul.pack(jnp.asarray(w)))
  assert panels.shape == (3, 3, 48)  # ceil(100 / 48) panels
  for t in range(3):
    cols = w[:, 48 * t:48 * (t + 1)]
    np.testing.assert_array_equal(panels[t, :, :cols.shape[1]], cols)
    np.testing.assert_array_equal(panels[t, :, cols.shape[1]:], 0.0)


@needs_kernel
@pytest.mark.parametrize("m,k,n", [(1, 576, 1536), (8, 576, 1536), (3, 5, 1), (9, 64, 100), (16, 577, 48),
                                   (7, 130, 49152 // 64)])
def test_product_matches_float64(m, k, n):
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(m), (m, k)), np.float32)
  w = np.asarray(jax.random.normal(jax.random.PRNGKey(k + n), (k, n)), np.float32)
  got = np.asarray(jax.jit(lambda x, w: cpu_panel_matmul.product(x, cpu_panel_matmul.pack(w), n))(x, w))
  ref = x.astype(np.float64) @ w.astype(np.float64)
  bound = 4 * k * np.finfo(np.float32).eps * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64))
  assert got.shape == (m, n)
  assert np.all(np.abs(got - ref) <= bound + 1e-30)
  assert not np.array_equal(got, np.zeros_like(got))


@needs_kernel
def test_leading_dims_and_rows_beyond_few_fall_back():
  """Rows are every leading dim (x [B, 1, K] in decode); more than FEW_ROWS rows use XLA's product on the
  plain array."""
  w = jax.random.normal(jax.random.PRNGKey(0), (64, 96))
  pw = PanelWeight(w, cpu_panel_matmul.pack(w))
  x = jax.random.normal(jax.random.PRNGKey(1), (5, 64))
  assert panel_weights.on_panels(x, pw)
  np.testing.assert_allclose(panel_weights.matmul(x, pw), jnp.dot(x, w, precision="highest"), rtol=1e-5, atol=1e-5)
  x3 = x.reshape(5, 1, 64)
  np.testing.assert_allclose(panel_weights.matmul(x3, pw), jnp.dot(x3, w, precision="highest"), rtol=1e-5, atol=1e-5)
  many = jax.random.normal(jax.random.PRNGKey(2), (cpu_panel_matmul.FEW_ROWS + 1, 64))
  assert not panel_weights.on_panels(many, pw)
  assert not panel_weights.on_panels(many.reshape(cpu_panel_matmul.FEW_ROWS + 1, 1, 64), pw)
  hlo = jax.jit(panel_weights.matmul).lower(many, pw).as_text()
  assert cpu_panel_matmul.TARGET not in hlo
  assert cpu_panel_matmul.TARGET in jax.jit(panel_weights.matmul).lower(x, pw).as_text()


@needs_kernel
def test_gradients_are_those_of_the_plain_product():
  w = jax.random.normal(jax.random.PRNGKey(0), (32, 50))
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 2, 32))  # rows over two leading dims
  loss = lambda x, w: jnp.sum(jnp.sin(panel_weights.matmul(x, PanelWeight(w, cpu_panel_matmul.pack(w)))))
  plain = lambda x, w: jnp.sum(jnp.sin(jnp.dot(x, w, precision="highest")))
  for got, want in zip(jax.grad(loss, (0, 1))(x, w), jax.grad(plain, (0, 1))(x, w)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_small_models_and_many_rows_keep_xla_products(monkeypatch):
  policy = mj.load_policy("random:tiny-smollm2", seed=0)
  model = nnx.merge(policy.graphdef, policy.state)
  assert not panel_weights.usable(model, 8)  # a few MB of weights: under MIN_MODEL_BYTES
  assert panel_weights.for_decode(model, 8) is model
  monkeypatch.setattr(panel_weights, "MIN_MODEL_BYTES", 0)
  assert panel_weights.usable(model, cpu_panel_matmul.FEW_ROWS) == cpu_panel_matmul.available()
  assert not panel_weights.usable(model, cpu_panel_matmul.FEW_ROWS + 1)
  bf16 = nnx.merge(policy.graphdef, jax.tree.map(lambda x: x.astype(jnp.bfloat16), policy.state))
  assert not panel_weights.usable(bf16, 8)  # float32 weights only
  monkeypatch.setattr(panel_weights, "MAX_MODEL_BYTES", 1 << 10)  # the panels would double too much memory
  assert not panel_weights.usable(model, 8)


@pytest.fixture
def fresh_traces():
  """Programs traced with a changed threshold are dropped afterwards (the threshold is not in jit's key)."""
  yield
  jax.clear_caches()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3])
def test_decode_on_panels_matches_xla_products(monkeypatch, fresh_traces, rows):
  """A whole greedy generation, the decode loop's products on panels (every projection and the tied
  logits), against the same loop on XLA's products: the same tokens, log-probs within float32 rounding."""
  policy = mj.load_policy("random:tiny-smollm2", seed=3)
  tokens, valid = sampling.left_pad([[5 + 7 * r + i for i in range(6 + r)] for r in range(rows)], 0)
  batch = sampling.PromptRows(tokens=jnp.asarray(tokens), valid=jnp.asarray(valid),
                              keys=sampling.row_keys(jax.random.PRNGKey(0), np.arange(rows)),
                              stop_tokens=jnp.full((rows, 1), -1, jnp.int32), inactive=jnp.zeros((rows,), bool))

  def generate():
    jax.clear_caches()
    return jax.device_get(sampling.generate_tokens(policy.graphdef, policy.state, batch, GREEDY, max_new_tokens=12,
                                                   cache_size=32, pad_id=0))

  plain = generate()
  monkeypatch.setattr(panel_weights, "MIN_MODEL_BYTES", 0)
  model = nnx.merge(policy.graphdef, policy.state)
  assert panel_weights.usable(model, rows)
  jax.clear_caches()  # the plain run's trace does not know the threshold changed
  hlo = jax.jit(lambda s: sampling.generate_tokens(policy.graphdef, s, batch, GREEDY, max_new_tokens=12, cache_size=32,
                                                   pad_id=0)).lower(policy.state).as_text()
  assert hlo.count(cpu_panel_matmul.TARGET) >= 1
  panels = generate()
  np.testing.assert_array_equal(panels.tokens, plain.tokens)
  np.testing.assert_array_equal(panels.lengths, plain.lengths)
  np.testing.assert_allclose(panels.logprobs, plain.logprobs, atol=1e-4)


def test_switch_turns_the_kernel_off():
  code = ("from memagent_jax.runtime import cpu_panel_matmul as k; r = k.unavailable_reason(); "
          "print(r); assert r and 'MEMAGENT_JAX_CPU_KERNELS=0' in r")
  env = {**os.environ, cpu_kernels.SWITCH: "0", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
