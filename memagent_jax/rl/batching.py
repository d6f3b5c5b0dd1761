"""Training rows: every conversation of every kept trajectory as one fixed-width row.

A row is the prompt left-padded to P tokens followed by the response right-padded to N, so
the response always starts at column P and one compiled update serves every step. Rows are
grouped into mini-batches by question and padded with empty rows (mask all False) to a
bucketed count, so the row count takes only a few distinct values.

Training gathers these rows on device (rl/device_rows.py); the host-built `TrainRows` here are
what a step's rows look like when inspected (`SlotRows.host_rows`) and the plain reference the
device gather is tested against. `mini_batch_split` is the one split both use.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from memagent_jax.agent.results import ConversationBatch


@dataclasses.dataclass(kw_only=True)
class TrainRows:
  """Host arrays of R rows; `prompt_width` P marks where responses start."""
  tokens: np.ndarray  # [R, P + N] int32
  valid: np.ndarray  # [R, P + N] bool: real tokens (attention mask)
  loss_mask: np.ndarray  # [R, N] bool: response tokens that count in the loss
  old_logp: np.ndarray  # [R, N] float32: log-probs of the policy that sampled (or recomputed)
  ref_logp: np.ndarray  # [R, N] float32: reference-policy log-probs (zeros when KL is off)
  advantages: np.ndarray  # [R] float32: the trajectory's advantage, on every row
  question: np.ndarray  # [R] int32: question (group) index within the step; -1 for padding
  prompt_width: int

  def __len__(self) -> int:
    return len(self.advantages)

  @property
  def response_width(self) -> int:
    return self.loss_mask.shape[1]

  def take(self, idx) -> "TrainRows":
    idx = np.asarray(idx, np.int64)
    return TrainRows(**{k: a[idx] for k, a in self.row_arrays().items()}, prompt_width=self.prompt_width)

  def pad_to(self, rows: int, pad_id: int) -> "TrainRows":
    """Appends empty rows (no valid token but one, no loss) up to `rows`."""
    r = len(self)
    if rows < r:
      raise ValueError(f"cannot pad {r} rows down to {rows}")
    extra = rows - r
    tokens = np.concatenate([self.tokens, np.full((extra, self.tokens.shape[1]), pad_id, np.int32)])
    valid = np.concatenate([self.valid, np.zeros((extra, self.valid.shape[1]), bool)])
    valid[r:, self.prompt_width - 1] = True  # one real token keeps attention well defined
    z = lambda a: np.concatenate([a, np.zeros((extra,) + a.shape[1:], a.dtype)])
    return TrainRows(tokens=tokens, valid=valid, loss_mask=z(self.loss_mask), old_logp=z(self.old_logp),
                     ref_logp=z(self.ref_logp), advantages=z(self.advantages),
                     question=np.concatenate([self.question, np.full(extra, -1, np.int32)]),
                     prompt_width=self.prompt_width)

  def arrays(self) -> dict[str, np.ndarray]:
    """The arrays the update reads (every per-row field but `question`)."""
    return dict(tokens=self.tokens, valid=self.valid, loss_mask=self.loss_mask, old_logp=self.old_logp,
                ref_logp=self.ref_logp, advantages=self.advantages)

  def row_arrays(self) -> dict[str, np.ndarray]:
    """Every per-row field, `question` included: TrainRows(**row_arrays(), prompt_width=P) rebuilds."""
    return dict(self.arrays(), question=self.question)


def rows_from_conversations(batch: ConversationBatch, *, row_advantages: np.ndarray, row_question: np.ndarray,
                            mask_truncated: bool) -> TrainRows:
  """ConversationBatch (fixed widths) + per-row advantages -> TrainRows.

  mask_truncated drops from the loss every conversation that hit its token cap (DAPO's
  overlong filtering) while keeping it in the batch."""
  p = batch.prompt_ids.shape[1]
  tokens = np.concatenate([batch.prompt_ids, batch.response_ids], axis=1)
  prompt_valid = np.arange(p)[None, :] >= (p - batch.prompt_lengths)[:, None]
  valid = np.concatenate([prompt_valid, batch.response_mask], axis=1)
  loss_mask = batch.response_mask.copy()
  if mask_truncated:
    loss_mask &= ~batch.truncated[:, None]
  return TrainRows(tokens=tokens.astype(np.int32), valid=valid, loss_mask=loss_mask,
                   old_logp=batch.response_logprobs.astype(np.float32),
                   ref_logp=np.zeros(loss_mask.shape, np.float32),
                   advantages=np.asarray(row_advantages, np.float32),
                   question=np.asarray(row_question, np.int32), prompt_width=p)


def bucket_rows(rows: int, multiple: int) -> int:
  """Smallest `multiple * u` >= rows with u in 1, 2, 3, 4, 6, 8, 12, 16, ... (2^k or 1.5 * 2^k):
  two shapes per octave, so few compilations and at most 1/3 of the rows are padding."""
  if rows < 1:
    raise ValueError("no rows to bucket")
  units = -(-rows // multiple)
  power = 1 << (units - 1).bit_length()  # smallest 2^k >= units
  return multiple * (3 * power // 4 if power >= 4 and units <= 3 * power // 4 else power)


def mini_batch_split(question, *, num_questions: int, questions_per_mini_batch: int,
                     multiple: int) -> list[tuple[np.ndarray, int]]:
  """Rows by question [R] -> per mini-batch of `questions_per_mini_batch` questions (the last one
  smaller when dynamic sampling proceeded with fewer groups): (its row indices, its bucketed row
  count, divisible by `multiple`)."""
  out = []
  for start in range(0, num_questions, questions_per_mini_batch):
    idx = np.flatnonzero((question >= start) & (question < start + questions_per_mini_batch))
    out.append((idx, bucket_rows(len(idx), multiple)))
  return out


def mini_batches(rows: TrainRows, *, num_questions: int, questions_per_mini_batch: int,
                 multiple: int, pad_id: int) -> list[TrainRows]:
  """Splits rows by question into mini-batches (`mini_batch_split`: multiple = micro-batches x
  batch shards), each padded with empty rows to its bucketed count."""
  return [rows.take(idx).pad_to(count, pad_id)
          for idx, count in mini_batch_split(rows.question, num_questions=num_questions,
                                             questions_per_mini_batch=questions_per_mini_batch, multiple=multiple)]
