"""The jitted update: response log-prob alignment, gradient accumulation, knobs, NaN skipping."""

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from memagent_jax.models.config import get_preset
from memagent_jax.models.decoder import Decoder, forward_logits, positions_from_mask
from memagent_jax.rl import losses
from memagent_jax.rl import update as upd
from reference_rows import prefix_fits

P, N, R = 12, 6, 8
# Every knob of the update, explicit (the library has no defaults; configs/base.py holds the run's).
SPEC = dict(prompt_width=P, loss="ppo_clip", agg="token-mean", clip_low=0.2, clip_high=0.28, clip_c=None,
            kl_coef=0.0, kl_kind="low_var_kl", entropy_coef=0.0, remat=False, temperature=1.0,
            compute_dtype="float32")
LOGP = dict(prompt_width=P, remat=False, temperature=1.0)  # response_logprobs at the sampling temperature


def _spec(**overrides):
  return upd.UpdateSpec(**{**SPEC, **overrides})


def _model(preset="tiny-llama", seed=0):
  return Decoder(get_preset(preset), jnp.float32, rngs=nnx.Rngs(seed))


def _rows(seed=0, vocab=256):
  """R rows: left-padded prompts of 3..P tokens, right-padded responses of 1..N tokens."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (R, P + N)).astype(np.int32)
  plen = rng.integers(3, P + 1, R)
  rlen = np.concatenate([[N, 1], rng.integers(1, N + 1, R - 2)])  # one long, one 1-token row
  valid = np.zeros((R, P + N), bool)
  mask = np.zeros((R, N), bool)
  for i in range(R):
    valid[i, P - plen[i]:P + rlen[i]] = True
    mask[i, :rlen[i]] = True
  return dict(tokens=tokens, valid=valid, loss_mask=mask,
              old_logp=(-3.0 + 0.3 * rng.standard_normal((R, N))).astype(np.float32),
              ref_logp=(-3.0 + 0.3 * rng.standard_normal((R, N))).astype(np.float32),
              advantages=rng.standard_normal(R).astype(np.float32))


def _step(model, rows, spec, micro=1, tx=None, return_opt=False):
  gd, params = nnx.split(model)
  tx = tx or optax.adamw(1e-3, weight_decay=0.01)
  opt = tx.init(params)
  batch = jax.tree.map(jnp.asarray, upd.split_micro(rows, micro))
  # update_step donates params and optimizer state: pass copies, keep the originals to compare with
  new_params, new_opt, metrics = upd.update_step(_copy(params), _copy(opt), batch, graphdef=gd, tx=tx, spec=spec)
  if return_opt:
    return params, new_params, jax.device_get(metrics), opt, new_opt
  return params, new_params, jax.device_get(metrics)


def _copy(tree):
  """A copy of a pytree of arrays (update_step donates its inputs)."""
  return jax.tree_util.tree_map(jnp.copy, tree)


def _rel(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  num = np.sqrt(sum(float(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2)) for x, y in zip(la, lb)))
  den = np.sqrt(sum(float(np.sum(np.asarray(y, np.float64) ** 2)) for y in lb))
  return num / den


@pytest.mark.parametrize("chunk", [512, 4])  # one projection, or chunks of 4 positions (N = 6: padded)
def test_response_logprobs_align_with_full_forward(chunk):
  """logp[i, j] is log p(response token j | prompt and earlier response), row by row unpadded."""
  model = _model()
  rows = _rows()
  logp, ent = upd.response_logprobs(model, jnp.asarray(rows["tokens"]), jnp.asarray(rows["valid"]), **LOGP,
                                    logits_chunk=chunk)
  # the reference: each row unpadded, from position 0, in one causal forward of the rows moved to the left
  # (what follows a row's tokens cannot reach their logits)
  unpadded = [rows["tokens"][i][rows["valid"][i]] for i in range(R)]
  packed = np.zeros((R, max(map(len, unpadded))), np.int32)  # [R, L]
  for i, ids in enumerate(unpadded):
    packed[i, :len(ids)] = ids
  full_rows = np.asarray(jax.nn.log_softmax(forward_logits(model, jnp.asarray(packed))))  # [R, L, V]
  for i in range(R):
    ids, full = unpadded[i], full_rows[i]
    plen = int(rows["valid"][i, :P].sum())
    n = int(rows["loss_mask"][i].sum())
    want = [full[plen - 1 + j, ids[plen + j]] for j in range(n)]
    np.testing.assert_allclose(np.asarray(logp[i, :n]), want, atol=2e-5)
    p = np.exp(full[plen - 1:plen - 1 + n])
    np.testing.assert_allclose(np.asarray(ent[i, :n]), -(p * np.log(p)).sum(-1), atol=2e-4)


def test_out_slots_equal_the_full_forward_and_its_gradients():
  """Decoder(out_slots=(a, b)) gives the full forward's hidden states at slots a..b-1 (its last
  block runs those slots only), and the same gradients through the tied projection."""
  model, rows = _model(), _rows()
  tokens, valid = jnp.asarray(rows["tokens"]), jnp.asarray(rows["valid"])
  gd, params = nnx.split(model)
  positions = positions_from_mask(valid)

  def loss(params, slots):
    m = nnx.merge(gd, params)
    hidden = m(tokens, positions, valid, out_slots=slots)[0]
    hidden = hidden if slots else hidden[:, P - 1:P + N - 1]  # [R, N, E]
    return jnp.sum(jnp.sin(m.logits(hidden))), hidden

  (_, full), ref = jax.value_and_grad(loss, has_aux=True)(params, None)
  (_, cut), got = jax.value_and_grad(loss, has_aux=True)(params, (P - 1, P + N - 1))
  np.testing.assert_allclose(np.asarray(cut), np.asarray(full), atol=1e-5)
  assert _rel(got, ref) < 1e-5


def test_chunked_logprobs_hold_no_full_logits_and_give_the_same_update():
  """With chunks, no [r, N, V] logits tensor exists in the forward or backward, and the update
  equals the one-projection update."""
  model, rows = _model(), _rows()
  vocab = get_preset("tiny-llama").vocab_size
  spec = _spec()
  _, whole, _ = _step(model, rows, spec)
  _, chunked, _ = _step(_model(), rows, dataclasses.replace(spec, logits_chunk=2))
  assert _rel(chunked, whole) < 1e-6
  gd, params = nnx.split(_model())
  loss = lambda p: upd.response_logprobs(nnx.merge(gd, p), jnp.asarray(rows["tokens"]),
                                         jnp.asarray(rows["valid"]), **LOGP, logits_chunk=2)[0].sum()
  jaxpr = jax.make_jaxpr(jax.grad(loss))(params)

  def shapes(jp):
    for eqn in jp.eqns:
      for v in eqn.outvars:
        yield getattr(v.aval, "shape", ())
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        yield from shapes(sub)
  big = [s for s in shapes(jaxpr.jaxpr) if len(s) >= 3 and s[-1] == vocab and s[-2] > 2]
  assert not big, big  # only [r, 2, V] chunks


def _accumulation_case(agg):
  rows = _rows()
  rows["loss_mask"][1] = False  # micro-batch 0 of 4 holds an empty row (as padding rows are)
  return _model(), rows, _spec(agg=agg, kl_coef=0.01, entropy_coef=0.01, clip_c=3.0)


# the update's two denominator paths (group_denominator): counts summed over groups (token-mean; the seq-mean
# modes count rows the same way) and the common horizon (seq-mean-token-sum-norm). That each mode's
# micro-batch losses over the whole denominator sum to the whole loss: test_losses, for all four.
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_1_vs_4_micro_batches(agg):
  """4 micro-batches give the gradient of the whole mini-batch at once (<= 1e-6 relative)."""
  model, rows, spec = _accumulation_case(agg)
  tx = optax.sgd(1.0)  # the update IS the gradient: compares gradients directly
  p0, one, m1 = _step(model, rows, spec, micro=1, tx=tx)
  _, four, m4 = _step(model, rows, spec, micro=4, tx=tx)
  grads1 = jax.tree_util.tree_map(jnp.subtract, p0, one)
  grads4 = jax.tree_util.tree_map(jnp.subtract, p0, four)
  assert _rel(grads4, grads1) <= 1e-6
  assert abs(m1.loss - m4.loss) <= 1e-6 * max(1.0, abs(m1.loss))
  assert m1.tokens == m4.tokens == rows["loss_mask"].sum()


def test_adamw_update_of_4_micro_batches():
  """AdamW applied to the accumulated gradient: the same optimizer path whatever the aggregation (above)."""
  model, rows, spec = _accumulation_case("token-mean")
  p0, a1, _ = _step(model, rows, spec, micro=1)
  _, a4, _ = _step(model, rows, spec, micro=4)
  # AdamW's updates: its first step divides each gradient element by its own size, so elements at
  # rounding-noise level (|g| << 1e-6 of the norm) differ fully between the two summation orders. Measured
  # 3e-5..7e-5 of the update's norm on a 2-core Xeon, where the params differed by 1.06e-6 of their norm,
  # over the old bound of 1e-6 (earlier machines passed it); the gradients themselves agree to 1e-6 above.
  update1 = jax.tree_util.tree_map(jnp.subtract, a1, p0)
  update4 = jax.tree_util.tree_map(jnp.subtract, a4, p0)
  assert _rel(update4, update1) <= 3e-4


def test_a_mean_of_micro_batch_means_would_differ():
  """Guards the test above: token counts differ per micro-batch, so naive averaging is wrong."""
  rows = _rows()
  counts = rows["loss_mask"].reshape(4, 2, N).sum((1, 2))
  assert len(set(counts.tolist())) > 1


def _rows_with_ratios(spread=0.7):
  """Rows whose old log-probs put the ratios spread over [e^-spread, e^spread] around 1."""
  rows, model = _rows(), _model()
  logp, _ = upd.response_logprobs(model, jnp.asarray(rows["tokens"]), jnp.asarray(rows["valid"]), **LOGP)
  shift = np.random.default_rng(1).uniform(-spread, spread, logp.shape)
  rows["old_logp"] = (np.asarray(logp) - shift).astype(np.float32)
  return rows


def _params_after(spec, rows=None, model=None):
  """Params after one SGD step (lr 1): differences are gradient differences (Adam's first
  step would mostly keep only the gradient's signs)."""
  return _step(model or _model(), rows or _rows(), spec, tx=optax.sgd(1.0))[1]


@pytest.mark.parametrize("field,value", [("kl_coef", 0.5), ("entropy_coef", 0.5), ("clip_low", 0.01),
                                          ("clip_high", 0.01), ("agg", "seq-mean-token-sum"),
                                          ("loss", "sft"), ("kl_kind", "abs")])
def test_each_update_knob_changes_the_update(field, value):
  base = _spec(kl_coef=0.1 if field == "kl_kind" else 0.0)
  rows = _rows_with_ratios()
  a = _params_after(base, rows)
  b = _params_after(dataclasses.replace(base, **{field: value}), rows)
  assert _rel(a, b) > 1e-4


def test_dual_clip_knob_changes_the_update():
  rows = _rows_with_ratios(spread=3.0)  # ratios up to e^3 > clip_c for negative advantages
  a = _params_after(_spec(clip_c=None), rows)
  b = _params_after(_spec(clip_c=3.0), rows)
  assert _rel(a, b) > 1e-4


def test_remat_gives_the_same_update():
  rows = _rows()
  a = _params_after(_spec(), rows)
  b = _params_after(_spec(remat=True), rows)
  assert _rel(a, b) <= 1e-6


def test_non_finite_loss_skips_the_update():
  rows = _rows()
  rows["advantages"][0] = np.nan
  p0, p1, m, o0, o1 = _step(_model(), rows, _spec(), return_opt=True)
  assert not m.finite
  assert _rel(p1, p0) == 0.0
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(o0), jax.tree_util.tree_leaves(o1)))


