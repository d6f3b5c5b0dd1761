"""Attention backends: each against a dense numpy reference on padded rows, the platform checks,
and a jaxpr walk proving no [.., T, T] tensor exists in a long forward + backward pass.

No GPU or TPU here: the `cudnn` glue (row packing, lengths) runs with the XLA implementation of
`jax.nn.dot_product_attention` in its place, and `splash` runs its Pallas kernel in interpret mode
(`AttentionSpec(emulate_kernels=True)`).
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import memagent_jax as mj
from memagent_jax.models import attention
from memagent_jax.models.attention import AttentionSpec
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.decoder import Decoder, forward_logits, positions_from_mask
from memagent_jax.rl.update import response_logprobs

TINY = ModelConfig(arch="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=1 << 16)


def _rows(b, t, seed):
  """key_valid [B, T] covering every row shape the codebase makes: left-padded prompt, prompt +
  right-padded response, full, right-padded only, a single token, and all padding."""
  rng = np.random.default_rng(seed)
  valid = np.zeros((b, t), bool)
  for r in range(b):
    kind = r % 6
    lo, hi = sorted(rng.integers(1, t, size=2))
    if kind == 0:
      valid[r, lo:] = True
    elif kind == 1:
      valid[r, lo:max(hi, lo + 1)] = True
    elif kind == 2:
      valid[r] = True
    elif kind == 3:
      valid[r, :hi] = True
    elif kind == 4:
      valid[r, lo] = True
  return valid


def _qkv(b, t, s, h, kh, d, seed, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, h, d))
  k, v = rng.normal(size=(2, b, kh, s, d))
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _reference(q, k, v, key_valid, q_offset=0):
  """Dense float64 attention with the mask built in full: causal over slots and key valid."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, h, d = q.shape
  s = k.shape[2]
  g = h // k.shape[1]
  k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # [B, H, S, D]
  mask = ((q_offset + np.arange(t))[:, None] >= np.arange(s)[None])[None] & np.asarray(key_valid)[:, None]
  scores = np.einsum("bthd,bhsd->bhts", q, k) / np.sqrt(d)
  scores = np.where(mask[:, None], scores, -1e30)  # all-padding rows: uniform, never compared
  scores -= np.max(scores, -1, keepdims=True)
  p = np.exp(scores)
  return np.einsum("bhts,bhsd->bthd", p / p.sum(-1, keepdims=True), v)


def _close_on_valid(out, ref, valid, atol=1e-5):
  out = np.asarray(out)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out[valid], ref[valid], atol=atol, rtol=0)


@pytest.mark.parametrize("t", [24, 80, 200])  # one block / unrolled blocks / lax.map (partial blocks)
@pytest.mark.parametrize("h,kh", [(4, 2), (3, 1), (2, 2)])  # GQA, MQA, MHA
def test_xla_matches_dense_reference(t, h, kh):
  q, k, v = _qkv(6, t, t, h, kh, 8, seed=t + h)
  valid = _rows(6, t, seed=t)
  out = attention.attend(q, k, v, jnp.asarray(valid), spec=AttentionSpec(backend="xla", query_block=32, scan_from=96))
  _close_on_valid(out, _reference(q, k, v, valid), valid)


@pytest.mark.parametrize("t,offset", [(1, 37), (5, 20), (40, 9)])  # decode, a short chunk, a long one
def test_xla_against_a_cache_matches_reference(t, offset):
  """Queries at slots offset.. against S > T cache slots (T = 40 > the block: the looped path)."""
  s = 64
  q, k, v = _qkv(3, t, s, 4, 2, 8, seed=t)
  valid = np.zeros((3, s), bool)
  valid[0, 4:offset + t] = valid[1, offset - 1:offset + t] = valid[2, :offset + t] = True
  spec = AttentionSpec(backend="xla", query_block=16, scan_from=16)
  run = jax.jit(lambda q, k, v, kv, off: attention.attend(q, k, v, kv, q_offset=off, spec=spec))
  out = run(q, k, v, jnp.asarray(valid), jnp.int32(offset))  # a traced offset, as in decoding
  _close_on_valid(out, _reference(q, k, v, valid, offset), np.ones((3, t), bool))


