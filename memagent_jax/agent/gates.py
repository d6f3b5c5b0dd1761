"""Gated memory: a memory turn may answer with a short form instead of a new memory.

`keep` leaves the memory unchanged; `stop` (the "keep_stop" forms) also ends the reading: the row
reads no further chunks and answers from its memory. A reply is a form when it equals the form
after stripping surrounding whitespace; a reply that holds a form but is more than it is "invalid"
(the agent's `invalid_gate` says whether it becomes the memory or is dropped). The host parses
text (`parse_reply`); the compiled recurrence decides from token ids (`gate_codes`) with the
spellings `GateSpec.build` reads from the tokenizer once.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

KEEP_FORM, STOP_FORM = "<keep>", "<stop>"
GATE_FORMS = {"keep": (KEEP_FORM,), "keep_stop": (KEEP_FORM, STOP_FORM)}  # agent.gate_forms -> its forms
MEMORY_KINDS = ("overwrite", "gated")  # agent.memory
INVALID_GATES = ("as_memory", "keep")  # agent.invalid_gate: an invalid reply becomes the memory, or is dropped

# Each memory turn's gate, as the recurrence reports it (StepOutputs.gate) and results name it.
MEMORY, KEEP, STOP, INVALID = 0, 1, 2, 3
GATE_NAMES = ("memory", "keep", "stop", "invalid")


def parse_reply(text: str, forms: tuple[str, ...]) -> str:
  """The gate a memory turn's reply text takes: a form's name, "invalid" or "memory" (strict parse)."""
  stripped = text.strip()
  for form in forms:
    if stripped == form:
      return GATE_NAMES[KEEP] if form == KEEP_FORM else GATE_NAMES[STOP]
  return GATE_NAMES[INVALID] if any(form in text for form in forms) else GATE_NAMES[MEMORY]


def _token_texts(tokenizer) -> list[tuple[int, str]]:
  """(id, text) of every vocabulary token, decoded alone in one batch (special tokens decode to "")."""
  ids = sorted(set(tokenizer.hf.get_vocab().values()))
  return list(zip(ids, tokenizer.hf.batch_decode([[i] for i in ids], skip_special_tokens=True)))


def blank_token_ids(tokenizer) -> tuple[int, ...]:
  """Ids of vocabulary tokens whose text is whitespace only (ignored around and inside a form)."""
  return tuple(i for i, text in _token_texts(tokenizer) if text and not text.strip())


def form_spellings(tokenizer, form: str) -> tuple[tuple[int, ...], ...]:
  """Token id sequences that spell `form` with blank tokens removed: every single vocabulary token
  whose text is the form after stripping whitespace, then the tokenizer's own encodings of the form
  (bare, after a space, after a newline)."""
  texts = _token_texts(tokenizer)
  blanks = {i for i, text in texts if text and not text.strip()}
  single = [(i,) for i, text in texts if text.strip() == form]
  encoded = sorted({tuple(t for t in tokenizer.encode(prefix + form) if t not in blanks) for prefix in ("", " ", "\n")})
  return tuple(s for s in dict.fromkeys(single + encoded) if s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateSpec:
  """Static gate settings of the compiled recurrence (hashable): form spellings as token ids."""
  keep: tuple[tuple[int, ...], ...]  # spellings of the keep form
  stop: tuple[tuple[int, ...], ...]  # spellings of the stop form (empty: no stop form)
  blank: tuple[int, ...]  # whitespace-only token ids, ignored when matching
  eos: tuple[int, ...]  # the model's stop tokens (not part of a reply's content)
  invalid_keeps: bool  # an invalid reply leaves the memory unchanged (else it becomes the memory)

  @classmethod
  def build(cls, tokenizer, *, forms: str, invalid_gate: str, eos: tuple[int, ...]) -> "GateSpec":
    if forms not in GATE_FORMS:
      raise ValueError(f"gate_forms={forms!r}; choose one of {sorted(GATE_FORMS)}")
    if invalid_gate not in INVALID_GATES:
      raise ValueError(f"invalid_gate={invalid_gate!r}; choose one of {INVALID_GATES}")
    keep = form_spellings(tokenizer, KEEP_FORM)
    stop = form_spellings(tokenizer, STOP_FORM) if STOP_FORM in GATE_FORMS[forms] else ()
    unk = tokenizer.hf.unk_token_id
    if unk is not None and any(unk in s for s in keep + stop):
      raise ValueError(f"the tokenizer spells a gate form with its unknown token (id {unk}): it cannot tell "
                       f"{GATE_FORMS[forms]} from other unknown words (a toy checkpoint saved before the gated "
                       "forms joined the toy vocabulary needs the current toy tokenizer)")
    return cls(keep=keep, stop=stop, blank=blank_token_ids(tokenizer), eos=tuple(eos),
               invalid_keeps=invalid_gate == "keep")

  @property
  def forms(self) -> tuple[str, ...]:
    return (KEEP_FORM, STOP_FORM) if self.stop else (KEEP_FORM,)

  @property
  def form_tokens(self) -> int:
    """Tokens of the longest spelling of a form: a reply still decoding after this many (and its stop
    token) is writing a memory."""
    return max(len(sp) for sp in self.keep + self.stop)

  @property
  def end_tokens(self) -> tuple[int, ...]:
    """Single-token spellings: emitting one ends the memory turn's decode (no stop token needed)."""
    return tuple(sorted({s[0] for s in self.keep + self.stop if len(s) == 1}))


