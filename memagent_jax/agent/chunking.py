"""Documents -> contiguous, non-overlapping token chunks, streamed so length is unbounded.

Text is read and tokenised in pieces cut where a byte-level BPE tokenizer has a token boundary
anyway (before a word's leading space, after a newline), so streaming gives the same ids as
tokenising the whole text at once (tested), while host memory stays bounded.
"""

from __future__ import annotations

import codecs
import contextlib
import sys
from typing import Iterable, Iterator, Sequence

import numpy as np

PIECE_CHARS = 1 << 16  # text characters tokenised at a time
READ_BYTES = 1 << 20  # file bytes read at a time


class EmptyDocumentError(ValueError):
  """A document with no text to read."""


def _safe_cut(text: str, limit: int) -> int:
  """An index <= limit where the tokenizer's pre-tokenizer splits anyway; 0 if none found."""
  floor = limit // 2
  i = text.rfind("\n", floor, limit)
  while i != -1 and i + 1 < len(text) and text[i + 1].isspace():
    i = text.rfind("\n", floor, i)
  if i != -1 and i + 1 < len(text):
    return i + 1
  i = text.rfind(" ", floor, limit)
  while i > 0 and (text[i - 1].isspace() or i + 1 >= len(text) or text[i + 1].isspace()):
    i = text.rfind(" ", floor, i)
  return max(i, 0)


def split_text(text: str, piece_chars: int = PIECE_CHARS) -> Iterator[str]:
  """Cuts a string into pieces of about `piece_chars` at tokenizer-safe boundaries."""
  start = 0
  while len(text) - start > piece_chars:
    window = text[start:start + piece_chars + 1]
    cut = _safe_cut(window, piece_chars) or piece_chars  # no safe boundary: hard cut, nothing lost
    yield window[:cut]
    start += cut
  if start < len(text):
    yield text[start:]


def read_text_pieces(path: str, piece_chars: int = PIECE_CHARS) -> Iterator[str]:
  """Streams a UTF-8 file ('-' = stdin) as text pieces; errors name the file and the byte offset."""
  decoder = codecs.getincrementaldecoder("utf-8")("strict")
  offset, pending = 0, ""
  try:
    f = sys.stdin.buffer if path == "-" else open(path, "rb")
  except FileNotFoundError:
    raise FileNotFoundError(f"document not found: {path}") from None
  except IsADirectoryError:
    raise IsADirectoryError(f"document is a directory, not a text file: {path}") from None
  with contextlib.nullcontext(f) if path == "-" else f:
    while True:
      raw = f.read(READ_BYTES)
      try:
        pending += decoder.decode(raw, final=not raw)
      except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (invalid byte at offset {offset + e.start}: "
                         f"{raw[e.start:e.start + 4]!r})") from None
      offset += len(raw)
      if not raw:
        break
      pieces = list(split_text(pending, piece_chars))
      pending = pieces.pop() if pieces else ""
      yield from pieces
  yield from split_text(pending, piece_chars)


def supports_streaming(tokenizer) -> bool:
  """True if tokenising at our cut points gives the same ids as tokenising the whole text."""
  probe = "Alpha beta.\nGamma delta epsilon"
  parts = ["Alpha", " beta.\n", "Gamma", " delta", " epsilon"]
  return tokenizer.encode(probe) == [t for p in parts for t in tokenizer.encode(p)]


def token_stream(tokenizer, pieces: Iterable[str], name: str = "document") -> Iterator[np.ndarray]:
  """Token ids [n] int32 per text piece; raises EmptyDocumentError if there is no text at all."""
  seen_text = False
  for piece in pieces:
    seen_text = seen_text or not piece.isspace()
    ids = tokenizer.encode(piece)
    if ids:
      yield np.asarray(ids, np.int32)
  if not seen_text:
    raise EmptyDocumentError(f"{name} is empty: there is no text to read")


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


def document_chunks(tokenizer, document: str, chunk_tokens: int, name: str = "document",
                    from_file: bool = False) -> Iterator[np.ndarray]:
  """Chunks of a document given as text, or as a file path when `from_file`."""
  if from_file:
    pieces = read_text_pieces(document)
  elif supports_streaming(tokenizer):
    pieces = split_text(document)
  else:
    pieces = [document]
  if from_file and not supports_streaming(tokenizer):
    pieces = ["".join(pieces)]
  return chunk_stream(token_stream(tokenizer, pieces, name), chunk_tokens)


def centre_truncate(ids: np.ndarray, max_tokens: int) -> np.ndarray:
  """First half + last half of the ids when longer than `max_tokens` (MemAgent's training cut)."""
  if len(ids) <= max_tokens:
    return ids
  head = max_tokens // 2
  return np.concatenate([ids[:head], ids[len(ids) - (max_tokens - head):]])


def pack_chunks(rows: Sequence[Sequence[np.ndarray]], num_steps: int, chunk_tokens: int,
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