def test_all_masked_batch_is_a_finite_no_op_gradient():
  rows = _rows()
  rows["loss_mask"][:] = False
  p0, p1, m = _step(_model(), rows, _spec(), tx=optax.sgd(1.0))
  assert m.finite and m.tokens == 0 and m.loss == 0.0
  assert _rel(p1, p0) == 0.0


def test_bf16_compute_keeps_float32_master_weights():
  """bf16 forward/backward with float32 params and AdamW state: a 1e-6 step is not rounded
  away (in bf16 itself, 1e-6 on weights ~0.02 would be below half an ulp)."""
  model = Decoder(get_preset("tiny-llama"), jnp.bfloat16, rngs=nnx.Rngs(0))
  gd, params = nnx.split(model)
  params = upd.cast_params(params, jnp.float32)
  tx = optax.adamw(1e-6)
  batch = jax.tree.map(jnp.asarray, upd.split_micro(_rows(), 1))
  new, _, m = upd.update_step(_copy(params), tx.init(params), batch, graphdef=gd, tx=tx,
                              spec=_spec(compute_dtype="bfloat16"))
  assert m.finite
  leaves0, leaves1 = jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(new)
  assert all(x.dtype == jnp.float32 for x in leaves1)
  moved = np.mean([float(np.mean(np.asarray(a) != np.asarray(b))) for a, b in zip(leaves0, leaves1)])
  assert moved > 0.5  # most weights moved
  rounded = upd.cast_params(new, jnp.bfloat16)  # what the rollouts would run
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(rounded))


