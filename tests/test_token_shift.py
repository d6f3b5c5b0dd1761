"""The token shift (models/config.py `token_shift`): its input embeddings against a plain loop,
cached decoding against the full forward (left padding included), inert at zero, and kept by
export and reload."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import memagent_jax as mj
from memagent_jax.models import decoder as D
from memagent_jax.models.config import ModelConfig, get_preset
from memagent_jax.policy import sampling
from memagent_jax.policy.policy import Policy


@pytest.fixture(scope="module")
def shifted(shifted_toy_policy):
  """(policy, model): toy-1m-shift2 with non-zero shift tables (conftest)."""
  return shifted_toy_policy, nnx.merge(shifted_toy_policy.graphdef, shifted_toy_policy.state)


def test_shift_embeddings_match_a_plain_loop(shifted):
  _, model = shifted
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, model.config.vocab_size, (3, 9)).astype(np.int32)
  valid = np.ones((3, 9), bool)
  valid[1, :4] = valid[2, :7] = False  # left padding
  got, _ = model._shifted_embeddings(jnp.asarray(tokens), jnp.asarray(valid), None, 0)
  tables = np.asarray(model.token_shift[...])
  want = np.zeros(got.shape, np.float32)
  for b in range(3):
    for j in range(9):
      for d in (1, 2):
        if j - d >= 0 and valid[b, j - d]:
          want[b, j] += tables[d - 1, tokens[b, j - d]]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


def test_cached_decoding_equals_the_full_forward(shifted):
  """Prefill of left-padded rows, then one token per step through the cache, gives the logits of
  the full forward over each row's unpadded tokens."""
  _, model = shifted
  rng = np.random.default_rng(1)
  rows = [list(rng.integers(0, 150, n)) for n in (5, 11, 8)]
  extra = rng.integers(0, 150, (3, 4)).astype(np.int32)  # tokens fed one at a time after the prompt
  tokens, valid = sampling.left_pad(rows, pad_id=0)
  p = tokens.shape[1]
  with jax.default_matmul_precision("highest"):
    logits, cache = sampling.prefill(model, jnp.asarray(tokens), jnp.asarray(valid), cache_size=p + 4)
    steps = [logits]
    pos = jnp.asarray(valid.sum(1), jnp.int32)
    for i in range(3):
      h, cache = model(jnp.asarray(extra[:, i:i + 1]), (pos + i)[:, None], jnp.ones((3, 1), bool), cache)
      steps.append(model.logits(h[:, 0]))
    for b, row in enumerate(rows):
      full = D.forward_logits(model, jnp.asarray([row + list(extra[b, :3])], jnp.int32))[0]
      for i, step in enumerate(steps):
        np.testing.assert_allclose(np.asarray(step[b]), np.asarray(full[len(row) - 1 + i]), rtol=2e-5, atol=2e-5)


def test_zero_tables_give_the_plain_model():
  """At init the tables are zero and every other weight is drawn as toy-1m's: the same logits."""
  shift = mj.load_policy("random:toy-1m-shift2", seed=0)
  plain = mj.load_policy("random:toy-1m", seed=0)
  x = jnp.asarray([[5, 9, 17, 3, 30, 8]], jnp.int32)
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(np.asarray(D.forward_logits(nnx.merge(shift.graphdef, shift.state), x)),
                               np.asarray(D.forward_logits(nnx.merge(plain.graphdef, plain.state), x)),
                               rtol=1e-6, atol=1e-6)
  assert get_preset("toy-1m-shift2").num_params == get_preset("toy-1m").num_params + 2 * 192 * 128


def test_export_and_reload_keep_the_shift(shifted, tmp_path):
  policy, model = shifted
  out = tmp_path / "export"
  Policy(model, policy.tokenizer).export(str(out))
  assert json.load(open(out / "config.json"))["memagent_token_shift"] == 2
  back = mj.load_policy(str(out))
  x = jnp.asarray([[5, 9, 17, 3, 30, 8, 44]], jnp.int32)
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(np.asarray(D.forward_logits(nnx.merge(back.graphdef, back.state), x)),
                               np.asarray(D.forward_logits(model, x)), rtol=1e-6, atol=1e-6)


def test_config_round_trip_and_bad_values():
  cfg = get_preset("toy-1m-shift2")
  assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
  assert "memagent_token_shift" not in get_preset("toy-1m").to_hf_dict()
  with pytest.raises(ValueError, match="memagent_token_shift=-1 must be an integer >= 0"):
    ModelConfig.from_hf_dict({**cfg.to_hf_dict(), "memagent_token_shift": -1})
  with pytest.raises(ValueError, match="token_shift=1.5 must be an integer >= 0"):
    cfg.replace(token_shift=1.5)
