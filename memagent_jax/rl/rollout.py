"""Rollouts for Multi-Conv DAPO: G trajectories per question through the agent, rewards on the
final answers, overlong shaping, dynamic sampling, advantages broadcast to every conversation.

Everything here runs on the host around the compiled agent; the output is `TrainRows` with
static widths, ready for the jitted update.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

import jax
import numpy as np

from memagent_jax.agent.results import AgentResult, ConversationBatch
from memagent_jax.runtime.registry import Registry
from memagent_jax.rl import advantages as adv_lib
from memagent_jax.rl import rewards
from memagent_jax.rl.batching import TrainRows, rows_from_conversations
from memagent_jax.rl.process_gather import gather_rows, sum_over_processes, this_process_share


def _prediction_or_answer(result: AgentResult) -> str:
  return result.answer if result.prediction is None else result.prediction


# reward name -> fn(result, answers) -> float in [0, 1]; all look at the final answer only.
REWARD_FNS: Registry[Callable[[AgentResult, list[str]], float]] = Registry("reward")
REWARD_FNS.register("memagent_verifier", lambda r, a: rewards.memagent_verifier(r.answer, a))  # released
REWARD_FNS.register("sub_em", lambda r, a: rewards.sub_em(r.prediction, a))
for _name in ("exact_match", "string_match_all", "string_match_part"):
  REWARD_FNS.register(_name, lambda r, a, fn=getattr(rewards, _name): fn(_prediction_or_answer(r), a))
get_reward_fn = REWARD_FNS.get


def overlong_penalty(lengths, *, max_tokens: int, cache_tokens: int) -> np.ndarray:
  """DAPO's soft overlong punishment, in tokens: 0 up to Lmax - Lcache, then a linear ramp
  ((Lmax - Lcache) - L) / Lcache down to -1 at Lmax, and -1 beyond. lengths [N] -> [N]."""
  if not 0 < cache_tokens <= max_tokens:
    raise ValueError(f"overlong shaping needs 0 < cache_tokens <= max_tokens; got "
                     f"cache_tokens={cache_tokens}, max_tokens={max_tokens}")
  lengths = np.asarray(lengths, np.float64)
  free = max_tokens - cache_tokens
  ramp = (free - lengths) / cache_tokens
  return np.where(lengths <= free, 0.0, np.where(lengths <= max_tokens, ramp, -1.0)).astype(np.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OverlongSpec:
  """DAPO's soft overlong punishment of the final answer (see `overlong_penalty`)."""
  max_tokens: int
  cache_tokens: int

  def __post_init__(self):
    if not 0 < self.cache_tokens <= self.max_tokens:
      raise ValueError(f"overlong shaping needs 0 < cache_tokens <= max_tokens; got {self}")


