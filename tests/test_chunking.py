"""Streamed tokenisation equals whole-text tokenisation; chunks, padding and truncation."""

import json

import numpy as np
import pytest

from memagent_jax.agent import chunking
from memagent_jax.policy.loading import load_tokenizer
from conftest import SQUAD_SAMPLE



@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


@pytest.fixture(scope="module")
def text():
  data = json.load(open(SQUAD_SAMPLE))["data"]
  paras = [p["context"] for art in data for p in art["paragraphs"]][:40]
  # Mixed separators, runs of spaces/newlines, non-ASCII, digits, a long run without spaces.
  extra = "Caf\u00e9 \u2014 na\u00efve  double  spaces\n\n\n  indented line\ttab 12345678 " + "x" * 3000
  return "\n\n".join(paras[:20]) + "\n" + extra + " \n".join(paras[20:])


def test_streamed_tokens_equal_whole_text(tok, text):
  whole = tok.encode(text)
  assert len(text) > 30000
  for piece_chars in (97, 1000, 5000):  # every size cuts this text many times
    pieces = list(chunking.split_text(text, tok, piece_chars=piece_chars))
    assert len(pieces) >= len(text) // piece_chars // 2
    assert "".join(pieces) == text  # nothing lost
    streamed = np.concatenate(list(chunking.token_stream(tok, pieces))).tolist()
    assert streamed == whole


def test_no_blind_cuts(tok):
  """Text with no clean boundary is never cut blindly: the piece grows instead."""
  text = "x" * 5000 + " tail words here"
  pieces = list(chunking.split_text(text, tok, piece_chars=1000))
  assert pieces[0].startswith("x" * 5000) and "".join(pieces) == text


def test_file_stream_matches_text(tok, text, tmp_path):
  path = tmp_path / "doc.txt"
  path.write_bytes(text.encode("utf-8"))
  pieces = list(chunking.read_text_pieces(str(path), tok, piece_chars=2000, read_bytes=777))  # multi-byte
  assert len(pieces) > 10 and "".join(pieces) == text  # characters straddle reads
  chunks = list(chunking.document_chunks(tok, str(path), chunk_tokens=300, from_file=True, read_bytes=777))
  assert all(len(c) == 300 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 300
  assert np.concatenate(chunks).tolist() == tok.encode(text)


def test_bad_utf8_offset_across_reads(tok, tmp_path):
  """The reported offset is the byte's position in the file, also when a character straddles reads."""
  data = ("ab\u00e9" * 10).encode() + b"\xff tail"  # \u00e9 is 2 bytes
  path = tmp_path / "bad.txt"
  path.write_bytes(data)
  bad_at = data.index(b"\xff")
  with pytest.raises(ValueError, match=rf"bad.txt is not UTF-8 text \(invalid byte at offset {bad_at}:"):
    list(chunking.read_text_pieces(str(path), tok, read_bytes=3))  # splits every second \u00e9
  path.write_bytes(b"abc \xc3")  # truncated 2-byte character at the end
  with pytest.raises(ValueError, match=r"invalid byte at offset 4: b'\\xc3'"):
    list(chunking.read_text_pieces(str(path), tok, read_bytes=3))


def test_clean_cut_check_rejects_merging_boundaries(tok):
  # SmolLM2 merges "\n\n" and " \n": cutting inside or right after such runs changes the ids.
  assert not chunking.is_clean_cut(tok, "a\n\nThe", 3)
  assert not chunking.is_clean_cut(tok, "a \nThe", 3)
  assert chunking.is_clean_cut(tok, "a\nThe", 2)
  assert chunking.is_clean_cut(tok, "abc def", 3)


def test_chunk_stream_and_packing():
  arrays = [np.arange(0, 5), np.arange(5, 12), np.arange(12, 13)]
  chunks = list(chunking.chunk_stream([a.astype(np.int32) for a in arrays], 4))
  assert [c.tolist() for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12]]
  tokens, lengths = chunking.pack_chunks([chunks, chunks[:1]], num_steps=5, chunk_tokens=4, pad_id=-1)
  assert tokens.shape == (2, 5, 4) and lengths.tolist() == [[4, 4, 4, 1, 0], [4, 0, 0, 0, 0]]
  assert tokens[0, 3].tolist() == [12, -1, -1, -1] and (tokens[1, 1:] == -1).all()
  with pytest.raises(ValueError, match="row 0 has 4 chunks for a block of 2 steps"):
    chunking.pack_chunks([chunks], num_steps=2, chunk_tokens=4, pad_id=0)


