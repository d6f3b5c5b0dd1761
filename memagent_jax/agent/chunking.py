"""Documents -> contiguous, non-overlapping token chunks, streamed so length is unbounded.

Text is read and tokenised in pieces, cut only where cutting is verified not to change the ids
(candidates: after a newline, before a word's leading space; each checked by tokenising its
neighbourhood joined and split), so streaming gives the same ids as tokenising the whole text
at once, for any tokenizer, while host memory stays bounded.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import sys
from typing import Iterable, Iterator, Sequence

import numpy as np

PIECE_CHARS = 1 << 16  # text characters tokenised at a time
READ_BYTES = 1 << 20  # file bytes read at a time
CUT_MARGIN = 64  # characters of context on each side used to verify a cut
CUT_TRIES = 16  # candidate cuts verified per window before looking further ahead
# Candidate cuts: after a single newline between non-spaces, or before " word" after a non-space.
_CANDIDATE = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")
# C0 controls and DEL, except the whitespace ones (\t \n \v \f \r = U+0009..U+000D).
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


class EmptyDocumentError(ValueError):
  """A document with no text to read."""


class ControlCharacterError(ValueError):
  """A document holds a NUL or another control character: binary data, not text."""


def check_text(piece: str, name: str, *, offset: int = 0, line: int = 1):
  """Raises ControlCharacterError naming the document, the character and its offset; tokenizers
  would otherwise encode such bytes silently (or drop them)."""
  m = _CONTROL.search(piece)
  if m:
    i = m.start()
    raise ControlCharacterError(
        f"{name} contains the control character U+{ord(piece[i]):04X} at character offset {offset + i} "
        f"(line {line + piece.count(chr(10), 0, i)}); documents must be text (tab, newline, carriage "
        "return, form feed and vertical tab are the only control characters allowed)")


def is_clean_cut(tokenizer, text: str, i: int, *, margin: int = CUT_MARGIN) -> bool:
  """True if cutting `text` at i leaves the ids around the cut unchanged (pre-tokenizers and BPE
  merges only look a few characters around a boundary, so the margin decides it)."""
  left, right = text[max(0, i - margin):i], text[i:i + margin]
  return tokenizer.encode(left + right) == tokenizer.encode(left) + tokenizer.encode(right)


def find_cut(tokenizer, text: str, *, lo: int, hi: int) -> int:
  """The last verified clean cut in [lo, hi], or -1."""
  tries = 0
  for m in reversed(list(_CANDIDATE.finditer(text, lo, min(len(text), hi + 1)))):
    i = m.start()
    if lo < i <= hi:
      if is_clean_cut(tokenizer, text, i):
        return i
      tries += 1
      if tries == CUT_TRIES:
        break
  return -1


def split_text(text: str, tokenizer, *, piece_chars: int = PIECE_CHARS, final: bool = True) -> Iterator[str]:
  """Cuts a string into pieces of about `piece_chars` at verified clean cuts, so tokenising the
  pieces gives the same ids as the whole text. Without a clean cut a piece grows (never a blind
  cut). With final=False the tail (which may continue in unread text) is yielded last, uncut."""
  start = 0
  stop = len(text) if final else len(text) - CUT_MARGIN  # cuts need context on both sides
  while stop - start > piece_chars:
    lo, hi = start + piece_chars // 2, start + piece_chars
    cut = find_cut(tokenizer, text, lo=lo, hi=hi)
    while cut < 0 and hi < stop:  # no clean boundary here: look further ahead
      lo, hi = hi, min(stop, hi + piece_chars)
      cut = find_cut(tokenizer, text, lo=lo, hi=hi)
    if cut < 0:
      break
    yield text[start:cut]
    start = cut
  if start < len(text):
    yield text[start:]


def read_text_pieces(path: str, tokenizer, *, piece_chars: int = PIECE_CHARS,
                     read_bytes: int = READ_BYTES) -> Iterator[str]:
  """Streams a UTF-8 file ('-' = stdin) as clean-cut text pieces, `read_bytes` at a time; errors name
  the file and byte."""
  decoder = codecs.getincrementaldecoder("utf-8")("strict")
  offset, pending, chars, lines = 0, "", 0, 1
  try:
    f = sys.stdin.buffer if path == "-" else open(path, "rb")
  except FileNotFoundError:
    raise FileNotFoundError(f"document not found: {path}") from None
  except IsADirectoryError:
    raise IsADirectoryError(f"document is a directory, not a text file: {path}") from None
  with contextlib.nullcontext(f) if path == "-" else f:
    while True:
      raw = f.read(read_bytes)
      held = decoder.getstate()[0]  # bytes of a character split across reads
      try:
        text = decoder.decode(raw, final=not raw)
      except UnicodeDecodeError as e:
        data = held + raw
        raise ValueError(f"{path} is not UTF-8 text (invalid byte at offset "
                         f"{offset - len(held) + e.start}: {data[e.start:e.start + 4]!r})") from None
      check_text(text, path, offset=chars, line=lines)  # before any tokenisation
      chars, lines, pending = chars + len(text), lines + text.count("\n"), pending + text
      offset += len(raw)
      if not raw:
        break
      pieces = list(split_text(pending, tokenizer, piece_chars=piece_chars, final=False))
      pending = pieces.pop() if pieces else ""
      yield from pieces
  yield from split_text(pending, tokenizer, piece_chars=piece_chars)


def token_stream(tokenizer, pieces: Iterable[str], name: str = "document") -> Iterator[np.ndarray]:
  """Token ids [n] int32 per text piece; raises EmptyDocumentError if there is no text at all and
  ControlCharacterError (before tokenising) at the first NUL or other control character."""
  return token_streams(tokenizer, [pieces], [name])[0]


class _PieceRounds:
  """Each document's next text piece as ids, tokenised a round at a time: one `encode_batch` of the next
  piece of every document that has none waiting (a batch's documents advance together, block by block),
  so the tokenizer's threads split the work. At most one piece's ids per document are held (int32), as
  when each document streamed alone; a document's error (a missing file, a control character, a word the
  tokenizer refuses) is raised by its own stream, and the other documents' pieces are kept."""

  def __init__(self, tokenizer, pieces: Sequence[Iterable[str]], names: Sequence[str]):
    self.tokenizer, self.names = tokenizer, list(names)
    self.sources = [iter(p) for p in pieces]
    if len(self.names) != len(self.sources):
      raise ValueError(f"{len(self.sources)} documents but {len(self.names)} names")
    # per document: (has text, ids [n] int32) of its next piece, or the error its stream raises next
    self.waiting: list[tuple[bool, np.ndarray] | Exception | None] = [None] * len(self.sources)
    self.ended = [False] * len(self.sources)
    self.where = [(0, 1)] * len(self.sources)  # (character offset, line) of each document's next piece

  def next_piece(self, i: int) -> tuple[bool, np.ndarray] | None:
    """Document i's next (has text, ids), or None when it has no more; raises document i's error."""
    if self.waiting[i] is None and not self.ended[i]:
      self._round()
    item, self.waiting[i] = self.waiting[i], None
    if isinstance(item, Exception):
      raise item
    return item

  def _round(self):
    texts, owners = [], []
    for j, source in enumerate(self.sources):
      if self.waiting[j] is not None or self.ended[j]:
        continue
      try:
        piece = next(source, None)
        if piece is not None:
          offset, line = self.where[j]
          check_text(piece, self.names[j], offset=offset, line=line)  # before any tokenising
          self.where[j] = (offset + len(piece), line + piece.count("\n"))
      except Exception as e:  # noqa: BLE001  (document j's own error, raised by its own stream)
        self.waiting[j], self.ended[j] = e, True
        continue
      if piece is None:
        self.ended[j] = True
        continue
      texts.append(piece)
      owners.append(j)
    for j, text, ids in zip(owners, texts, self._encode(texts), strict=True):
      self.waiting[j] = ids if isinstance(ids, Exception) else (bool(text.strip()), np.asarray(ids, np.int32))

  def _encode(self, texts: list[str]) -> list:
    """Ids of each text, in one call where the tokenizer has `encode_batch`; when the batch fails, text by
    text, so each error stays with its document."""
    if not texts:
      return []
    batch = getattr(self.tokenizer, "encode_batch", None)
    if batch is not None:
      try:
        return batch(texts)
      except Exception:  # noqa: BLE001  (found again below, for the document it belongs to)
        pass
    out = []
    for text in texts:
      try:
        out.append(self.tokenizer.encode(text))
      except Exception as e:  # noqa: BLE001
        out.append(e)
    return out