def _table(spellings) -> tuple[np.ndarray, np.ndarray]:
  """Spellings -> ids [S, L] padded with -1 and lengths [S] (one never-matching row when empty)."""
  width = max([len(s) for s in spellings] + [1])
  ids = np.full((max(1, len(spellings)), width), -1, np.int32)
  lengths = np.full((max(1, len(spellings)),), width + 1, np.int32)  # longer than any window: no match
  for i, s in enumerate(spellings):
    ids[i, :len(s)], lengths[i] = s, len(s)
  return ids, lengths


def _matches(content, count, spellings):
  """(exact [B], contained [B]): the content is one of the spellings / holds one as a contiguous run.
  content [B, N] left-compacted ids (-1 after count [B])."""
  ids, lengths = map(jnp.asarray, _table(spellings))  # [S, L], [S]
  b, n = content.shape
  width = ids.shape[1]
  padded = jnp.pad(content, ((0, 0), (0, width)), constant_values=-1)  # [B, N + L]
  windows = jnp.stack([padded[:, j:j + n] for j in range(width)], axis=-1)  # [B, N, L]: window at each start
  used = jnp.arange(width)[None, :] < lengths[:, None]  # [S, L]
  equal = (windows[:, None] == ids[None, :, None, :]) | ~used[None, :, None, :]  # [B, S, N, L]
  start = jnp.arange(n)[None, None, :]  # [1, 1, N]
  hit = jnp.all(equal, axis=-1) & (start + lengths[None, :, None] <= count[:, None, None])  # [B, S, N]
  exact = jnp.any(hit[:, :, 0] & (lengths[None, :] == count[:, None]), axis=1)  # [B]
  return exact, jnp.any(hit, axis=(1, 2))


def gate_codes(tokens, lengths, spec: GateSpec):
  """Each row's gate (MEMORY, KEEP, STOP or INVALID) [B] int32 from its reply tokens [B, N] and
  lengths [B]: blank and stop tokens are dropped, the rest compared with every spelling."""
  b, n = tokens.shape
  drop = jnp.asarray(spec.blank + spec.eos or (-1,), jnp.int32)
  content = (jnp.arange(n)[None, :] < lengths[:, None]) & ~jnp.any(tokens[:, :, None] == drop, axis=-1)  # [B, N]
  count = jnp.sum(content, axis=1)  # [B]
  target = jnp.where(content, jnp.cumsum(content, axis=1) - 1, n)  # left-compacted position (n: dropped)
  packed = jnp.full((b, n), -1, jnp.int32).at[jnp.arange(b)[:, None], target].set(tokens, mode="drop")  # [B, N]
  keep, keep_in = _matches(packed, count, spec.keep)
  stop, stop_in = _matches(packed, count, spec.stop) if spec.stop else (jnp.zeros((b,), bool),) * 2
  return jnp.where(keep, KEEP, jnp.where(stop, STOP, jnp.where(keep_in | stop_in, INVALID, MEMORY))).astype(jnp.int32)


def kept(gate, spec: GateSpec):
  """Rows [B] whose memory stays as it was: keep, stop, and invalid when invalid replies are dropped."""
  same = (gate == KEEP) | (gate == STOP)
  return same | (gate == INVALID) if spec.invalid_keeps else same


def strip_eos(tokens, lengths, spec: GateSpec) -> jax.Array:
  """Reply lengths [B] without a final model stop token (a form token that ended the turn stays)."""
  last = jnp.take_along_axis(tokens, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
  ends = (lengths > 0) & jnp.any(last[:, None] == jnp.asarray(spec.eos or (-1,), jnp.int32)[None, :], axis=1)
  return lengths - ends.astype(jnp.int32)
