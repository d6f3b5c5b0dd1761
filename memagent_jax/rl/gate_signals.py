"""Training signals of the gated memory: gate reward terms and turn-level advantages.

A gated trajectory's reward is the final answer's (shaped) reward plus weighted gate terms, each
registered by name in `GATE_TERMS` and given per trajectory and per memory turn. With s the final
answer's raw score in [0, 1] and sign = 2 s - 1 (right: +1, wrong: -1):
  * "keep": sign x the share of memory turns that kept the memory (per turn: sign on a keep turn),
    so keeping is paid when the answer is still right and blamed when it is wrong;
  * "exit": sign x the share of the document's chunks left unread after a stop (per turn: on the
    stop turn), so stopping early is paid only when the memory sufficed;
  * "format": minus the share of invalid replies (per turn: -1 on an invalid reply);
  * "evidence": the gate against the chunk's content, not the answer: +1 on a turn that wrote a new
    memory from a chunk holding a gold answer (its evidence, `answer_in_chunks`) or kept the memory
    past a chunk without one, -1 on the other two (a write from a chunk without evidence is where a
    distractor's fact replaces the asked one); the mean over memory turns. Needs extractive answers.
Advantage modes (`ADVANTAGE_MODES`): "trajectory" gives every turn its trajectory's advantage
(Multi-Conv DAPO); "turn_mix" gives turn t of trajectory j (1 - w) A_j + w T_jt, where T_jt is the
turn's reward (final reward + its turn terms) minus the mean over its group's trajectories at the
same turn position (the final answers are one position). Host-side numpy; outputs float32.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from memagent_jax.agent import gates
from memagent_jax.rl import rewards
from memagent_jax.runtime.registry import Registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateOutcome:
  """What the gate terms read of N trajectories with T turns each (the final answer among them)."""
  score: np.ndarray  # [N] raw score of the final answer in [0, 1]
  gate: np.ndarray  # [N, T] int gates.MEMORY / KEEP / STOP / INVALID (memory turns; 0 elsewhere)
  memory_turn: np.ndarray  # [N, T] bool: a memory update the row ran (active and not the final answer)
  doc_chunks: np.ndarray  # [N] chunks of each document (read or not)
  evidence: np.ndarray | None = None  # [N, T] bool: turn t's chunk holds a gold answer (the "evidence" term's)

  @property
  def sign(self) -> np.ndarray:
    return 2.0 * np.asarray(self.score, np.float64) - 1.0  # [N]

  def share(self, code: int) -> np.ndarray:
    """[N] the share of memory turns with this gate."""
    hits = ((self.gate == code) & self.memory_turn).sum(1)
    return hits / np.maximum(1, self.memory_turn.sum(1))

  def turns(self, code: int) -> np.ndarray:
    """[N, T] 1.0 on the memory turns with this gate."""
    return ((self.gate == code) & self.memory_turn).astype(np.float64)


TermFn = Callable[[GateOutcome], tuple[np.ndarray, np.ndarray]]  # -> (per trajectory [N], per turn [N, T])
GATE_TERMS: Registry[TermFn] = Registry("gate term")


@GATE_TERMS.register("keep")
def keep_term(o: GateOutcome):
  """Keeping the memory: paid when the answer is right, blamed when wrong."""
  return o.sign * o.share(gates.KEEP), o.sign[:, None] * o.turns(gates.KEEP)


@GATE_TERMS.register("exit")
def exit_term(o: GateOutcome):
  """Stopping early: sign x the unread share of the document, on the stop turn."""
  read = o.memory_turn.sum(1)
  stopped = o.turns(gates.STOP).any(1)
  unread = np.where(stopped, (o.doc_chunks - read) / np.maximum(1, o.doc_chunks), 0.0)
  term = o.sign * unread
  return term, term[:, None] * o.turns(gates.STOP)


@GATE_TERMS.register("format")
def format_term(o: GateOutcome):
  """Invalid replies (a form with more text around it) cost their share."""
  return -o.share(gates.INVALID), -o.turns(gates.INVALID)


@GATE_TERMS.register("evidence")
def evidence_term(o: GateOutcome):
  """Writing where the chunk holds the answer and keeping where it does not: +1 per turn, -1 otherwise."""
  if o.evidence is None:
    raise ValueError("the 'evidence' gate term needs each turn's evidence (answer_in_chunks); this reader's "
                     "rollouts carry none")
  agree = agrees_with_evidence(o.gate, o.evidence) & o.memory_turn  # [N, T]
  disagrees = agrees_with_evidence(o.gate, ~np.asarray(o.evidence, bool)) & o.memory_turn  # a keep/write swapped
  turn = agree.astype(np.float64) - disagrees
  return turn.sum(1) / np.maximum(1, o.memory_turn.sum(1)), turn


def agrees_with_evidence(gate, evidence) -> np.ndarray:
  """Elementwise: a write (MEMORY) on an evidence chunk or a keep on a chunk without; stop, invalid: False."""
  evidence = np.asarray(evidence, bool)
  return np.where(evidence, gate == gates.MEMORY, gate == gates.KEEP)


def answer_in_chunks(chunk_texts: list[list[str]], answers: list[list[str]], turns: int) -> np.ndarray:
  """[N, turns] bool: chunk t of row i holds one of row i's gold answers as whole words (SQuAD-normalised
  text, as the rewards compare). An answer cut by a chunk boundary is in neither chunk; turns past a
  row's chunks (its final answer) are False."""
  out = np.zeros((len(chunk_texts), turns), bool)
  for i, (chunks, gold) in enumerate(zip(chunk_texts, answers, strict=True)):
    needles = [f" {g} " for g in map(rewards.normalize_answer, gold) if g]
    for t, text in enumerate(chunks[:turns]):
      hay = f" {rewards.normalize_answer(text)} "
      out[i, t] = any(n in hay for n in needles)
  return out