def test_centre_truncate():
  ids = np.arange(10)
  assert chunking.centre_truncate(ids, 20).tolist() == ids.tolist()
  assert chunking.centre_truncate(ids, 5).tolist() == [0, 1, 7, 8, 9]
  assert chunking.centre_truncate(ids, 4).tolist() == [0, 1, 8, 9]


def test_empty_document(tok):
  for blank in ("", "  \n\t "):
    with pytest.raises(chunking.EmptyDocumentError, match="my doc is empty"):
      list(chunking.document_chunks(tok, blank, chunk_tokens=10, name="my doc"))


@pytest.mark.parametrize("ch", ["\x00", "\x01", "\x08", "\x0e", "\x1b", "\x1f", "\x7f"])
def test_control_characters_are_refused_in_text(tok, ch):
  text = "line one\nline two " + ch + " tail"
  with pytest.raises(chunking.ControlCharacterError,
                     match=rf"my doc contains the control character U\+{ord(ch):04X} at character offset 18 "
                           r"\(line 2\)"):
    chunking.document_chunks(tok, text, chunk_tokens=10, name="my doc")  # raised at once, before any chunk


def test_whitespace_controls_are_allowed(tok):
  text = "a\tb\nc\rd\x0be\x0cf end"
  ids = np.concatenate(list(chunking.document_chunks(tok, text, chunk_tokens=4))).tolist()
  assert ids == tok.encode(text)


def test_control_character_in_file_names_file_and_offset(tok, tmp_path):
  """The offset counts characters of the whole file, across reads and multi-byte characters."""
  text = "caf\u00e9 words\n" * 300 + "bad\x00byte"
  path = tmp_path / "doc.txt"
  path.write_bytes(text.encode())
  at = text.index("\x00")
  with pytest.raises(chunking.ControlCharacterError,
                     match=rf"doc\.txt contains the control character U\+0000 at character offset {at} "
                           r"\(line 301\)"):
    list(chunking.document_chunks(tok, str(path), chunk_tokens=50, from_file=True, read_bytes=101))


def test_token_stream_checks_pieces_it_is_given(tok):
  with pytest.raises(chunking.ControlCharacterError,
                     match=r"doc 3 .*U\+007F at character offset 7 \(line 2\)"):
    list(chunking.token_stream(tok, ["abc\n", "def", "\x7f"], name="doc 3"))


def test_agents_name_the_document_with_a_control_character(tok):
  import memagent_jax as mj
  from memagent_jax.agent.direct import DirectReader
  policy = mj.load_policy("random:tiny-smollm2")
  agent = mj.MemAgent(policy, chunk_tokens=64, memory_tokens=16, answer_tokens=8, question_tokens=32)
  with pytest.raises(chunking.ControlCharacterError,
                     match=r"document 1 contains .*U\+0000 at character offset 4"):
    agent.answer_batch(["q?", "q?"], ["fine text", "bad \x00 text"])
  with pytest.raises(chunking.ControlCharacterError, match=r"document 0 contains .*U\+0007"):
    DirectReader(policy, answer_tokens=8).prompt_ids("q?", "ring \x07")


def test_toy_world_text_has_no_control_characters():
  """The toy generator and word tokenizer never produce what chunking refuses."""
  from memagent_jax.data import toy_tokenizer as word_tokenizer
  from memagent_jax.data import toy
  for s in toy.generate(8, num_tokens=512, seed=1):
    chunking.check_text(s["context"], "toy context")
    chunking.check_text(s["question"], "toy question")
  tok = word_tokenizer.toy_tokenizer()
  for w in word_tokenizer.vocabulary():
    chunking.check_text(w, f"toy token {w!r}")
  chunking.check_text(tok.decode(list(range(tok.vocab_size))), "decoded toy vocabulary")


def test_question_with_control_character_is_an_error():
  from memagent_jax.agent.chunking import ControlCharacterError
  from memagent_jax.agent.memagent import encode_question
  with pytest.raises(ControlCharacterError, match=r"question 3 contains the control character U\+0000"):
    encode_question(None, "what\x00 is it?", index=3, budget=16)


