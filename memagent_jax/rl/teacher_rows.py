"""Supervised steps through the RL trainer: teacher-forced conversations as training rows.

A `TeacherCollector` stands where the `RolloutCollector` stands: it draws a question batch,
lets a registered teacher (memagent_jax.rl.toy_teacher) write each trajectory in the agent's
exact prompt format, and returns the same fixed-width rows (`device_rows.SlotRows`) with
advantage 1, so the update step's `sft` loss (token-mean negative log-likelihood of the
responses) trains on them.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Callable, Iterator

import numpy as np

from memagent_jax.agent.gates import GATE_NAMES
from memagent_jax.agent.results import slots_from_results
from memagent_jax.data.tasks import QuestionBatch
from memagent_jax.rl import rewards
from memagent_jax.rl.device_rows import SlotRows
from memagent_jax.rl.rollout import RolloutMetrics, StepRollout
from memagent_jax.rl.toy_teacher import TEACHERS


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherSpec:
  """Which registered teacher writes the rows, with its keyword options (name, value) pairs."""
  name: str
  options: tuple[tuple[str, object], ...] = ()
  prompt_loss: bool = False  # also train on prompt tokens (next-token loss on whole conversations)

  def __post_init__(self):
    TEACHERS.get(self.name)  # an unknown name raises, listing the known ones


class TeacherCollector:
  """Teacher trajectories of one step's questions -> training rows (one trajectory per question)."""

  def __init__(self, agent, spec: TeacherSpec, *, prompt_width: int, response_width: int):
    self.agent, self.prompt_width, self.response_width = agent, prompt_width, response_width
    self.teacher = TEACHERS.get(spec.name)
    self.options = dict(spec.options)
    self.prompt_loss = spec.prompt_loss

  def collect(self, batches: Iterator[QuestionBatch], seed_of: Callable[[int, int], int]) -> StepRollout:
    t0 = time.perf_counter()
    samples = next(batches)
    rng = random.Random(seed_of(0, 0))
    results = [self.teacher(self.agent, q, c, rng=rng, **self.options)
               for q, c in zip(samples.question, samples.context)]
    # every process writes every trajectory (the teacher is host code): nothing to gather
    slots = slots_from_results(results, self.agent.pad_id, prompt_width=self.prompt_width,
                               response_width=self.response_width, gather=False)
    row, turn = np.nonzero(slots.active)  # row-major: trajectory by trajectory, turns in order
    t = slots.turns
    rows = SlotRows(slots=slots.slots, slot=(row * t + turn).astype(np.int32), question=row.astype(np.int32),
                    advantages=np.ones(len(row), np.float32),
                    tokens=(slots.prompt_len + slots.response_len)[row, turn].astype(np.int64),
                    prompt_len=slots.prompt_len[row, turn].astype(np.int64),
                    pad_id=self.agent.pad_id, loss_on_prompt=self.prompt_loss)  # never truncated
    scores = [rewards.exact_match(r.prediction, list(a)) for r, a in zip(results, samples.answers)]
    memory = slots.response_len[slots.active & ~slots.is_final]
    gate = {}
    if slots.gate is not None:  # a gated reader's teacher: the shares of its memory turns' gates
      turns = slots.gate[slots.active & ~slots.is_final]
      gate = {f"{name}_frac": float((turns == GATE_NAMES.index(name)).mean()) if turns.size else 0.0
              for name in ("keep", "stop", "invalid")}
    seconds = time.perf_counter() - t0
    metrics = RolloutMetrics(**gate, decoded_tokens_per_doc=float(np.mean([r.decoded_tokens for r in results])),
                             seconds_per_doc=seconds / len(results),reward_mean=float(np.mean(scores)), accuracy=float(np.mean(scores)),
                             teacher_accuracy=float(np.mean(scores)), kept_group_frac=1.0,
                             kept_groups=len(results), rows_per_process=float(len(results)),
                             memory_tokens=float(memory.mean()) if memory.size else 0.0,
                             chunks_per_doc=float(np.mean([r.num_chunks for r in results])),
                             rollout_tokens=float(rows.tokens.sum()), rollout_seconds=time.perf_counter() - t0)
    return StepRollout(rows=rows, num_questions=len(results), metrics=metrics, results=results)
