"""Losses against independent float64 numpy references and hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.rl import losses

RTOL = 1e-6

# Ragged mask: rows of length 5, 2, 0 (an empty row) and 3.
MASK = np.array([[1, 1, 1, 1, 1],
                 [1, 1, 0, 0, 0],
                 [0, 0, 0, 0, 0],
                 [1, 1, 1, 0, 0]], np.float64)
LOSS = np.random.default_rng(0).normal(size=MASK.shape)


def _ref_agg(loss, mask, agg):
  """Plain float64 numpy version of verl's agg_loss (empty rows left out of seq means)."""
  lm = loss * mask
  counts = mask.sum(-1)
  rows = counts > 0
  if agg == "token-mean":
    return lm.sum() / mask.sum()
  if agg == "seq-mean-token-mean":
    return np.mean(lm.sum(-1)[rows] / counts[rows])
  if agg == "seq-mean-token-sum":
    return np.mean(lm.sum(-1)[rows])
  if agg == "seq-mean-token-sum-norm":
    return lm.sum() / mask.shape[-1]
  raise AssertionError(agg)


def _ratio_logps(ratios):
  """logp/old_logp pairs whose exp(logp - old_logp) equals `ratios`."""
  old = np.full(np.shape(ratios), -1.5)
  return old + np.log(ratios), old


@pytest.mark.parametrize("agg", losses.AGG_MODES)
def test_aggregate_modes_match_numpy(agg):
  got = losses.aggregate(jnp.asarray(LOSS, jnp.float32), MASK, agg=agg)
  np.testing.assert_allclose(float(got), _ref_agg(LOSS, MASK, agg), rtol=RTOL)


def test_seq_mean_token_sum_norm_divides_by_horizon():
  loss = np.ones((2, 8))
  mask = np.zeros((2, 8))
  mask[0, :3] = 1
  mask[1, :1] = 1
  got = losses.aggregate(loss, mask, agg="seq-mean-token-sum-norm")
  np.testing.assert_allclose(float(got), 4.0 / 8.0, rtol=RTOL)


