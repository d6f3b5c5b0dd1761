"""Group advantages against independent float64 numpy references (never the code under test)."""

import numpy as np
import pytest

from memagent_jax.rl import advantages


def _ref_group(rewards, gids, std, eps=1e-6):
  """Loop-based reference: one group at a time, np.std with ddof=1."""
  r = np.asarray(rewards, np.float64)
  out = np.zeros_like(r)
  for g in set(gids):
    idx = [i for i, x in enumerate(gids) if x == g]
    vals = r[idx]
    centred = vals - vals.mean()
    out[idx] = centred / (vals.std(ddof=1) + eps) if std else centred
  return out


REWARDS = [1.0, 0.0, 0.5, 1.0, 0.0, 0.25, 1.0, 0.75]
GIDS = [7, -3, 7, -3, 7, -3, 7, -3]  # interleaved, non-contiguous, negative id


def test_grpo_interleaved_groups_match_ddof1():
  got = advantages.group_advantages(REWARDS, GIDS)
  assert got.dtype == np.float32 and got.shape == (8,)
  np.testing.assert_allclose(got, _ref_group(REWARDS, GIDS, std=True), rtol=1e-6, atol=1e-7)
  # Hand value for group 7 = [1, .5, 0, 1]: mean .625, ddof=1 std sqrt(0.229166..)
  std7 = np.sqrt(((0.375**2) + (0.125**2) + (0.625**2) + (0.375**2)) / 3)
  np.testing.assert_allclose(got[0], 0.375 / (std7 + 1e-6), rtol=1e-6)


def test_mean_centred_matches_reference():
  got = advantages.group_advantages(REWARDS, GIDS, std_normalize=False)
  np.testing.assert_allclose(got, _ref_group(REWARDS, GIDS, std=False), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got[:4], [0.375, -0.5, -0.125, 0.5], rtol=1e-6)


def test_zero_variance_group_gives_zero_not_nan():
  got = advantages.group_advantages([1.0, 1.0, 1.0, 0.0, 1.0], [0, 0, 0, 1, 1])
  assert np.all(np.isfinite(got))
  np.testing.assert_array_equal(got[:3], 0.0)
  # eps matters: with a zero-variance group and eps=0 we would divide 0 by 0.
  big = advantages.group_advantages([0.0, 1.0], [0, 0], eps=10.0)
  np.testing.assert_allclose(big, [-0.5 / (np.sqrt(0.5) + 10.0), 0.5 / (np.sqrt(0.5) + 10.0)],
                             rtol=1e-6)


def test_size_one_group_with_std_raises_and_without_gives_zero():
  with pytest.raises(ValueError, match=r"group 5.*>= 2 samples.*rl.group_size"):
    advantages.group_advantages([1.0, 0.0, 1.0], [1, 1, 5])
  got = advantages.group_advantages([1.0, 0.0, 1.0], [1, 1, 5], std_normalize=False)
  np.testing.assert_allclose(got, [0.5, -0.5, 0.0])


def test_std_normalize_knob_changes_result():
  r, g = [0.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]  # std (ddof=1) = 0.5, not 1
  on = advantages.group_advantages(r, g, std_normalize=True)
  off = advantages.group_advantages(r, g, std_normalize=False)
  assert not np.allclose(on, off)
  np.testing.assert_allclose(off, [-0.75, 0.25, 0.25, 0.25], rtol=1e-6)
  np.testing.assert_allclose(on, np.array([-0.75, 0.25, 0.25, 0.25]) / (0.5 + 1e-6), rtol=1e-6)


def test_registry_lookup_and_unknown_name():
  assert set(advantages.ADVANTAGES) >= {"grpo", "mean_centred"}
  np.testing.assert_allclose(advantages.get_advantage("grpo")(REWARDS, GIDS, eps=1e-6),
                             _ref_group(REWARDS, GIDS, std=True), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(advantages.get_advantage("mean_centred")(REWARDS, GIDS, eps=1e-6),
                             _ref_group(REWARDS, GIDS, std=False), rtol=1e-6, atol=1e-7)
  with pytest.raises(KeyError, match=r"nope.*grpo.*mean_centred"):
    advantages.get_advantage("nope")


def test_bad_shapes_rejected():
  with pytest.raises(ValueError, match="equal length"):
    advantages.group_advantages([1.0, 0.0], [0])


def test_broadcast_to_rows():
  traj = np.array([0.5, -1.0, 2.0])
  rows = np.array([0, 0, 0, 1, 2, 2])  # trajectory 0 has 3 conversations
  got = advantages.broadcast_to_rows(traj, rows)
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, [0.5, 0.5, 0.5, -1.0, 2.0, 2.0])
  with pytest.raises(IndexError, match=r"\[3\].*outside \[0, 3\)"):
    advantages.broadcast_to_rows(traj, [0, 3])
  with pytest.raises(IndexError):
    advantages.broadcast_to_rows(traj, [-1])


def test_batch_std_scales_group_centred_rewards_by_one_batch_std():
  got = advantages.get_advantage("batch_std")(REWARDS, GIDS, eps=1e-6)
  centred = _ref_group(REWARDS, GIDS, std=False)  # group-mean baseline, by the loop reference
  mean = centred.mean()
  batch_std = np.sqrt(sum((c - mean) ** 2 for c in centred) / (len(centred) - 1))  # by hand, ddof=1
  np.testing.assert_allclose(got, centred / (batch_std + 1e-6), rtol=1e-6, atol=1e-7)
  # Unlike grpo, a group whose rewards barely differ keeps small advantages.
  r, g = [1.0, 0.9, 1.0, 0.0], [0, 0, 1, 1]
  np.testing.assert_allclose(np.abs(advantages.get_advantage("grpo")(r, g, eps=1e-6)), 0.7071, rtol=1e-3)
  small = advantages.get_advantage("batch_std")(r, g, eps=1e-6)
  assert abs(small[0]) < abs(small[2]) / 5
  with pytest.raises(ValueError, match=">= 2 trajectories"):
    advantages.get_advantage("batch_std")([1.0], [0], eps=1e-6)


def test_a_temporary_registration_is_gone_after_its_block():
  fn = advantages.get_advantage("grpo")
  with advantages.ADVANTAGES.registered("grpo_again", fn):
    assert advantages.get_advantage("grpo_again") is fn
    with pytest.raises(ValueError, match="already registered"):
      advantages.ADVANTAGES.register("grpo_again", fn)
  assert "grpo_again" not in advantages.ADVANTAGES
  with pytest.raises(KeyError, match="unknown advantage estimator 'grpo_again'"):
    advantages.get_advantage("grpo_again")