def test_temperature_scales_the_logprobs():
  model, rows = _model(), _rows()
  t = jnp.asarray(rows["tokens"]), jnp.asarray(rows["valid"])
  lp1, _ = upd.response_logprobs(model, *t, **LOGP)
  lp2, _ = upd.response_logprobs(model, *t, **dict(LOGP, temperature=0.5))
  assert float(jnp.max(jnp.abs(lp1 - lp2))) > 1e-3


@pytest.mark.parametrize("loss,agg,micro", [("ppo_clip", "token-mean", 1), ("ppo_clip", "seq-mean-token-mean", 4),
                                           ("ppo_clip", "seq-mean-token-sum", 1),
                                           ("ppo_clip", "seq-mean-token-sum-norm", 4),
                                           ("sft", "token-mean", 4), ("sft", "seq-mean-token-mean", 1)])
def test_update_pg_loss_is_losses_policy_loss(loss, agg, micro):
  """The update's pg loss is `losses.policy_loss` ("ppo_clip") or `losses.sft_loss` ("sft") of the
  policy's response log-probs, whatever the micro-batching."""
  model, rows = _model(), _rows_with_ratios()
  spec = _spec(loss=loss, agg=agg, clip_low=0.2, clip_high=0.28, clip_c=3.0)
  _, _, m = _step(model, rows, spec, micro=micro, tx=optax.sgd(1.0))
  logp, _ = upd.response_logprobs(_model(), jnp.asarray(rows["tokens"]), jnp.asarray(rows["valid"]), **LOGP)
  mask = rows["loss_mask"]
  if loss == "ppo_clip":
    want = losses.policy_loss(logp, rows["old_logp"], rows["advantages"], mask, 0.2, 0.28, 3.0, agg)
  else:
    want = losses.sft_loss(logp, mask, agg=agg)
  np.testing.assert_allclose(m.pg_loss, float(want), rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(m.loss, float(want), rtol=2e-6, atol=1e-7)  # no KL, no entropy bonus


PREFIX = np.asarray([7, 3, 11, 5], np.int32)  # L = 4: a template opening shared by most rows


def _prefixed_rows(seed=1):
  """_rows() where every row with fewer than L slots of padding starts with PREFIX (as memory-update
  rows start with the template's opening) and the others (final-answer rows) do not."""
  rows = _rows(seed)
  for row, valid in zip(rows["tokens"], rows["valid"]):
    first = int(np.argmax(valid))
    if first < len(PREFIX):
      row[first:first + len(PREFIX)] = PREFIX
  return rows


def _shifted_model(seed=0):
  """tiny-llama with a token shift of 2 (the toy policies'), non-zero so the history matters."""
  cfg = dataclasses.replace(get_preset("tiny-llama"), token_shift=2)
  model = Decoder(cfg, jnp.float32, rngs=nnx.Rngs(seed))
  model.token_shift[...] = 0.1 * jax.random.normal(jax.random.PRNGKey(seed), model.token_shift.shape)
  return model


# each model and each remat setting once (the prefix path is one code path under both; 2 cases, not 4)
@pytest.mark.parametrize("make_model, remat", [(_model, True), (_shifted_model, False)])
def test_shared_prefix_gives_the_same_logprobs_and_update(make_model, remat):
  """The opening's keys computed once for all rows (and copied into each row's cache) give the
  per-row computation's log-probs, gradients and update, on rows that start with it at any
  padding and on rows (padding >= L) that do not."""
  rows = _prefixed_rows()
  assert prefix_fits(rows["tokens"], rows["valid"], PREFIX, P)
  first = rows["valid"].argmax(1)
  assert (first < len(PREFIX)).any() and (first >= len(PREFIX)).any()  # both kinds of row
  t = jnp.asarray(rows["tokens"]), jnp.asarray(rows["valid"])
  with jax.default_matmul_precision("highest"):
    plain, _ = upd.response_logprobs(make_model(), *t, **LOGP)
    shared, _ = upd.response_logprobs(make_model(), *t, **LOGP, prefix=jnp.asarray(PREFIX))
    np.testing.assert_allclose(np.asarray(shared)[rows["loss_mask"]], np.asarray(plain)[rows["loss_mask"]],
                               atol=2e-5)
    gd, params = nnx.split(make_model())
    tx = optax.sgd(1.0)  # the update is the gradient itself
    batch = jax.tree.map(jnp.asarray, upd.split_micro(rows, 2))
    spec = _spec(remat=remat, kl_coef=0.1)
    a, _, ma = upd.update_step(_copy(params), tx.init(params), batch, graphdef=gd, tx=tx, spec=spec)
    b, _, mb = upd.update_step(_copy(params), tx.init(params), batch, graphdef=gd, tx=tx, spec=spec,
                               prefix=jnp.asarray(PREFIX))
  grad = lambda new: jax.tree_util.tree_map(lambda x, y: x - y, new, params)
  assert _rel(grad(b), grad(a)) < 1e-4
  assert abs(float(mb.loss) - float(ma.loss)) < 1e-5
  spec = upd.LogprobSpec(prompt_width=P, temperature=1.0, compute_dtype="float32")
  ref = upd.batch_logprobs(params, batch.tokens, batch.valid, graphdef=gd, spec=spec)
  ref_shared = upd.batch_logprobs(params, batch.tokens, batch.valid, graphdef=gd, spec=spec, prefix=jnp.asarray(PREFIX))
  mask = np.asarray(batch.loss_mask)
  assert np.abs(np.asarray(ref) - np.asarray(ref_shared))[mask].max() < 1e-4


def test_prefix_fits_only_rows_it_stands_for():
  rows = _prefixed_rows()
  assert prefix_fits(rows["tokens"], rows["valid"], PREFIX, P)
  assert not prefix_fits(rows["tokens"], rows["valid"], None, P)
  assert not prefix_fits(rows["tokens"], rows["valid"], PREFIX, len(PREFIX))  # the loss would start inside it
  i = int(np.argmin(rows["valid"].argmax(1)))  # a row whose opening sits in the first L slots
  bad = rows["tokens"].copy()
  bad[i, rows["valid"][i].argmax() + 1] += 1
  assert not prefix_fits(bad, rows["valid"], PREFIX, P)


def test_old_log_probs_from_the_same_pass_equal_recomputed_ones():
  """A step's first update runs on the params that sampled, so its old log-probs can come from its
  own forward pass: ratio 1 everywhere, the same update as with a separate recomputation."""
  rows = _rows_with_ratios()
  model = _model()
  with jax.default_matmul_precision("highest"):
    rows["old_logp"] = np.array(upd.response_logprobs(model, jnp.asarray(rows["tokens"]),
                                                        jnp.asarray(rows["valid"]), **LOGP)[0])
    spec = _spec(clip_c=3.0, kl_coef=0.1)
    _, a, ma = _step(_model(), rows, spec, tx=optax.sgd(1.0))
    rows["old_logp"] = np.full_like(rows["old_logp"], 99.0)  # ignored: never read
    p0, b, mb = _step(_model(), rows, dataclasses.replace(spec, old_is_current=True), tx=optax.sgd(1.0))
  grad = lambda new: jax.tree_util.tree_map(lambda x, y: x - y, new, p0)
  assert _rel(grad(b), grad(a)) < 1e-5
  assert mb.clip_frac == 0.0 and mb.approx_kl_old == 0.0 and abs(ma.approx_kl_old) < 1e-6


def _deep_model(scan_layers: bool, seed=0):
  """tiny-llama with 4 layers, so three run under the scan (the last is unrolled: its queries are cut)."""
  cfg = dataclasses.replace(get_preset("tiny-llama"), num_layers=4)
  return Decoder(cfg, jnp.float32, scan_layers=scan_layers, rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("shared_prefix,remat", [(False, False), (False, "dots"), (True, "full")])
def test_scanned_layers_give_the_unrolled_update(shared_prefix, remat):
  """Layers under one lax.scan over stacked weights give the Python loop's log-probs, loss and update
  (with and without a shared prefix's cache; each remat policy once: the scan body is checkpointed by it)."""
  rows = _prefixed_rows()
  prefix = jnp.asarray(PREFIX) if shared_prefix else None
  batch = jax.tree.map(jnp.asarray, upd.split_micro(rows, 2))
  spec = _spec(remat=remat, kl_coef=0.1)
  tx = optax.sgd(1.0)  # the update is the gradient itself
  out = {}
  with jax.default_matmul_precision("highest"):
    for scan in (False, True):
      gd, params = nnx.split(_deep_model(scan))
      new, _, metrics = upd.update_step(_copy(params), tx.init(params), batch, graphdef=gd, tx=tx, spec=spec,
                                        prefix=prefix)
      logp = upd.batch_logprobs(params, batch.tokens, batch.valid, graphdef=gd, prefix=prefix,
                                spec=upd.LogprobSpec(prompt_width=P, temperature=1.0, compute_dtype="float32"))
      out[scan] = params, new, metrics, logp
  (p0, a, ma, la), (_, b, mb, lb) = out[False], out[True]
  grad = lambda new: jax.tree_util.tree_map(lambda x, y: x - y, new, p0)
  assert _rel(grad(b), grad(a)) < 1e-5
  assert abs(float(mb.loss) - float(ma.loss)) < 1e-6
  np.testing.assert_allclose(np.asarray(lb), np.asarray(la), atol=1e-5)


def test_scanned_update_compiles_the_layers_as_one_loop():
  """The compiled update holds one while loop over L-1 = 3 layers per micro-batch pass (forward, and the
  backward's), and the unrolled model's none: what keeps XLA's scheduler to one layer at a time."""
  from memagent_jax.runtime.hlo_stats import ProgramStats
  rows = _rows()
  batch = jax.tree.map(jnp.asarray, upd.split_micro(rows, 1))
  tx = optax.sgd(1.0)
  trips = {}
  for scan in (False, True):
    gd, params = nnx.split(_deep_model(scan))
    text = upd.update_step.lower(params, tx.init(params), batch, graphdef=gd, tx=tx,
                                 spec=_spec(remat="full")).compile().as_text()
    trips[scan] = [loop.trip_count for loop in ProgramStats(text).loops]
  assert 3 not in trips[False]
  assert trips[True].count(3) >= 2  # the forward's scan and the backward's