def test_token_mean_weights_long_rows_more():
  loss = np.array([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
  mask = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float64)
  tok = float(losses.aggregate(loss, mask, agg="token-mean"))
  seq = float(losses.aggregate(loss, mask, agg="seq-mean-token-mean"))
  np.testing.assert_allclose(tok, 7.0 / 5.0, rtol=RTOL)
  np.testing.assert_allclose(seq, (1.0 + 3.0) / 2.0, rtol=RTOL)
  assert tok < seq  # the long, low-loss row pulls the token mean down


@pytest.mark.parametrize("agg", losses.AGG_MODES)
@pytest.mark.parametrize("parts", [2, 4])
def test_denominator_makes_micro_batches_sum_to_whole(agg, parts):
  loss = jnp.asarray(LOSS, jnp.float32)
  whole = float(losses.aggregate(loss, MASK, agg=agg))
  den = losses.agg_denominator(MASK, agg)
  total = 0.0
  for rows in np.array_split(np.arange(MASK.shape[0]), parts):
    total += float(losses.aggregate(loss[rows], MASK[rows], agg=agg, denominator=den))
  np.testing.assert_allclose(total, whole, rtol=1e-5)
  np.testing.assert_allclose(whole, _ref_agg(LOSS, MASK, agg), rtol=RTOL)


def test_invalid_agg_lists_modes():
  with pytest.raises(ValueError, match="token-mean.*seq-mean-token-sum-norm"):
    losses.aggregate(LOSS, MASK, agg="mean")
  with pytest.raises(ValueError, match="modes"):
    losses.policy_loss(LOSS, LOSS, np.zeros(4), MASK, agg="sum")


def test_all_masked_is_zero_not_nan():
  mask = np.zeros((3, 4))
  bad = np.full((3, 4), np.inf)  # padding may hold anything
  for agg in losses.AGG_MODES:
    assert float(losses.aggregate(bad, mask, agg=agg)) == 0.0
  logp = np.zeros((3, 4))
  val, grad = jax.jit(jax.value_and_grad(losses.policy_loss))(jnp.asarray(logp, jnp.float32),
                                                               logp, np.ones(3), mask)
  assert float(val) == 0.0 and np.all(np.asarray(grad) == 0.0)
  terms = jax.jit(losses.policy_loss_terms, static_argnames=("clip_low", "clip_high", "clip_c"))
  _, metrics = terms(logp, logp, np.ones(3), mask, clip_low=0.2, clip_high=0.28, clip_c=3.0)
  assert all(float(v) == 0.0 for v in metrics)


def _single(ratio, adv, **kw):
  logp, old = _ratio_logps(np.array([[ratio]]))
  return float(losses.policy_loss(logp, old, np.array([adv]), np.ones((1, 1)), **kw))


def test_clip_high_and_low_each_bind_on_their_side():
  # A > 0, ratio 1.5 above 1 + high: the loss is -A * (1 + high).
  np.testing.assert_allclose(_single(1.5, 2.0, clip_high=0.28), -2.0 * 1.28, rtol=RTOL)
  np.testing.assert_allclose(_single(1.5, 2.0, clip_high=0.6), -2.0 * 1.5, rtol=RTOL)
  np.testing.assert_allclose(_single(1.5, 2.0, clip_low=0.6), _single(1.5, 2.0, clip_low=0.2))
  # A < 0, ratio 0.5 below 1 - low: the loss is -A * (1 - low).
  np.testing.assert_allclose(_single(0.5, -2.0, clip_low=0.2), 2.0 * 0.8, rtol=RTOL)
  np.testing.assert_allclose(_single(0.5, -2.0, clip_low=0.6), 2.0 * 0.5, rtol=RTOL)
  np.testing.assert_allclose(_single(0.5, -2.0, clip_high=0.6),
                             _single(0.5, -2.0, clip_high=0.28))


def test_clip_higher_lets_ratio_125_through():
  np.testing.assert_allclose(_single(1.25, 1.0, clip_low=0.2, clip_high=0.28), -1.25, rtol=RTOL)
  np.testing.assert_allclose(_single(1.25, 1.0, clip_low=0.2, clip_high=0.2), -1.2, rtol=RTOL)


def test_dual_clip_binds_only_for_negative_advantages():
  ratios = np.array([[5.0, np.exp(10.0), 2.0, 0.9]])
  adv = np.array([[1.5, -2.0, -1.0, 1.0]])
  logp, old = _ratio_logps(ratios)
  mask = np.ones_like(ratios)
  plain, m0 = losses.policy_loss_terms(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=None)
  dual, m3 = losses.policy_loss_terms(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=3.0)
  plain, dual = np.asarray(plain), np.asarray(dual)
  np.testing.assert_allclose(plain, [[-1.5 * 1.28, 2.0 * np.exp(10.0), 2.0, -0.9]], rtol=1e-5)
  np.testing.assert_allclose(dual[0, [0, 2, 3]], plain[0, [0, 2, 3]], rtol=RTOL)  # unchanged
  assert dual[0, 1] == np.float32(2.0 * 3.0)  # exactly -A * clip_c
  assert float(m0.dual_clip_frac) == 0.0
  np.testing.assert_allclose(float(m3.dual_clip_frac), 0.25, rtol=RTOL)


@pytest.mark.parametrize("clip_c", [1.0, 0.5])
def test_dual_clip_constant_must_exceed_one(clip_c):
  with pytest.raises(ValueError, match="clip_c must be > 1"):
    losses.policy_loss(np.zeros((1, 1)), np.zeros((1, 1)), np.ones(1), np.ones((1, 1)),
                       clip_c=clip_c)
  with pytest.raises(ValueError, match="clip_c must be > 1"):
    losses.ClipSpec(dual=clip_c)  # what the registered losses take


def test_row_advantages_broadcast_like_full_matrix():
  rng = np.random.default_rng(1)
  logp = rng.normal(scale=0.3, size=MASK.shape) - 2.0
  old = rng.normal(scale=0.3, size=MASK.shape) - 2.0
  adv = np.array([1.0, -0.5, 2.0, -1.5])
  for agg in losses.AGG_MODES:
    a = losses.policy_loss(logp, old, adv, MASK, clip_c=3.0, agg=agg)
    b = losses.policy_loss(logp, old, np.repeat(adv[:, None], 5, 1), MASK, clip_c=3.0, agg=agg)
    assert float(a) == float(b)
  # And the full loss against a numpy reference of the clipped surrogate.
  r = np.exp(logp - old)
  a2 = adv[:, None]
  ref = np.maximum(-a2 * r, -a2 * np.clip(r, 0.8, 1.28))
  np.testing.assert_allclose(float(losses.policy_loss(logp, old, adv, MASK)),
                             _ref_agg(ref, MASK, "token-mean"), rtol=1e-5)


def test_clip_fraction_and_ppo_kl_on_hand_case():
  ratios = np.array([[1.5, 1.0, 0.5, 1.5, 3.0]])
  adv = np.array([[1.0, 1.0, -1.0, -1.0, 1.0]])
  mask = np.array([[1, 1, 1, 1, 0]], np.float64)  # last token clipped but masked out
  logp, old = _ratio_logps(ratios)
  _, m = losses.policy_loss_terms(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=None)
  np.testing.assert_allclose(float(m.clip_frac), 2.0 / 4.0, rtol=RTOL)  # tokens 0 and 2
  ref_kl = np.mean(-np.log(ratios[0, :4]))
  np.testing.assert_allclose(float(m.approx_kl_old), ref_kl, rtol=1e-5)


@pytest.mark.parametrize("denominator", [None, 10.0])
def test_gradient_zero_when_clipped_else_minus_a_ratio_over_denominator(denominator):
  ratios = np.array([[1.5, 1.1, 0.5, 1.5, 0.5, 5.0, 1.0]])
  adv = np.array([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0]])
  mask = np.array([[1, 1, 1, 1, 1, 1, 0]], np.float64)
  logp, old = _ratio_logps(ratios)
  grad_fn = jax.jit(jax.grad(losses.policy_loss), static_argnames=("clip_c",))
  grad = grad_fn(jnp.asarray(logp, jnp.float32), old, adv, mask, clip_c=3.0,
                 denominator=denominator)
  n = mask.sum() if denominator is None else denominator
  # clipped: 0 (up-clip, A>0), 2 (low-clip, A<0), 5 (dual clip); 6 is masked out.
  unclipped = np.array([0, 1, 0, 1, 1, 0, 0], bool)
  ref = np.where(unclipped, -adv[0] * ratios[0] / n, 0.0)
  np.testing.assert_allclose(np.asarray(grad)[0], ref, rtol=1e-5, atol=1e-8)


