"""Rollouts for Multi-Conv DAPO: G trajectories per question through the agent, rewards on the
final answers, overlong shaping, dynamic sampling, advantages broadcast to every conversation.

Everything here runs on the host around the compiled agent; the output is `TrainRows` with
static widths, ready for the jitted update.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

import numpy as np

from memagent_jax.agent.results import AgentResult, ConversationBatch
from memagent_jax.registry import Registry
from memagent_jax.rl import advantages as adv_lib
from memagent_jax.rl import rewards
from memagent_jax.rl.batching import TrainRows, rows_from_conversations


def _prediction_or_answer(result: AgentResult) -> str:
  return result.answer if result.prediction is None else result.prediction


# reward name -> fn(result, answers) -> float in [0, 1]; all look at the final answer only.
REWARD_FNS: Registry[Callable[[AgentResult, list[str]], float]] = Registry("reward")
REWARD_FNS.register("memagent_verifier", lambda r, a: rewards.memagent_verifier(r.answer, a))  # released
REWARD_FNS.register("sub_em", lambda r, a: rewards.sub_em(r.prediction, a))
for _name in ("exact_match", "string_match_all", "string_match_part"):
  REWARD_FNS.register(_name, lambda r, a, fn=getattr(rewards, _name): fn(_prediction_or_answer(r), a))
get_reward_fn = REWARD_FNS.get


def overlong_penalty(lengths, max_tokens: int, cache_tokens: int) -> np.ndarray:
  """DAPO's soft overlong punishment, in tokens: 0 up to Lmax - Lcache, then a linear ramp
  ((Lmax - Lcache) - L) / Lcache down to -1 at Lmax, and -1 beyond. lengths [N] -> [N]."""
  if not 0 < cache_tokens <= max_tokens:
    raise ValueError(f"overlong shaping needs 0 < cache_tokens <= max_tokens; got "
                     f"cache_tokens={cache_tokens}, max_tokens={max_tokens}")
  lengths = np.asarray(lengths, np.float64)
  free = max_tokens - cache_tokens
  ramp = (free - lengths) / cache_tokens
  return np.where(lengths <= free, 0.0, np.where(lengths <= max_tokens, ramp, -1.0)).astype(np.float32)


class DynamicSamplingError(RuntimeError):
  """Dynamic sampling ran out of extra generation batches before the step was full."""


@dataclasses.dataclass
class StepRollout:
  """The kept groups of one rollout step as training rows, plus what to log."""
  rows: TrainRows | None  # None when no group was kept
  num_questions: int  # kept groups
  metrics: dict[str, float]
  results: list[AgentResult]  # every trajectory generated (kept or not), for inspection


def _response_tokens(conv, stop_tokens) -> int:
  ids = conv.response_ids
  return int(len(ids) - (len(ids) > 0 and int(ids[-1]) in stop_tokens))


class RolloutCollector:
  """Generates the rows of one step from an iterator of question batches."""

  def __init__(self, agent, rl_cfg, prompt_width: int, response_width: int):
    self.agent, self.cfg = agent, rl_cfg
    self.prompt_width, self.response_width = prompt_width, response_width
    self.reward_fn = get_reward_fn(rl_cfg.reward)
    self.advantage_fn = adv_lib.get_advantage(rl_cfg.advantage)
    self.stop_tokens = set(agent.stop_tokens)
    if rl_cfg.rollout_batch % rl_cfg.group_size:
      raise ValueError(f"rl.rollout_batch={rl_cfg.rollout_batch} must be a multiple of "
                       f"rl.group_size={rl_cfg.group_size} (a group is never split)")

  def _generate(self, samples: dict, seed_of: Callable[[int], int]) -> list[AgentResult]:
    """G trajectories per question, in sub-batches of rl.rollout_batch trajectories."""
    g = self.cfg.group_size
    questions = [q for q in samples["question"] for _ in range(g)]
    documents = [d for d in samples["context"] for _ in range(g)]
    results = []
    step = self.cfg.rollout_batch
    for i, start in enumerate(range(0, len(questions), step)):
      results += self.agent.answer_batch(questions[start:start + step], documents[start:start + step],
                                         temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                         seed=seed_of(i))
    return results

  def _rewards(self, results, answers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shaped reward, raw score, final answer tokens) per trajectory; shaping (DAPO's overlong
    penalty) applies to the final answer's length only, memory updates are capped by the agent."""
    g = self.cfg.group_size
    scores = np.asarray([self.reward_fn(r, list(answers[i // g])) for i, r in enumerate(results)], np.float32)
    lengths = np.asarray([len(r.conversations[-1].response_ids) for r in results])  # stop token included, as DAPO
    shaped = scores.copy()
    ov = self.cfg.overlong
    if ov.enable:
      shaped += overlong_penalty(lengths, ov.max_tokens, ov.cache_tokens)
    return shaped, scores, lengths

  def collect(self, batches: Iterator[dict], seed_of: Callable[[int, int], int]) -> StepRollout:
    """Draws question batches until `questions_per_step` groups are kept (dynamic sampling) or
    the first batch is used as is; seed_of(gen_batch, sub_batch) seeds each agent call."""
    cfg, g = self.cfg, self.cfg.group_size
    t0 = time.perf_counter()
    kept_results, kept_rewards = [], []
    all_results, all_scores, all_rewards, all_lengths = [], [], [], []
    groups_seen = gen = 0
    while True:
      samples = next(batches)
      results = self._generate(samples, lambda sub: seed_of(gen, sub))
      shaped, scores, lengths = self._rewards(results, samples["answers"])
      all_results += results
      all_scores.append(scores), all_rewards.append(shaped), all_lengths.append(lengths)
      nq = len(samples["question"])
      groups_seen += nq
      for q in range(nq):
        acc = scores[q * g:(q + 1) * g]
        if cfg.dynamic_sampling and np.all(acc == acc[0]):
          continue  # no signal: every trajectory got the same score (DAPO filters on accuracy)
        kept_results.append(results[q * g:(q + 1) * g])
        kept_rewards.append(shaped[q * g:(q + 1) * g])
      gen += 1
      full = len(kept_results) >= cfg.questions_per_step
      if not cfg.dynamic_sampling or full:
        break
      if gen > cfg.max_extra_gen_batches:
        if cfg.on_insufficient == "fail":
          raise DynamicSamplingError(
              f"dynamic sampling kept {len(kept_results)} of the {cfg.questions_per_step} groups a step "
              f"needs after {gen} generation batches (rl.max_extra_gen_batches={cfg.max_extra_gen_batches}):"
              " every other group had equal rewards; raise max_extra_gen_batches, or set "
              "rl.on_insufficient='proceed' to train on the kept groups")
        break
    informative = len(kept_results)  # groups with a reward signal, before trimming to the step size
    kept_results, kept_rewards = kept_results[:cfg.questions_per_step], kept_rewards[:cfg.questions_per_step]
    scores, shaped, lengths = map(np.concatenate, (all_scores, all_rewards, all_lengths))
    memory_lengths = [_response_tokens(c, self.stop_tokens) for r in all_results for c in r.conversations[:-1]]
    metrics = {
        "reward_mean": float(shaped.mean()), "accuracy": float(scores.mean()),
        "kept_group_frac": informative / max(1, groups_seen), "gen_batches": gen,
        "kept_groups": len(kept_results), "answer_tokens": float(lengths.mean()),
        "memory_tokens": float(np.mean(memory_lengths)) if memory_lengths else 0.0,
        "chunks_per_doc": float(np.mean([r.num_chunks for r in all_results])),
        "truncated_frac": float(np.mean([c.truncated for r in all_results for c in r.conversations])),
        "rollout_tokens": float(sum(len(c.prompt_ids) + len(c.response_ids)
                                    for r in all_results for c in r.conversations)),
        "rollout_seconds": time.perf_counter() - t0,
    }
    rows = self._rows(kept_results, kept_rewards) if kept_results else None
    return StepRollout(rows, len(kept_results), metrics, all_results)

  def _rows(self, groups: list[list[AgentResult]], group_rewards: list[np.ndarray]) -> TrainRows:
    flat = [r for grp in groups for r in grp]
    reward = np.concatenate(group_rewards)
    group_ids = np.repeat(np.arange(len(groups)), self.cfg.group_size)
    traj_adv = self.advantage_fn(reward, group_ids, self.cfg.eps)
    batch = ConversationBatch.from_results(flat, self.agent.pad_id, self.prompt_width, self.response_width)
    row_adv = adv_lib.broadcast_to_rows(traj_adv, batch.trajectory)
    return rows_from_conversations(batch, row_adv, group_ids[batch.trajectory], self.cfg.mask_truncated)