def weighted_terms(o: GateOutcome, weights: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
  """sum_k w_k term_k: per trajectory [N] and per turn [N, T] (terms of weight 0 are not computed)."""
  n, t = o.gate.shape
  traj, turn = np.zeros(n), np.zeros((n, t))
  for name, w in weights.items():
    if w:
      a, b = GATE_TERMS.get(name)(o)
      traj, turn = traj + w * a, turn + w * b
  return traj, turn


def turn_advantages(turn_rewards, turn_valid, is_final, group_ids) -> np.ndarray:
  """Turn-level advantages [N, T]: each turn's reward minus the mean over the turns of its group's
  trajectories at the same position (turn index; the final answers are one position); 0 off turns."""
  r = np.asarray(turn_rewards, np.float64)
  valid, final = np.asarray(turn_valid, bool), np.asarray(is_final, bool)
  n, t = r.shape
  _, group = np.unique(np.asarray(group_ids), return_inverse=True)  # [N] dense
  position = np.where(final, t, np.arange(t)[None, :])  # [N, T]: the final answers share position t
  key = group[:, None] * (t + 1) + position  # [N, T]
  sums = np.bincount(key[valid], weights=r[valid], minlength=key.max() + 1)
  counts = np.bincount(key[valid], minlength=key.max() + 1)
  mean = sums[key] / np.maximum(1, counts[key])
  return np.where(valid, r - mean, 0.0).astype(np.float32)


ModeFn = Callable[..., np.ndarray]  # fn(traj_adv [N], turn_adv [N, T], *, weight) -> [N, T]
ADVANTAGE_MODES: Registry[ModeFn] = Registry("advantage mode")


@ADVANTAGE_MODES.register("trajectory")
def trajectory_mode(traj_adv, turn_adv, *, weight: float) -> np.ndarray:
  """Multi-Conv DAPO: every turn gets its trajectory's advantage (weight unused)."""
  del weight
  a = np.asarray(traj_adv, np.float32)
  return np.broadcast_to(a[:, None], np.shape(turn_adv)).copy()


@ADVANTAGE_MODES.register("turn_mix")
def turn_mix_mode(traj_adv, turn_adv, *, weight: float) -> np.ndarray:
  """(1 - weight) x the trajectory's advantage + weight x the turn's own."""
  a = np.asarray(traj_adv, np.float64)[:, None]
  return ((1.0 - weight) * a + weight * np.asarray(turn_adv, np.float64)).astype(np.float32)