def _ref_kl(logp, ref, kind):
  d = logp - ref
  if kind == "kl":
    return d
  if kind == "mse":
    return 0.5 * d * d
  if kind == "abs":
    return np.abs(d)
  kl = np.clip(ref - logp, -20.0, 20.0)
  return np.clip(np.exp(kl) - kl - 1.0, -10.0, 10.0)


# ref - logp: 25 (k3 -> clamp), -25 (k3 -> clamp), 3 (k3 -> clamp 10), small values.
KL_LOGP = np.array([[-30.0, -1.0, -4.0, -1.2], [-0.5, -2.0, -2.0, -3.0]])
KL_REF = np.array([[-5.0, -26.0, -1.0, -1.0], [-0.7, -2.0, -1.5, -7.0]])


@pytest.mark.parametrize("kind,alias", [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3"),
                                        ("abs", None)])
def test_kl_kinds_match_numpy(kind, alias):
  got = np.asarray(losses.kl_penalty(KL_LOGP, KL_REF, kind))
  np.testing.assert_allclose(got, _ref_kl(KL_LOGP, KL_REF, kind), rtol=RTOL, atol=1e-7)
  if alias:
    np.testing.assert_array_equal(np.asarray(losses.kl_penalty(KL_LOGP, KL_REF, alias)), got)


def test_k3_clamps_and_stays_finite():
  got = np.asarray(losses.kl_penalty(KL_LOGP, KL_REF, "low_var_kl"))
  assert got[0, 0] == 10.0 and got[0, 1] == 10.0 and got[0, 2] == 10.0
  np.testing.assert_allclose(got[1, 3], np.exp(-4.0) + 4.0 - 1.0, rtol=RTOL)
  assert np.all(got >= 0.0)
  grad = jax.grad(lambda x: losses.kl_penalty(x, KL_REF).sum())(jnp.asarray(KL_LOGP, jnp.float32))
  assert np.all(np.isfinite(np.asarray(grad)))
  assert np.asarray(grad)[0, 0] == 0.0  # clamped tokens pass no gradient


def test_unknown_kl_kind_lists_kinds():
  with pytest.raises(ValueError, match="low_var_kl.*k3"):
    losses.kl_penalty(KL_LOGP, KL_REF, "full")


def test_entropy_matches_numpy_and_is_stable():
  rng = np.random.default_rng(2)
  logits = rng.normal(scale=3.0, size=(2, 3, 7))
  logits[0, 0] += 1000.0  # huge offsets must not overflow
  logits[1, 2, :3] = -np.inf  # masked vocabulary entries
  z = logits - logits.max(-1, keepdims=True)
  p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  ref = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)
  got = np.asarray(losses.entropy_from_logits(logits))
  assert got.dtype == np.float32 and got.shape == (2, 3)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  np.testing.assert_allclose(float(losses.entropy_from_logits(np.zeros((1, 1, 5)))[0, 0]),
                             np.log(5.0), rtol=RTOL)


