"""The `memagent` command line: the demo path end to end, and clear errors on bad documents."""

import pytest

from memagent_jax import cli


def test_answer_on_bundled_document(capsys):
  cli.main(["answer", "--doc", "experiments/data/demo_document.txt", "--question",
            "What sits on top of the Main Building at Notre Dame?", "--max-new-tokens", "24"])
  out = capsys.readouterr().out
  assert out.startswith("Q: What sits on top") and "\nA: " in out and len(out.split("\nA: ")[1].strip()) > 0


def test_missing_document():
  with pytest.raises(SystemExit, match="document not found: /no/such/file.txt"):
    cli.main(["answer", "--doc", "/no/such/file.txt"])


def test_non_utf8_document(tmp_path):
  bad = tmp_path / "latin1.txt"
  bad.write_bytes("caf\xe9 au lait".encode("latin-1"))
  with pytest.raises(SystemExit, match=r"latin1.txt is not UTF-8 text \(byte 3"):
    cli.main(["answer", "--doc", str(bad)])


def test_document_over_the_context_window(tmp_path):
  long_doc = tmp_path / "long.txt"
  long_doc.write_text("The library has fourteen stories. " * 1500)  # about 10K tokens > 8192
  with pytest.raises(SystemExit, match=r"long.txt: prompt of \d+ tokens \+ max_new_tokens=64 exceeds "
                                       r"the model's context window of 8192 tokens"):
    cli.main(["answer", "--doc", str(long_doc)])