def token_streams(tokenizer, pieces: Sequence[Iterable[str]], names: Sequence[str]) -> list[Iterator[np.ndarray]]:
  """`token_stream` of several documents (their text pieces and names), tokenised together in rounds
  (`_PieceRounds`): the same ids as one document at a time."""
  rounds = _PieceRounds(tokenizer, pieces, names)

  def stream(i: int) -> Iterator[np.ndarray]:
    seen_text = False
    while (item := rounds.next_piece(i)) is not None:
      has_text, ids = item
      seen_text = seen_text or has_text
      if len(ids):
        yield ids
    if not seen_text:
      raise EmptyDocumentError(f"{rounds.names[i]} is empty: there is no text to read")

  return [stream(i) for i in range(len(rounds.sources))]


def chunk_stream(token_arrays: Iterable[np.ndarray], chunk_tokens: int) -> Iterator[np.ndarray]:
  """Re-slices a stream of ids into chunks of exactly `chunk_tokens` (the last may be short)."""
  buf = np.zeros((0,), np.int32)
  for ids in token_arrays:
    buf = np.concatenate([buf, ids])
    while len(buf) >= chunk_tokens:
      yield buf[:chunk_tokens]
      buf = buf[chunk_tokens:]
  if len(buf):
    yield buf


def text_pieces(tokenizer, document: str, *, name: str = "document", from_file: bool = False,
                read_bytes: int = READ_BYTES) -> Iterator[str]:
  """Clean-cut pieces of a document given as text (checked for control characters here, at
  once) or as a file path ('-' = stdin) when `from_file` (checked as it is read)."""
  if from_file:
    return read_text_pieces(document, tokenizer, read_bytes=read_bytes)
  if not isinstance(document, str):
    raise TypeError(f"{name} must be a str, got {type(document).__name__}")
  check_text(document, name)
  return split_text(document, tokenizer)