ON_INSUFFICIENT = ("fail", "proceed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutSpec:
  """How one step's rollouts are drawn, scored and kept; checks itself on construction."""
  group_size: int  # G trajectories per question
  questions_per_step: int
  rollout_batch: int  # trajectories per agent call over all processes (a multiple of group_size)
  temperature: float = 1.0
  top_p: float = 1.0
  reward: str = "memagent_verifier"  # a REWARD_FNS name
  advantage: str = "mean_centred"  # an advantages.ADVANTAGES name
  eps: float = 1e-6
  dynamic_sampling: bool = False  # keep only groups whose scores differ (DAPO)
  max_extra_gen_batches: int = 0
  on_insufficient: str = "fail"  # ON_INSUFFICIENT: when dynamic sampling runs out of batches
  mask_truncated: bool = False  # drop conversations that hit their token cap from the loss
  overlong: OverlongSpec | None = None  # None: no overlong shaping

  def __post_init__(self):
    for name in ("group_size", "questions_per_step", "rollout_batch"):
      if getattr(self, name) < 1:
        raise ValueError(f"RolloutSpec.{name}={getattr(self, name)} must be >= 1")
    if self.rollout_batch % self.group_size:
      raise ValueError(f"rl.rollout_batch={self.rollout_batch} must be a multiple of "
                       f"rl.group_size={self.group_size} (a group is never split)")
    if not (self.temperature > 0 and 0 < self.top_p <= 1 and self.eps >= 0 and self.max_extra_gen_batches >= 0):
      raise ValueError(f"RolloutSpec needs temperature > 0, 0 < top_p <= 1, eps >= 0, "
                       f"max_extra_gen_batches >= 0; got {self}")
    if self.on_insufficient not in ON_INSUFFICIENT:
      raise ValueError(f"RolloutSpec.on_insufficient={self.on_insufficient!r}; choose one of {ON_INSUFFICIENT}")
    REWARD_FNS.get(self.reward)  # an unknown name raises, listing the known ones
    adv_lib.get_advantage(self.advantage)


class DynamicSamplingError(RuntimeError):
  """Dynamic sampling ran out of extra generation batches before the step was full."""


@dataclasses.dataclass(kw_only=True)
class StepRollout:
  """The kept groups of one rollout step as training rows, plus what to log."""
  rows: TrainRows | None  # None when no group was kept
  num_questions: int  # kept groups
  metrics: dict[str, float]
  results: list[AgentResult]  # every trajectory this process generated (kept or not), for inspection


def _response_tokens(conv, stop_tokens) -> int:
  ids = conv.response_ids
  return int(len(ids) - (len(ids) > 0 and int(ids[-1]) in stop_tokens))


class RolloutCollector:
  """Generates the rows of one step from an iterator of question batches."""

  def __init__(self, agent, spec: RolloutSpec, *, prompt_width: int, response_width: int):
    self.agent, self.spec = agent, spec
    self.prompt_width, self.response_width = prompt_width, response_width
    self.reward_fn = get_reward_fn(spec.reward)
    self.advantage_fn = adv_lib.get_advantage(spec.advantage)
    self.stop_tokens = set(agent.stop_tokens)

  def _generate(self, samples: dict, seed: int) -> tuple[list[AgentResult], slice]:
    """G trajectories for this process's share of the batch's questions, in agent calls of
    rl.rollout_batch trajectories over all processes. Trajectory g of question q samples with
    row id q * G + g under `seed`, so it is the same on any number of devices or processes."""
    g = self.spec.group_size
    mine = this_process_share(len(samples["question"]), "questions of a rollout batch")
    questions = [samples["question"][q] for q in range(mine.start, mine.stop) for _ in range(g)]
    documents = [samples["context"][q] for q in range(mine.start, mine.stop) for _ in range(g)]
    row_ids = [q * g + k for q in range(mine.start, mine.stop) for k in range(g)]
    step = max(1, self.spec.rollout_batch // jax.process_count())
    results = []
    for start in range(0, len(questions), step):
      part = slice(start, start + step)
      results += self.agent.answer_batch(questions[part], documents[part], temperature=self.spec.temperature,
                                         top_p=self.spec.top_p, seed=seed, row_ids=row_ids[part])
    return results, mine

  def _rewards(self, results, answers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shaped reward, raw score, final answer tokens) per trajectory; shaping (DAPO's overlong
    penalty) applies to the final answer's length only, memory updates are capped by the agent."""
    g = self.spec.group_size
    scores = np.asarray([self.reward_fn(r, list(answers[i // g])) for i, r in enumerate(results)], np.float32)
    lengths = np.asarray([len(r.conversations[-1].response_ids) for r in results])  # stop token included, as DAPO
    shaped = scores.copy()
    ov = self.spec.overlong
    if ov is not None:
      shaped += overlong_penalty(lengths, max_tokens=ov.max_tokens, cache_tokens=ov.cache_tokens)
    return shaped, scores, lengths

  def collect(self, batches: Iterator[dict], seed_of: Callable[[int, int], int]) -> StepRollout:
    """Draws question batches until `questions_per_step` groups are kept (dynamic sampling) or
    the first batch is used as is; seed_of(gen_batch, 0) seeds generation batch gen_batch.

    Each process generates its share of every batch; rewards are shared so that every process
    keeps the same groups, and the rows come together in question order on every process."""
    spec, g = self.spec, self.spec.group_size
    t0 = time.perf_counter()
    kept, kept_rewards, local = [], [], {}  # kept (gen, q); rewards [G] each; (gen, q) -> results
    all_results, all_scores, all_rewards, all_lengths = [], [], [], []
    groups_seen = gen = 0
    while True:
      samples = next(batches)
      results, mine = self._generate(samples, seed_of(gen, 0))
      answers = list(samples["answers"])[mine]
      shaped, scores, lengths = map(gather_rows, self._rewards(results, answers))  # every process's
      all_results += results
      all_scores.append(scores), all_rewards.append(shaped), all_lengths.append(lengths)
      nq = len(samples["question"])
      groups_seen += nq
      for q in range(nq):
        acc = scores[q * g:(q + 1) * g]
        if spec.dynamic_sampling and np.all(acc == acc[0]):
          continue  # no signal: every trajectory got the same score (DAPO filters on accuracy)
        kept.append((gen, q))
        kept_rewards.append(shaped[q * g:(q + 1) * g])
        if mine.start <= q < mine.stop:
          local[(gen, q)] = results[(q - mine.start) * g:(q - mine.start + 1) * g]
      gen += 1
      full = len(kept) >= spec.questions_per_step
      if not spec.dynamic_sampling or full:
        break
      if gen > spec.max_extra_gen_batches:
        if spec.on_insufficient == "fail":
          raise DynamicSamplingError(
              f"dynamic sampling kept {len(kept)} of the {spec.questions_per_step} groups a step "
              f"needs after {gen} generation batches (rl.max_extra_gen_batches={spec.max_extra_gen_batches}):"
              " every other group had equal rewards; raise max_extra_gen_batches, or set "
              "rl.on_insufficient='proceed' to train on the kept groups")
        break
    informative = len(kept)  # groups with a reward signal, before trimming to the step size
    kept, kept_rewards = kept[:spec.questions_per_step], kept_rewards[:spec.questions_per_step]
    scores, shaped, lengths = map(np.concatenate, (all_scores, all_rewards, all_lengths))
    metrics = {
        "reward_mean": float(shaped.mean()), "accuracy": float(scores.mean()),
        "kept_group_frac": informative / max(1, groups_seen), "gen_batches": gen,
        "kept_groups": len(kept), "answer_tokens": float(lengths.mean()),
        **self._result_metrics(all_results),
        "perf/rollout_rows_per_process": float(len(all_results)),
        "rollout_seconds": time.perf_counter() - t0,
    }
    rows = self._rows(kept, kept_rewards, local) if kept else None
    return StepRollout(rows=rows, num_questions=len(kept), metrics=metrics, results=all_results)

  def _result_metrics(self, results: list[AgentResult]) -> dict[str, float]:
    """Means over every process's trajectories of memory length, chunks, truncation, tokens."""
    memory = [_response_tokens(c, self.stop_tokens) for r in results for c in r.conversations[:-1]]
    convs = [c for r in results for c in r.conversations]
    t = sum_over_processes({
        "memory_tokens": float(sum(memory)), "memory_convs": float(len(memory)),
        "chunks": float(sum(r.num_chunks for r in results)), "docs": float(len(results)),
        "truncated": float(sum(c.truncated for c in convs)), "convs": float(len(convs)),
        "tokens": float(sum(len(c.prompt_ids) + len(c.response_ids) for c in convs))})
    return {"memory_tokens": t["memory_tokens"] / max(1.0, t["memory_convs"]),
            "chunks_per_doc": t["chunks"] / max(1.0, t["docs"]),
            "truncated_frac": t["truncated"] / max(1.0, t["convs"]), "rollout_tokens": t["tokens"]}

  def _rows(self, kept: list[tuple[int, int]], kept_rewards: list[np.ndarray],
            local: dict[tuple[int, int], list[AgentResult]]) -> TrainRows:
    """Rows of the kept groups, in kept order on every process: each process batches the groups
    it generated, then the rows of all processes are gathered and ordered by group."""
    g = self.spec.group_size
    traj_adv = self.advantage_fn(np.concatenate(kept_rewards), np.repeat(np.arange(len(kept)), g),
                                 eps=self.spec.eps)  # [K * G]
    mine = [k for k, key in enumerate(kept) if key in local]
    width = self.prompt_width + self.response_width
    if mine:
      flat = [r for k in mine for r in local[kept[k]]]
      traj = np.asarray([k * g + j for k in mine for j in range(g)])  # global trajectory index
      batch = ConversationBatch.from_results(flat, self.agent.pad_id, prompt_width=self.prompt_width,
                                             response_width=self.response_width)
      part = rows_from_conversations(batch, row_advantages=adv_lib.broadcast_to_rows(traj_adv, traj[batch.trajectory]),
                                     row_question=traj[batch.trajectory] // g,
                                     mask_truncated=self.spec.mask_truncated)
    else:  # this process generated none of the kept groups: it still joins the gather
      z = lambda *shape, dt=np.float32: np.zeros(shape, dt)
      n = self.response_width
      part = TrainRows(tokens=z(0, width, dt=np.int32), valid=z(0, width, dt=bool),
                       loss_mask=z(0, n, dt=bool), old_logp=z(0, n), ref_logp=z(0, n), advantages=z(0),
                       question=z(0, dt=np.int32), prompt_width=self.prompt_width)
    fields = {k: gather_rows(a) for k, a in part.row_arrays().items()}
    order = np.argsort(fields["question"], kind="stable")  # group order; within a group, as generated
    return TrainRows(**{k: f[order] for k, f in fields.items()}, prompt_width=self.prompt_width)