def test_token_logp_entropy_matches_log_softmax_and_its_gradients():
  """The fused log-prob + entropy equals log_softmax and `entropy_from_logits`, and its gradient the
  analytic one (d logp = onehot - p, d entropy = -p (log p + H)), with huge offsets and -inf logits."""
  rng = np.random.default_rng(3)
  logits = rng.normal(scale=3.0, size=(2, 3, 7)).astype(np.float32)
  logits[0, 0] += 1000.0
  logits[1, 2, :3] = -np.inf
  target = np.array([[0, 3, 6], [1, 2, 5]])
  g_logp, g_ent = rng.normal(size=(2, 2, 3)).astype(np.float32)
  (logp, ent), vjp = jax.vjp(lambda x: losses.token_logp_entropy(x, jnp.asarray(target)), jnp.asarray(logits))
  z = logits.astype(np.float64) - logits.max(-1, keepdims=True)
  logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
  np.testing.assert_allclose(logp, np.take_along_axis(logp_all, target[..., None], -1)[..., 0], rtol=1e-5)
  np.testing.assert_allclose(ent, losses.entropy_from_logits(logits), rtol=1e-5)
  p = np.exp(logp_all)
  onehot = np.arange(7) == target[..., None]
  plogp = p * (np.where(p > 0, logp_all, 0.0) + np.asarray(ent, np.float64)[..., None])
  want = g_logp[..., None] * (onehot - p) - g_ent[..., None] * plogp
  (got,) = vjp((jnp.asarray(g_logp), jnp.asarray(g_ent)))
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_sft_loss_matches_numpy():
  logp = -np.abs(LOSS)
  for agg in losses.AGG_MODES:
    np.testing.assert_allclose(float(losses.sft_loss(logp, MASK, agg=agg)),
                               _ref_agg(-logp, MASK, agg), rtol=RTOL)


@pytest.mark.parametrize("agg", losses.AGG_MODES)
@pytest.mark.parametrize("denominator", [None, 7.0])
def test_policy_loss_registry_is_policy_loss_and_sft_loss(agg, denominator):
  assert set(losses.POLICY_LOSSES) >= {"ppo_clip", "sft"}
  rng = np.random.default_rng(3)
  logp = rng.normal(scale=0.3, size=MASK.shape) - 2.0
  old = rng.normal(scale=0.3, size=MASK.shape) - 2.0
  adv = np.array([1.0, -0.5, 2.0, -1.5])
  kw = dict(clip=losses.ClipSpec(0.2, 0.28, 3.0), agg=agg, denominator=denominator)
  loss, metrics = losses.get_policy_loss("ppo_clip")(logp, old, adv, MASK, **kw)
  assert float(loss) == float(losses.policy_loss(logp, old, adv, MASK, 0.2, 0.28, 3.0, agg,
                                                 denominator=denominator))
  terms = losses.policy_loss_terms(logp, old, adv, MASK, clip_low=0.2, clip_high=0.28, clip_c=3.0)[1]
  assert metrics == terms and float(metrics.clip_frac) > 0 and float(metrics.nll) == 0.0
  loss, metrics = losses.get_policy_loss("sft")(logp, old, adv, MASK, **kw)
  assert float(loss) == float(losses.sft_loss(logp, MASK, agg=agg, denominator=denominator))
  if denominator is None:
    np.testing.assert_allclose(float(loss), _ref_agg(-logp, MASK, agg), rtol=RTOL)
  np.testing.assert_allclose(float(metrics.nll), _ref_agg(-logp, MASK, "token-mean"),
                             rtol=RTOL)
  with pytest.raises(KeyError, match="ppo_clip.*sft"):
    losses.get_policy_loss("dpo")


def test_policy_loss_jits():
  fn = jax.jit(losses.policy_loss, static_argnames=("clip_low", "clip_high", "clip_c", "agg"))
  logp, old = _ratio_logps(np.array([[1.5, 0.5]]))
  got = fn(logp, old, np.array([1.0]), np.ones((1, 2)), clip_c=3.0, agg="seq-mean-token-sum",
           denominator=2.0)
  np.testing.assert_allclose(float(got), (-1.28 - 0.5) / 2.0, rtol=RTOL)
