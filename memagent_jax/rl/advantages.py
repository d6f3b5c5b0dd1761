"""Group-relative advantages for Multi-Conv DAPO (MemAgent, arXiv 2507.02259).

A trajectory is every memory-update conversation of one rollout plus its final answer
conversation; G rollouts of one question form a group. The reward of the final answer
gives ONE scalar advantage per trajectory, computed relative to its group, and that
scalar is applied to every response token of every conversation (row) of the trajectory.

Three estimators, reachable from config by name (`get_advantage(cfg.rl.advantage)`); they differ in
the scale each trajectory's advantage is normalised by:
  * "grpo" (paper, GRPO): (r - mean_g) / (std_g + eps), Bessel std (ddof=1) of the GROUP, so a
    group whose rewards barely differ gets advantages as large as one that splits evenly.
  * "mean_centred" (released MemAgent code; Dr. GRPO): r - mean_g, no std division.
  * "batch_std" (REINFORCE++-baseline, "Lite PPO"): (r - mean_g) / (std_batch + eps), the group
    mean as baseline but one Bessel std over every trajectory of the step, so each trajectory's
    advantage keeps its size relative to the whole batch rather than to its own group.

Everything here is host-side numpy (rollouts live on the host); outputs are float32.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from memagent_jax.runtime.registry import Registry

AdvantageFn = Callable[..., np.ndarray]

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")  # fn(rewards, group_ids, *, eps) -> [N]
register_advantage = ADVANTAGES.register
get_advantage = ADVANTAGES.get


# Documented public API (DESIGN.md): its defaults are the paper's GRPO values; training passes rl.eps.
def group_advantages(rewards, group_ids, std_normalize: bool = True,
                     eps: float = 1e-6) -> np.ndarray:
  """Per-trajectory advantage relative to its group: r - mean_g, optionally / (std_g + eps).

  Args:
    rewards: [N] scalar reward per trajectory.
    group_ids: [N] int group (question) id per trajectory; any ints, in any order.
    std_normalize: divide by the group's Bessel std (GRPO); False is the released code.
    eps: added to the std so that a zero-variance group gives 0, not NaN.

  Returns:
    [N] float32 advantages.
  """
  r = np.asarray(rewards, dtype=np.float64)
  g = np.asarray(group_ids)
  if r.ndim != 1 or g.ndim != 1 or r.shape != g.shape:
    raise ValueError(f"rewards and group_ids must both be 1-D of equal length, got shapes "
                     f"{r.shape} and {g.shape}")
  if r.size == 0:
    return np.zeros((0,), np.float32)
  if not np.issubdtype(g.dtype, np.integer):
    raise TypeError(f"group_ids must be integers, got dtype {g.dtype}")
  uniq, inv = np.unique(g, return_inverse=True)  # inv: [N] dense group index
  counts = np.bincount(inv, minlength=uniq.size).astype(np.float64)  # [G]
  means = np.bincount(inv, weights=r, minlength=uniq.size) / counts  # [G]
  centred = r - means[inv]  # [N]
  if not std_normalize:
    return centred.astype(np.float32)  # a size-1 group is centred on itself: 0
  if np.any(counts < 2):
    bad = uniq[counts < 2]
    raise ValueError(f"group {bad[0].item()!r} has 1 sample (groups of size 1: {bad.tolist()}); std "
                     "normalisation needs >= 2 samples per group (config `rl.group_size`), or "
                     "use the 'mean_centred' estimator")
  var = np.bincount(inv, weights=centred**2, minlength=uniq.size) / (counts - 1.0)  # [G]
  return (centred / (np.sqrt(var)[inv] + eps)).astype(np.float32)


@register_advantage("grpo")
def grpo(rewards, group_ids, *, eps: float) -> np.ndarray:
  """Paper / GRPO estimator: group z-score with Bessel std."""
  return group_advantages(rewards, group_ids, std_normalize=True, eps=eps)


@register_advantage("mean_centred")
def mean_centred(rewards, group_ids, *, eps: float) -> np.ndarray:
  """Released MemAgent estimator: r - group mean (eps unused, kept for a uniform signature)."""
  del eps
  return group_advantages(rewards, group_ids, std_normalize=False)


@register_advantage("batch_std")
def batch_std(rewards, group_ids, *, eps: float) -> np.ndarray:
  """Group-mean baseline, batch-std scale: (r - mean_g) / (std of all centred rewards + eps)."""
  centred = group_advantages(rewards, group_ids, std_normalize=False).astype(np.float64)  # [N]
  if centred.size < 2:
    raise ValueError(f"batch_std needs >= 2 trajectories in the step, got {centred.size}")
  return (centred / (np.std(centred, ddof=1) + eps)).astype(np.float32)


def broadcast_to_rows(trajectory_advantages, row_trajectory) -> np.ndarray:
  """Gives every conversation row its trajectory's scalar advantage (Multi-Conv DAPO).

  Args:
    trajectory_advantages: [N] one advantage per trajectory.
    row_trajectory: [R] int index into trajectory_advantages for each row.

  Returns:
    [R] float32 per-row advantages.
  """
  adv = np.asarray(trajectory_advantages, dtype=np.float32)
  idx = np.asarray(row_trajectory)
  if adv.ndim != 1 or idx.ndim != 1:
    raise ValueError(f"expected 1-D inputs, got shapes {adv.shape} and {idx.shape}")
  if idx.size == 0:
    return np.zeros((0,), np.float32)
  if not np.issubdtype(idx.dtype, np.integer):
    raise TypeError(f"row_trajectory must be integers, got dtype {idx.dtype}")
  bad = (idx < 0) | (idx >= adv.shape[0])
  if np.any(bad):
    raise IndexError(f"row_trajectory holds {idx[bad][:5].tolist()} outside [0, {adv.shape[0]}) "
                     f"(there are {adv.shape[0]} trajectories)")
  return adv[idx]
