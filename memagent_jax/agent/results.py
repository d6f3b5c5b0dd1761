"""What an agent run returns: per-document results, and the same conversations batched for RL."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np


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
  num_chunks: int
  document_tokens: int


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