def document_chunks(tokenizer, document: str, *, chunk_tokens: int, name: str = "document",
                    from_file: bool = False, read_bytes: int = READ_BYTES) -> Iterator[np.ndarray]:
  """Chunks of a document given as text, or as a file path ('-' = stdin) when `from_file`."""
  return documents_chunks(tokenizer, [document], chunk_tokens=chunk_tokens, names=[name], from_files=from_file,
                          read_bytes=read_bytes)[0]


def documents_chunks(tokenizer, documents: Sequence[str], *, chunk_tokens: int, names: Sequence[str],
                     from_files: bool = False, read_bytes: int = READ_BYTES) -> list[Iterator[np.ndarray]]:
  """`document_chunks` of a batch of documents, tokenised together (`token_streams`); a text is checked
  for control characters here, at once, a file as it is read."""
  pieces = [text_pieces(tokenizer, d, name=n, from_file=from_files, read_bytes=read_bytes)
            for d, n in zip(documents, names, strict=True)]
  return [chunk_stream(ids, chunk_tokens) for ids in token_streams(tokenizer, pieces, names)]


def centre_truncate(ids: np.ndarray, max_tokens: int) -> np.ndarray:
  """First half + last half of the ids when longer than `max_tokens` (MemAgent's training cut)."""
  if len(ids) <= max_tokens:
    return ids
  head = max_tokens // 2
  return np.concatenate([ids[:head], ids[len(ids) - (max_tokens - head):]])


def pack_chunks(rows: Sequence[Sequence[np.ndarray]], *, num_steps: int, chunk_tokens: int,
                pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-row chunk lists -> padded tokens [B, K, C] and lengths [B, K] (0 = no chunk: inactive)."""
  tokens = np.full((len(rows), num_steps, chunk_tokens), pad_id, np.int32)
  lengths = np.zeros((len(rows), num_steps), np.int32)
  for b, chunks in enumerate(rows):
    if len(chunks) > num_steps:
      raise ValueError(f"row {b} has {len(chunks)} chunks for a block of {num_steps} steps")
    for k, c in enumerate(chunks):
      tokens[b, k, :len(c)] = c
      lengths[b, k] = len(c)
  return tokens, lengths
