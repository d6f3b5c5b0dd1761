"""What an agent run returns: per-document results for people and the public API, and the same
conversations as fixed-width slots for RL (tokens on device, a few counts on the host)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from memagent_jax.agent.gates import GATE_NAMES
from memagent_jax.runtime.process_gather import gather_rows


@dataclasses.dataclass(kw_only=True)
class Conversation:
  """One single-turn chat of a trajectory: a memory update (turn k) or the final answer."""
  prompt_ids: np.ndarray | None  # [P] int32 (None when the run did not keep prompts)
  response_ids: np.ndarray  # [N] int32, the stop token included when the model emitted one
  response_logprobs: np.ndarray  # [N] float32 log p under the model (temperature 1)
  sample_logprobs: np.ndarray  # [N] float32 log p under the sampling distribution (0 if greedy)
  truncated: bool  # hit the token cap without a stop token
  is_final: bool


@dataclasses.dataclass(kw_only=True)
class AgentResult:
  """The outcome of reading one document."""
  question: str
  answer: str  # final response text
  boxed: str | None  # the extracted \boxed{} content
  prediction: str | None  # what the answer claims (boxed, or after "the answer is"); None: no format
  memories: list[str]  # memory text after each chunk
  conversations: list[Conversation]  # every memory update in order, then the final answer
  num_chunks: int  # chunks read (a gated reader that stopped reads fewer than the document holds)
  document_tokens: int
  decoded_tokens: int  # tokens generated over every conversation (memory updates and the answer)
  seconds: float  # wall seconds of reading it (a batch's time shared by its documents)
  gates: list[str] | None = None  # each memory turn's gate (agent/gates.py GATE_NAMES); None: no gate


@dataclasses.dataclass(kw_only=True)
class ConversationBatch:
  """All conversations of a batch of trajectories as padded arrays: the rows RL trains on.

  Prompts are left-padded, responses right-padded; `trajectory` maps each row to its result.
  """
  prompt_ids: np.ndarray  # [R, P] int32, left-padded
  prompt_lengths: np.ndarray  # [R]
  response_ids: np.ndarray  # [R, N] int32, right-padded
  response_mask: np.ndarray  # [R, N] bool
  response_logprobs: np.ndarray  # [R, N] float32
  sample_logprobs: np.ndarray  # [R, N] float32
  truncated: np.ndarray  # [R] bool
  is_final: np.ndarray  # [R] bool
  trajectory: np.ndarray  # [R] int32 index into the results
  turn: np.ndarray  # [R] int32 conversation index within its trajectory

  @classmethod
  def from_results(cls, results: Sequence[AgentResult], pad_id: int, *, prompt_width: int | None = None,
                   response_width: int | None = None) -> "ConversationBatch":
    """Pads to the longest prompt/response (width None), or to fixed widths (static shapes: no recompiles)."""
    convs = [(i, t, c) for i, r in enumerate(results) for t, c in enumerate(r.conversations)]
    if not convs:
      raise ValueError("no conversations to batch")
    if any(c.prompt_ids is None for _, _, c in convs):
      raise ValueError("these results were run with keep_prompts=False; RL needs the prompts")
    p = max(len(c.prompt_ids) for _, _, c in convs)
    n = max(len(c.response_ids) for _, _, c in convs)
    if (prompt_width or p) < p or (response_width or n) < n:
      raise ValueError(f"conversations need prompt width {p} and response width {n}; got "
                       f"prompt_width={prompt_width}, response_width={response_width}")
    p, n = prompt_width or p, response_width or n
    r = len(convs)
    out = cls(prompt_ids=np.full((r, p), pad_id, np.int32), prompt_lengths=np.zeros(r, np.int32),
              response_ids=np.full((r, n), pad_id, np.int32), response_mask=np.zeros((r, n), bool),
              response_logprobs=np.zeros((r, n), np.float32), sample_logprobs=np.zeros((r, n), np.float32),
              truncated=np.zeros(r, bool), is_final=np.zeros(r, bool), trajectory=np.zeros(r, np.int32),
              turn=np.zeros(r, np.int32))
    for row, (i, t, c) in enumerate(convs):
      lp, ln = len(c.prompt_ids), len(c.response_ids)
      out.prompt_ids[row, p - lp:] = c.prompt_ids
      out.prompt_lengths[row] = lp
      out.response_ids[row, :ln] = c.response_ids
      out.response_mask[row, :ln] = True
      out.response_logprobs[row, :ln] = c.response_logprobs
      out.sample_logprobs[row, :ln] = c.sample_logprobs
      out.truncated[row], out.is_final[row] = c.truncated, c.is_final
      out.trajectory[row], out.turn[row] = i, t
    return out

  def __len__(self) -> int:
    return len(self.trajectory)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class ConversationSlots:
  """S conversations as fixed-width device arrays, what RL trains on without a trip through the
  host (rl/device_rows.py); a slot may be empty (lengths 0)."""
  prompt: jax.Array  # [S, P] int32, left-padded
  prompt_len: jax.Array  # [S] int32
  response: jax.Array  # [S, N] int32, right-padded (the stop token included when emitted)
  response_len: jax.Array  # [S] int32
  logprobs: jax.Array  # [S, N] float32: log p of each response token under the policy that sampled
  truncated: jax.Array  # [S] bool: hit the token cap without a stop token


@dataclasses.dataclass(kw_only=True)
class RolloutSlots:
  """One reader call's trajectories for RL: every conversation as a slot of `slots` (device arrays,
  global rows: row r of process p is global row p x b + r, its turn t is slot (p x b + r) x T + t),
  and on the host, for this process's b rows, what rewards, metrics and the row plan read."""
  slots: ConversationSlots  # [B x T, ...] over every process's rows
  active: np.ndarray  # [b, T] bool: the turn holds a conversation (a row's document may end early)
  is_final: np.ndarray  # [b, T] bool: the final answer
  prompt_len: np.ndarray  # [b, T] int32
  response_len: np.ndarray  # [b, T] int32, the stop token included when emitted
  truncated: np.ndarray  # [b, T] bool
  answers: list[str]  # [b] final answer texts
  predictions: list[str | None]  # [b] what each answer claims (None: no recognised format)
  num_chunks: np.ndarray  # [b] memory updates of each row (chunks read)
  gate: np.ndarray | None = None  # [b, T] int32 gates.MEMORY / KEEP / STOP / INVALID per turn; None: no gate
  doc_chunks: np.ndarray | None = None  # [b] chunks of each document, read or not (None: num_chunks)
  evidence: np.ndarray | None = None  # [b, T] bool: turn t's chunk holds a gold answer (set by RL's collector
  #   when a gate term reads it; gate_signals.answer_in_chunks)

  @property
  def turns(self) -> int:
    return self.active.shape[1]

  def __len__(self) -> int:
    return len(self.answers)