def test_a_batch_of_documents_is_tokenised_together_with_the_same_ids(tok, text, monkeypatch):
  """documents_chunks tokenises the next piece of every document in one encode_batch call (the agent's
  documents advance together, block by block) and gives each document's own ids and chunks."""
  docs = [text * 3, "A short document.", (text[:5000] + "\n") * 20]  # several pieces, one, several
  pieces = [list(chunking.split_text(d, tok)) for d in docs]
  assert [len(p) > 1 for p in pieces] == [True, False, True]
  batches, real = [], tok.encode_batch
  monkeypatch.setattr(tok, "encode_batch", lambda texts: batches.append(len(texts)) or real(texts))
  streams = chunking.documents_chunks(tok, docs, chunk_tokens=300, names=["a", "b", "c"])
  chunks = [[] for _ in docs]
  while any(s is not None for s in streams):  # round robin, as the agent reads a block of each row
    for i, s in enumerate(streams):
      if s is not None and (c := next(s, None)) is not None:
        chunks[i].append(c)
      elif s is not None:
        streams[i] = None
  assert batches[0] == 3 and sum(batches) == sum(len(p) for p in pieces) and len(batches) < sum(batches)
  for doc, got in zip(docs, chunks):
    assert all(len(c) == 300 for c in got[:-1]) and 0 < len(got[-1]) <= 300
    assert np.concatenate(got).tolist() == tok.encode(doc)


def test_a_batch_names_its_empty_or_binary_document(tok):
  streams = chunking.documents_chunks(tok, ["Some text.", " \n ", "More text."], chunk_tokens=8,
                                      names=["doc 0", "doc 1", "doc 2"])
  assert np.concatenate(list(streams[0])).tolist() == tok.encode("Some text.")
  with pytest.raises(chunking.EmptyDocumentError, match="doc 1 is empty"):
    list(streams[1])
  assert np.concatenate(list(streams[2])).tolist() == tok.encode("More text.")
  with pytest.raises(chunking.ControlCharacterError, match=r"doc 2 contains the control character U\+0000"):
    chunking.documents_chunks(tok, ["fine", "fine", "bad\x00"], chunk_tokens=8, names=["doc 0", "doc 1", "doc 2"])


def test_encode_batch_equals_encode_text_by_text(tok, text):
  from memagent_jax.data import toy
  from memagent_jax.data.toy_tokenizer import UnknownWordError, toy_tokenizer
  toy_tok = toy_tokenizer()
  toy_texts = [s["context"] for s in toy.generate(3, num_tokens=300, seed=0)]
  for t, texts in ((tok, [text[:3000], "", "Caf\u00e9 \u2014 x", text[5000:9000]]), (toy_tok, toy_texts)):
    assert t.encode_batch(texts) == [t.encode(x) for x in texts]
    assert t.encode_batch([]) == []
  with pytest.raises(UnknownWordError, match="zebraxylophone"):
    toy_tok.encode_batch([toy_texts[0], "zebraxylophone " + toy_texts[0]])


def test_a_batch_of_files_keeps_each_documents_error_in_its_own_stream(tok, text, tmp_path):
  """A control character in a later piece of one file is raised by that file's stream (its name, offset
  and line across reads), while the other files, read round robin beside it, give all their ids."""
  bad = text * 3 + "bad\x00byte " + text[:5000]  # the NUL after the first 64K-character piece
  docs = [text[:30000], bad, text * 2]
  paths = []
  for i, d in enumerate(docs):
    paths.append(tmp_path / f"doc{i}.txt")
    paths[-1].write_bytes(d.encode())
  streams = chunking.documents_chunks(tok, [str(p) for p in paths], chunk_tokens=200, names=[str(p) for p in paths],
                                      from_files=True, read_bytes=4096)
  chunks, errors = [[] for _ in docs], {}
  while any(s is not None for s in streams):
    for i, s in enumerate(streams):
      if s is None:
        continue
      try:
        chunks[i].append(next(s))
      except StopIteration:
        streams[i] = None
      except chunking.ControlCharacterError as e:
        errors[i], streams[i] = str(e), None
  at = bad.index("\x00")
  assert list(errors) == [1] and errors[1].startswith(f"{paths[1]} contains the control character U+0000 at "
                                                      f"character offset {at} (line {bad[:at].count(chr(10)) + 1})")
  assert len(chunks[1]) > 5  # its earlier pieces were read before the error
  for i in (0, 2):
    assert np.concatenate(chunks[i]).tolist() == tok.encode(docs[i])