def _loss_grads(fn, q, k, v, valid):
  """Gradients of a valid-query-weighted sum (padding query outputs are unspecified)."""
  w = jnp.asarray(np.random.default_rng(0).normal(size=q.shape)) * valid[:, :, None, None]
  return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * w), argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("h,kh", [(4, 2), (2, 2)])
def test_cudnn_glue_packs_rows_and_matches_reference(h, kh):
  """The cudnn backend's row packing + sequence lengths, with XLA in the kernel's place."""
  cudnn = lambda *a: attention.cudnn_attention(*a, implementation="xla")
  q, k, v = _qkv(6, 40, 40, h, kh, 8, seed=1)
  valid = _rows(6, 40, seed=3)
  kv = jnp.asarray(valid)
  out = jax.jit(cudnn)(q, k, v, kv)
  _close_on_valid(out, _reference(q, k, v, valid), valid)
  assert np.all(np.asarray(out)[~valid] == 0)
  ours = _loss_grads(lambda *a: cudnn(*a, kv), q, k, v, valid)
  xla = _loss_grads(lambda *a: attention.xla_attention(*a, kv), q, k, v, valid)
  for a, b in zip(ours, xla):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_splash_glue_matches_reference_in_interpret_mode():
  """Segment ids + causal block mask, T = 200 padded to the 128-lane tile, GQA; fwd and bwd."""
  splash = lambda *a: attention.splash_attention(*a, interpret=True)
  q, k, v = _qkv(3, 200, 200, 4, 2, 8, seed=2)
  valid = _rows(6, 200, seed=4)[[0, 1, 3]]
  kv = jnp.asarray(valid)
  _close_on_valid(splash(q, k, v, kv), _reference(q, k, v, valid), valid)
  ours = _loss_grads(lambda *a: splash(*a, kv), q, k, v, valid)
  xla = _loss_grads(lambda *a: attention.xla_attention(*a, kv), q, k, v, valid)
  for a, b in zip(ours, xla):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("fused", ["cudnn", "splash"])
def test_training_forward_and_gradients_equal_across_backends(fused):
  """Whole model, training rows (prompt left-padded, response right-padded): response log-probs
  and their parameter gradients through each fused backend's glue equal the xla backend's."""
  p, n = 12, 9
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, 64, size=(3, p + n)), jnp.int32)
  valid = np.zeros((3, p + n), bool)
  valid[0, 3:p + 5] = valid[1, :] = valid[2, p - 1:p + 2] = True
  model = Decoder(TINY, attention="xla", rngs=nnx.Rngs(0))

  def run():
    graphdef, params = nnx.split(model)  # the backend is a static field of the graphdef

    def loss(params):
      logp, _ = response_logprobs(nnx.merge(graphdef, params), tokens, jnp.asarray(valid), prompt_width=p,
                                  remat=False, temperature=1.0)
      return jnp.sum(jnp.where(valid[:, p:], logp, 0.0)), logp
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  (_, ref_logp), ref_grads = run()
  model.set_attention(AttentionSpec(backend=fused, emulate_kernels=True))
  (_, logp), grads = run()
  np.testing.assert_allclose(np.asarray(logp)[valid[:, p:]], np.asarray(ref_logp)[valid[:, p:]], atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_prefill_through_the_cudnn_glue_samples_the_same_tokens():
  """Left-packed prompts: prefill runs the packed-rows path, decoding the xla path over the cache."""
  from memagent_jax.policy.decode_spec import GREEDY
  from memagent_jax.policy.sampling import PromptRows, left_pad, sample_from_prompts
  model = Decoder(TINY, attention="xla", rngs=nnx.Rngs(1))
  rng = np.random.default_rng(6)
  tokens, valid = left_pad([rng.integers(0, 64, size=n).tolist() for n in (3, 11, 7)], 0)

  def sample():
    return jax.jit(lambda t, m: sample_from_prompts(
        model, PromptRows(tokens=t, valid=m, keys=jnp.zeros((3, 2), jnp.uint32), stop_tokens=-jnp.ones((3, 1), jnp.int32),
                          inactive=jnp.zeros((3,), bool)), GREEDY, max_new_tokens=8, pad_id=0, cache_size=24))(tokens, valid)

  ref = sample()
  model.set_attention(AttentionSpec(backend="cudnn", emulate_kernels=True))
  out = sample()
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=1e-5)


