"""Host reference implementations of the training rows, for tests only.

Training builds its rows on device (memagent_jax/rl/device_rows.py: `SlotRows`, the gather, its
shared-prefix check) and never on the host. The plain numpy versions here build the same rows from a
`ConversationBatch` (every conversation of every kept trajectory as one fixed-width row: the prompt
left-padded to P tokens, then the response right-padded to N), split and pad them into mini-batches,
turn them into whole-conversation language-model rows, and check a shared prefix, one row at a time.
They live in tests because tests are their only users: they are the reference the device gather and
the update are checked against, and no production code calls them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from memagent_jax.agent.results import ConversationBatch
from memagent_jax.rl.device_rows import MiniBatchPlan, SlotRows, gather_update_batch, mini_batch_split


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


def mini_batches(rows: TrainRows, *, num_questions: int, questions_per_mini_batch: int,
                 multiple: int, pad_id: int) -> list[TrainRows]:
  """Splits rows by question into mini-batches (`mini_batch_split`: multiple = micro-batches x
  batch shards), each padded with empty rows to its bucketed count."""
  return [rows.take(idx).pad_to(count, pad_id)
          for idx, count in mini_batch_split(rows.question, num_questions=num_questions,
                                             questions_per_mini_batch=questions_per_mini_batch, multiple=multiple)]


def language_model_rows(rows: TrainRows) -> TrainRows:
  """The same rows with every real token after the first as a target (prompt_width 1): next-token
  loss on whole conversations, as a base model is pretrained, instead of on responses only (the
  host reference of `SlotRows(loss_on_prompt=True)`)."""
  loss_mask = rows.valid[:, 1:] & rows.valid[:, :-1]  # [R, W - 1]: a target and a real token before it
  zeros = np.zeros(loss_mask.shape, np.float32)
  return TrainRows(tokens=rows.tokens, valid=rows.valid, loss_mask=loss_mask, old_logp=zeros, ref_logp=zeros,
                   advantages=rows.advantages, question=rows.question, prompt_width=1)


def prefix_fits(tokens, valid, prefix, prompt_width: int) -> bool:
  """Host check (the reference of the device gather's check, rl/device_rows.py) that a shared prefix [L]
  can stand in for the first L slots of every row [R, W]:
  each row either starts with it (from its first real slot) or has at least L slots of padding
  before its first real token, and the loss starts after the prefix."""
  if prefix is None:
    return False
  prefix, l = np.asarray(prefix), len(prefix)
  if prompt_width <= l or tokens.shape[1] <= l:
    return False
  first = np.argmax(valid, axis=1)
  for row, f in zip(tokens, first):
    if f < l and not np.array_equal(row[f:l], prefix[:l - f]):
      return False
  return True


def host_rows(rows: SlotRows) -> TrainRows:
  """A step's rows (gathered on device, as the trainer gathers them) as host arrays, for inspection."""
  plan = MiniBatchPlan(slot=rows.slot, advantages=rows.advantages, question=rows.question)
  batch, _ = gather_update_batch(rows.slots, plan, micro_batches=1, mask_truncated=rows.mask_truncated,
                                 pad_id=rows.pad_id, loss_on_prompt=rows.loss_on_prompt)
  arrays = {f.name: np.asarray(getattr(batch, f.name))[0] for f in dataclasses.fields(batch)}
  return TrainRows(**arrays, question=rows.question, prompt_width=rows.prompt_width)