def slots_from_results(results: Sequence[AgentResult], pad_id: int, *, prompt_width: int, response_width: int,
                       gather: bool = True) -> RolloutSlots:
  """Host results -> RolloutSlots (readers whose conversations are on the host already: a direct
  reader, a teacher, a scripted one). Conversation t of row r is turn t. gather: the results are
  this process's rows, and every process's are gathered so that the slots hold the global rows on
  every device; False: every process holds the same results (all rows)."""
  batch = ConversationBatch.from_results(results, pad_id, prompt_width=prompt_width, response_width=response_width)
  b, t = len(results), max(len(r.conversations) for r in results)
  if gather:
    t = int(gather_rows(np.asarray([t])).max())  # one turn count on every process
  where = (batch.trajectory, batch.turn)
  grid = lambda values, dtype: _scatter((b, t), where, values, dtype)
  host = dict(active=grid(True, bool), is_final=grid(batch.is_final, bool),
              prompt_len=grid(batch.prompt_lengths, np.int32),
              response_len=grid(batch.response_mask.sum(1), np.int32), truncated=grid(batch.truncated, bool))
  slot = batch.trajectory * t + batch.turn  # [R] local slot of each conversation
  table = dict(prompt=np.full((b * t, prompt_width), pad_id, np.int32), prompt_len=np.zeros(b * t, np.int32),
               response=np.full((b * t, response_width), pad_id, np.int32), response_len=np.zeros(b * t, np.int32),
               logprobs=np.zeros((b * t, response_width), np.float32), truncated=np.zeros(b * t, bool))
  for name, values in dict(prompt=batch.prompt_ids, prompt_len=batch.prompt_lengths, response=batch.response_ids,
                           response_len=host["response_len"][where], logprobs=batch.response_logprobs,
                           truncated=batch.truncated).items():
    table[name][slot] = values
  every = gather_rows if gather else np.asarray
  slots = ConversationSlots(**{k: jax.numpy.asarray(every(v)) for k, v in table.items()})
  gate = None
  if any(r.gates is not None for r in results):  # memory turns in order, the final answer last
    gate = np.zeros((b, t), np.int32)
    for i, r in enumerate(results):
      gate[i, :len(r.gates or ())] = [GATE_NAMES.index(g) for g in r.gates or ()]
  return RolloutSlots(slots=slots, **host, answers=[r.answer for r in results],
                      predictions=[r.prediction for r in results],
                      num_chunks=np.asarray([r.num_chunks for r in results], np.int32), gate=gate)


def _scatter(shape, where, values, dtype) -> np.ndarray:
  out = np.zeros(shape, dtype)
  out[where] = values
  return out