def test_choosing_a_backend_the_platform_lacks_is_a_clear_error():
  assert jax.default_backend() == "cpu"
  for name, what in (("cudnn", "NVIDIA GPU"), ("splash", "TPU")):
    with pytest.raises(ValueError, match=f"model.attention='{name}' .*{what}.*'cpu'"):
      attention.check_backend(name)
    with pytest.raises(ValueError, match=f"model.attention='{name}'"):
      mj.load_policy("random:tiny-llama", attention=name)
    with pytest.raises(ValueError, match=f"model.attention='{name}'"):
      Decoder(TINY, attention=name, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="model.attention='flash' is not a backend; choose one of auto, xla"):
    attention.check_backend("flash")


def test_auto_picks_xla_on_cpu_and_cudnn_only_for_16_bit_on_gpu():
  for dtype in (jnp.float32, jnp.bfloat16):
    assert attention.resolve_backend("auto", dtype) == "xla"
  assert mj.load_policy("random:tiny-llama").model.attention.backend == "auto"
  assert attention.resolve_backend("auto", jnp.bfloat16, "tpu") == "splash"  # by the target, not this host
  nvidia = dict(has_cudnn=True)  # as on an NVIDIA GPU
  assert attention.resolve_backend("auto", jnp.bfloat16, "gpu", **nvidia) == "cudnn"
  assert attention.resolve_backend("auto", jnp.float32, "gpu", **nvidia) == "xla"  # cuDNN has no fp32 flash kernel
  assert attention.resolve_backend("auto", jnp.bfloat16, "gpu", has_cudnn=False) == "xla"  # e.g. ROCm
  with pytest.raises(ValueError, match="model.attention='cudnn' runs bfloat16 or float16.*float32"):
    attention.resolve_backend("cudnn", jnp.float32, "gpu", **nvidia)


def test_decoder_refuses_a_dense_mask():
  model = Decoder(TINY, rngs=nnx.Rngs(0))
  tokens = jnp.zeros((2, 6), jnp.int32)
  with pytest.raises(ValueError, match=r"valid \(2, 6, 6\) must match tokens \(2, 6\)"):
    model(tokens, positions_from_mask(jnp.ones((2, 6), bool)), jnp.ones((2, 6, 6), bool))


def _big_intermediates(jaxpr, t, found):
  """Every intermediate (at any nesting: jit, scan, remat, custom vjp) with two dims >= t."""
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      shape = getattr(var.aval, "shape", ())
      if sum(dim >= t for dim in shape) >= 2:
        found.append(f"{eqn.primitive.name} -> {shape}")
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
        if hasattr(sub, "eqns"):
          _big_intermediates(sub, t, found)
  return found


def _train_jaxpr(model, t):
  """Forward + backward of the training log-probs over one row of t tokens (traced, not run)."""
  graphdef, params = nnx.split(model)
  tokens = jax.ShapeDtypeStruct((1, t), jnp.int32)
  valid = jax.ShapeDtypeStruct((1, t), jnp.bool_)

  def loss(params, tokens, valid):
    logp, _ = response_logprobs(nnx.merge(graphdef, params), tokens, valid, prompt_width=t // 2, remat=True,
                                temperature=1.0)
    return jnp.sum(logp)

  return jax.make_jaxpr(jax.grad(loss))(params, tokens, valid).jaxpr


@pytest.mark.parametrize("t", [4096, 16384])  # the unrolled-block and the lax.map paths as shipped
def test_long_forward_and_backward_hold_no_t_by_t_tensor(t):
  found = _big_intermediates(_train_jaxpr(Decoder(TINY, rngs=nnx.Rngs(0)), t), t, [])
  assert not found, f"[.., T, T] intermediates at T={t}: {found[:5]}"
  dense_mask = jax.make_jaxpr(lambda v: v[:, None, :] & jnp.tril(jnp.ones((t, t), bool))[None])
  assert _big_intermediates(dense_mask(jnp.ones((1, t), bool)).jaxpr, t, [])  # the walk sees them


