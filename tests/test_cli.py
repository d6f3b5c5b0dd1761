"""The `memagent` command line: answer (file and stdin), eval, and clear errors on bad input."""

import io
import json
import re
import sys

import pytest

from memagent_jax import cli

def fails(capsys, argv, code=2) -> str:
  """Runs the CLI expecting the one-line error form; returns that line."""
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == code and err and err[-1].startswith("memagent: error: "), err
  return err[-1]


TINY = ["--question", "What?", "--model", "random:tiny-smollm2", "--chunk-tokens", "64", "--memory-tokens", "8",
        "--answer-tokens", "6", "--quiet"]


@pytest.mark.slow
def test_answer_on_bundled_document_with_the_embedded_model(capsys):
  cli.main(["answer", "--doc", "experiments/data/demo_document.txt", "--chunk-tokens", "700",
            "--memory-tokens", "16", "--answer-tokens", "8", "--show-memory", "--quiet",
            "--question", "What sits on top of the Main Building at Notre Dame?"])
  cap = capsys.readouterr()
  assert cap.out.count("--- memory after chunk ") == 2  # 1387 tokens / 700: a memory carried into chunk 2
  assert "\nQ: What sits on top" in cap.out and len(cap.out.split("\nA: ")[1].strip()) > 0
  assert "1387 document tokens, 2 chunks" in cap.err


def test_answer_reads_stdin(capsys, monkeypatch):
  text = "The grass is green. The sky is blue. " * 40
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
  cli.main(["answer", "--doc", "-", "--show-memory"] + TINY)
  cap = capsys.readouterr()
  n_chunks = int(cap.err.split(" chunks")[0].rsplit(" ", 1)[1])
  assert n_chunks >= 5 and cap.out.count("--- memory after chunk ") == n_chunks


def test_missing_document(capsys):
  line = fails(capsys, ["answer", "--doc", "/no/such/file.txt"] + TINY)
  assert "document not found: /no/such/file.txt" in line


def test_non_utf8_document(tmp_path, capsys):
  bad = tmp_path / "latin1.txt"
  bad.write_bytes("caf\xe9 au lait".encode("latin-1"))
  assert re.search(r"latin1.txt is not UTF-8 text \(invalid byte at offset 3",
                   fails(capsys, ["answer", "--doc", str(bad)] + TINY))


def test_empty_document(tmp_path, capsys):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n")
  assert "empty.txt is empty: there is no text to read" in fails(capsys, ["answer", "--doc", str(empty)] + TINY)


def test_direct_reading_over_the_context_window(tmp_path, capsys):
  long_doc = tmp_path / "long.txt"
  long_doc.write_text("The library has fourteen stories. " * 1500)  # about 10K tokens > 8192
  line = fails(capsys, ["answer", "--doc", str(long_doc), "--method", "direct", "--question", "Q?",
                        "--model", "random:tiny-smollm2", "--answer-tokens", "64"])
  assert re.search(r"long.txt has \d+ tokens but only \d+ fit the context window of 8192 tokens", line)


def test_chunk_and_memory_over_the_context_window(tmp_path, capsys):
  doc = tmp_path / "d.txt"
  doc.write_text("Some text.")
  line = fails(capsys, ["answer", "--doc", str(doc), "--question", "Q?", "--model", "random:tiny-smollm2",
                        "--chunk-tokens", "7000"])
  assert re.search(r"memory update needs \d+ tokens \(template \d+ \+ question \d+ \+ memory 1024 \+ "
                   r"chunk 7000 \+ generation cap 1024\)", line)


def test_flags_that_would_do_nothing_are_errors(tmp_path, capsys):
  doc = tmp_path / "d.txt"
  doc.write_text("Some text.")
  assert "--chunk-tokens has no effect with --method direct" in fails(
      capsys, ["answer", "--doc", str(doc), "--method", "direct"] + TINY)
  assert "--truncate applies to --method direct only" in fails(
      capsys, ["answer", "--doc", str(doc), "--truncate"] + TINY)


def test_eval_writes_every_prediction(tmp_path, capsys):
  out = tmp_path / "preds.jsonl"
  cli.main(["eval", "--task", "niah_single_1", "--length", "300", "--n", "3", "--batch-size", "2",
            "--out", str(out)] + TINY[2:])
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert len(rows) == 3 and summary["n"] == 3 and summary["task"] == "niah_single_1"
  assert not (tmp_path / "preds.jsonl.partial").exists()
  assert summary["score"] == pytest.approx(sum(r["score"] for r in rows) / 3)
  assert 250 < summary["mean_document_tokens"] <= 300
  for r in rows:
    assert r["answers"] and r["question"] and r["num_chunks"] >= 4 and 250 < r["document_tokens"] <= 300
