"""Streamed tokenisation equals whole-text tokenisation; chunks, padding and truncation."""

import json
import os

import numpy as np
import pytest

from memagent_jax.agent import chunking
from memagent_jax.models.loading import load_tokenizer

SQUAD = os.path.join(os.path.dirname(__file__), "data", "squad_sample", "train-v1.1.json")


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


@pytest.fixture(scope="module")
def text():
  data = json.load(open(SQUAD))["data"]
  paras = [p["context"] for art in data for p in art["paragraphs"]][:40]
  # Mixed separators, runs of spaces/newlines, non-ASCII, digits, a long run without spaces.
  extra = "Caf\u00e9 \u2014 na\u00efve  double  spaces\n\n\n  indented line\ttab 12345678 " + "x" * 3000
  return "\n\n".join(paras[:20]) + "\n" + extra + " \n".join(paras[20:])


def test_streamed_tokens_equal_whole_text(tok, text):
  whole = tok.encode(text)
  for piece_chars in (97, 1000, 1 << 16):
    pieces = list(chunking.split_text(text, piece_chars))
    assert "".join(pieces) == text  # nothing lost
    assert max(len(p) for p in pieces) <= piece_chars
    streamed = np.concatenate(list(chunking.token_stream(tok, pieces))).tolist()
    if piece_chars > 3001:  # the 3000-char run without spaces forces a hard cut below that
      assert streamed == whole


def test_file_stream_matches_text(tok, text, tmp_path, monkeypatch):
  path = tmp_path / "doc.txt"
  path.write_bytes(text.encode("utf-8"))
  monkeypatch.setattr(chunking, "READ_BYTES", 777)  # multi-byte characters straddle reads
  pieces = list(chunking.read_text_pieces(str(path), piece_chars=5000))
  assert len(pieces) > 3 and "".join(pieces) == text
  chunks = list(chunking.document_chunks(tok, str(path), 300, from_file=True))
  assert all(len(c) == 300 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 300
  assert np.concatenate(chunks).tolist() == tok.encode(text)


def test_safe_cut_finds_pretokenizer_boundaries():
  s = "aaaa bbb ccc\nddd  eee"
  assert chunking._safe_cut(s, len(s)) == 13  # after the newline
  assert chunking._safe_cut("aaaa bbb\n\nddd  eee", 18) == 10  # after a newline run
  assert chunking._safe_cut("aa bb\ncc" + "d" * 20, 29) == 0  # only cuts in the last half
  s = "aaa bbb ccc"
  assert chunking._safe_cut(s, len(s)) == 7  # before " ccc"
  assert chunking._safe_cut("a" * 50, 50) == 0  # none: caller hard-cuts


def test_supports_streaming(tok):
  assert chunking.supports_streaming(tok)

  class PrefixSpace:  # a SentencePiece-like tokenizer that prepends a space to every call
    def encode(self, t):
      return [ord(c) for c in " " + t]
  assert not chunking.supports_streaming(PrefixSpace())


def test_chunk_stream_and_packing():
  arrays = [np.arange(0, 5), np.arange(5, 12), np.arange(12, 13)]
  chunks = list(chunking.chunk_stream([a.astype(np.int32) for a in arrays], 4))
  assert [c.tolist() for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12]]
  tokens, lengths = chunking.pack_chunks([chunks, chunks[:1]], 5, 4, pad_id=-1)
  assert tokens.shape == (2, 5, 4) and lengths.tolist() == [[4, 4, 4, 1, 0], [4, 0, 0, 0, 0]]
  assert tokens[0, 3].tolist() == [12, -1, -1, -1] and (tokens[1, 1:] == -1).all()
  with pytest.raises(ValueError, match="row 0 has 4 chunks for a block of 2 steps"):
    chunking.pack_chunks([chunks], 2, 4, 0)


def test_centre_truncate():
  ids = np.arange(10)
  assert chunking.centre_truncate(ids, 20).tolist() == ids.tolist()
  assert chunking.centre_truncate(ids, 5).tolist() == [0, 1, 7, 8, 9]
  assert chunking.centre_truncate(ids, 4).tolist() == [0, 1, 8, 9]


def test_empty_document(tok):
  with pytest.raises(chunking.EmptyDocumentError, match="my doc is empty"):
    list(chunking.document_chunks(tok, "  \n\t ", 10, name="my doc"))