@pytest.mark.parametrize("fused", ["cudnn", "splash"])
def test_fused_glue_holds_no_t_by_t_tensor(monkeypatch, fused):
  """Outside the kernel (a stub for cudnn; splash's real kernel, traced), nothing is T x T."""
  t = 4096
  stub = lambda q, k, v, **kw: q * kw["query_seq_lengths"][:, None, None, None] + k.mean() + v.mean()
  monkeypatch.setattr(jax.nn, "dot_product_attention", stub)
  spec = (AttentionSpec(backend="splash", platform="tpu") if fused == "splash"  # the kernel, compiled for a TPU
          else AttentionSpec(backend="cudnn", emulate_kernels=True))  # the stub above in the kernel's place
  model = Decoder(TINY, attention=spec, rngs=nnx.Rngs(0))
  found = _big_intermediates(_train_jaxpr(model, t), t, [])
  assert not found, f"[.., T, T] intermediates at T={t}: {found[:5]}"


def test_forward_logits_unchanged_by_padding_around_a_row():
  """Left and right padding around a row leave its logits as they are alone (xla backend)."""
  model = Decoder(TINY, rngs=nnx.Rngs(2))
  ids = np.random.default_rng(7).integers(0, 64, size=(1, 20))
  run = jax.jit(forward_logits)
  alone = np.asarray(run(model, jnp.asarray(ids)))
  padded = np.zeros((1, 31), np.int64)
  padded[0, 6:26] = ids[0]
  valid = np.zeros((1, 31), bool)
  valid[0, 6:26] = True
  out = np.asarray(run(model, jnp.asarray(padded), jnp.asarray(valid)))
  np.testing.assert_allclose(out[0, 6:26], alone[0], atol=1e-5)


def test_whole_rows_fused_says_when_a_shared_prefix_would_cost_a_faster_path():
  from memagent_jax.models.attention import AttentionSpec
  assert not AttentionSpec(backend="xla", platform="cpu").whole_rows_fused(jnp.float32)  # xla: the prefix is reused
  assert not AttentionSpec(backend="xla", platform="gpu").whole_rows_fused(jnp.float32)
  assert AttentionSpec(backend="cudnn", platform="gpu", emulate_kernels=True).whole_rows_fused(jnp.bfloat16)
  assert AttentionSpec(backend="splash", platform="tpu", emulate_kernels=True).whole_rows_fused(jnp.bfloat16)


@pytest.mark.parametrize("t", [1, 40])  # the prompt's last token (decoding), a prefill after a prefix
def test_attend_reads_the_first_key_slots_of_a_longer_cache_as_the_sliced_keys(t):
  """k, v of a decode-sized cache with key_valid over its first S slots: the same floats as the keys
  sliced to S, and the extra slots are never read (NaN there changes nothing)."""
  b, s, extra = 8, 120, 24
  spec = AttentionSpec(backend="xla")
  q, k, v = _qkv(b, t, s + extra, 4, 2, 8, seed=t)
  k, v = (x.at[:, :, s:].set(jnp.nan) for x in (k, v))  # slots past S: never read
  valid = _rows(b, s, seed=t)
  valid[:, s - t:] = True  # the queries' own slots
  kv = jnp.asarray(valid)
  run = lambda q, k, v: attention.attend(q, k, v, kv, q_offset=s - t, spec=spec)
  full = np.asarray(jax.jit(run)(q, k, v))
  sliced = np.asarray(jax.jit(run)(q, k[:, :, :s], v[:, :, :s]))
  np.testing.assert_array_equal(full, sliced)
  _close_on_valid(full, _reference(q, k[:, :, :s], v[:, :, :s], valid, s - t), np.ones((b, t), bool))
  with pytest.raises(ValueError, match="at most the"):  # more key slots than k, v hold
    attention.attend(q, k[:, :, :s - 1], v[:, :, :s - 1], kv, q_offset=s - t, spec=spec)
