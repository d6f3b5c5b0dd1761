"""CLI reliability: one-line errors (exit 2, 1 for bugs), validated sizes, outputs that are never
truncated, `.partial` results kept on failure or Ctrl-C, and Ctrl-C that stops at once (exit 130)."""

import functools
import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from memagent_jax import cli, evaluation
from memagent_jax.runtime import checkpointing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--question", "What?", "--model", "random:tiny-smollm2", "--chunk-tokens", "64",
        "--memory-tokens", "8", "--answer-tokens", "6", "--quiet"]
HF_CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=64,
                 intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)


GREEDY_EVAL = dict(sampling=evaluation.Sampling(), progress=False)


def fails(capsys, argv, code=2, commands=None) -> str:
  """Runs the CLI in-process expecting exactly one error line on stderr; returns it."""
  with pytest.raises(SystemExit) as e:
    cli.main(argv, commands=commands)
  err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[memagent]")]
  assert e.value.code == code, err
  assert len(err) == 1 and "Traceback" not in err[0], err
  return err[0]


def run_cli(*argv, timeout=120):
  env = {**os.environ, "PYTHONPATH": REPO}
  return subprocess.run([sys.executable, "-m", "memagent_jax.cli", *argv], capture_output=True,
                        stdin=subprocess.DEVNULL, text=True, timeout=timeout, cwd=REPO, env=env)


@pytest.fixture
def doc(tmp_path):
  path = tmp_path / "d.txt"
  path.write_text("The grass is green. The sky is blue. " * 20)
  return str(path)


def bad_model(tmp_path, kind: str) -> str:
  if kind == "missing":
    return str(tmp_path / "no" / "such" / "model")
  if kind == "empty dir":
    (tmp_path / "empty").mkdir()
    return str(tmp_path / "empty")
  if kind == "corrupt safetensors":
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HF_CONFIG))
    (d / "model.safetensors").write_bytes(os.urandom(300))
    return str(d)
  if kind == "corrupt gguf":
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + os.urandom(300))
    return str(tmp_path / "m.gguf")
  return "random:no-such-preset"


@pytest.mark.parametrize("kind, expected", [
    ("missing", "model source not found: "), ("empty dir", "has no config.json"),
    ("corrupt safetensors", "model.safetensors: corrupt safetensors file"),
    ("corrupt gguf", "m.gguf: corrupt or unreadable GGUF file"),
    ("unknown preset", "unknown model preset 'no-such-preset'; known presets: ")])
def test_bad_model_is_one_line(tmp_path, capsys, doc, kind, expected):
  model = bad_model(tmp_path, kind)
  line = fails(capsys, ["answer", "--doc", doc, "--question", "Q?", "--model", model])
  assert line.startswith("memagent: error: ") and expected in line
  out = tmp_path / "preds.jsonl"
  line = fails(capsys, ["eval", "--task", "niah_single_1", "--length", "300", "--n", "2", "--model", model,
                        "--out", str(out)])
  assert expected in line and not out.exists()


def test_missing_doc_and_unknown_task(capsys, tmp_path):
  assert "document not found: /no/such/doc.txt" in fails(capsys, ["answer", "--doc", "/no/such/doc.txt"] + TINY)
  line = fails(capsys, ["eval", "--task", "nope", "--length", "300", "--out", str(tmp_path / "o.jsonl")]
               + TINY[2:])
  assert "unknown task 'nope'; known: " in line


A = ["answer", "--doc", "d", "--question", "q"]
E = ["eval", "--task", "t", "--length", "300"]


@pytest.mark.parametrize("argv, expected", [
    (E + ["--n", "0"], "--n: must be an integer in [1, 2147483647], got 0"),
    (E + ["--n", "-3"], "--n: must be an integer in [1, 2147483647], got -3"),
    (["eval", "--task", "t", "--length", "0"], "--length: must be an integer in [1, 2147483647], got 0"),
    (E + ["--batch-size", "x"], "--batch-size: must be an integer in"),
    (A + ["--chunk-tokens", "-1"], "--chunk-tokens: must be an integer"),
    (A + ["--memory-tokens", "0"], "--memory-tokens: must be an integer"),
    (A + ["--answer-tokens", "0"], "--answer-tokens: must be an integer"),
    (A + ["--block-chunks", "0"], "--block-chunks: must be an integer"),
    (A + ["--top-p", "0"], "--top-p: must be a finite number in (0, 1], got 0"),
    (A + ["--top-p", "1.5"], "--top-p: must be a finite number in (0, 1]"),
    (A + ["--temperature", "nan"], "--temperature: must be a finite number >= 0, got nan"),
    (A + ["--temperature", "-0.5"], "--temperature: must be a finite"),
    (["export", "--ckpt", "c", "--out", "o", "--step", "-1"], "--step: must be an integer in [0, "),
    (["answer", "--doc", "d"], "the following arguments are required: --question")])
def test_flag_values_are_validated(capsys, argv, expected):
  line = fails(capsys, argv)
  assert line.startswith("memagent: error: ") and expected in line


def test_debug_shows_the_traceback(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["answer", "--doc", "/no/such/doc.txt", "--debug"] + TINY)
  err = capsys.readouterr().err
  assert e.value.code == 2 and "Traceback (most recent call last)" in err
  assert err.strip().splitlines()[-1] == "memagent: error: document not found: /no/such/doc.txt"


def test_internal_error_exit_1(capsys, doc):
  def boom(args):
    raise RuntimeError("something\nbroke")
  with pytest.raises(SystemExit) as e:
    cli.main(["answer", "--doc", doc] + TINY, commands={"answer": boom})
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 1 and err == ["memagent: internal error: RuntimeError: something broke "
                                       "(run with --debug for the traceback)"]


def test_export_errors_are_one_line(capsys, tmp_path):
  from test_checkpointing import _data_files, make_state
  line = fails(capsys, ["export", "--ckpt", str(tmp_path / "nope"), "--out", str(tmp_path / "hf")])
  assert line == f"memagent: error: checkpoint directory not found: {tmp_path / 'nope'}"
  _, state, meta = make_state()
  with checkpointing.Checkpointer(tmp_path) as c:
    c.save(2, state, meta)
  for f in _data_files(tmp_path / "2"):  # a damaged step: its arrays cut in half
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("{}")  # an earlier export: kept on failure
  line = fails(capsys, ["export", "--ckpt", str(tmp_path), "--out", str(tmp_path / "hf")])
  assert line.startswith(f"memagent: error: checkpoint {tmp_path / '2'} could not be read")
  assert (tmp_path / "hf" / "config.json").read_text() == "{}"
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("x")
  assert "non-empty directory without config.json" in fails(
      capsys, ["export", "--ckpt", str(tmp_path), "--out", str(tmp_path / "mine")])


def test_no_traceback_through_the_real_entry_point(tmp_path):
  """The process as a user runs it: one stderr line, exit code 2."""
  r = run_cli("answer", "--doc", "-", "--question", "q", "--model", bad_model(tmp_path, "corrupt gguf"))
  assert r.returncode == 2 and r.stderr.startswith("memagent: error: ") and r.stderr.count("\n") == 1, r.stderr
  r = run_cli("eval", "--task", "niah_single_1", "--length", "300", "--n", "0")
  assert r.returncode == 2 and r.stderr == ("memagent: error: argument --n: must be an integer in "
                                            "[1, 2147483647], got 0 (see `memagent eval --help`)\n")


# --- eval outputs -----------------------------------------------------------------------

def samples(n=5):
  return [{"question": f"q{i}?", "context": f"doc {i}", "answers": [f"a{i}"], "index": i} for i in range(n)]


class StubReader:
  """answer_batch answers every question right; raises `fail` on call number `fail_at`."""

  def __init__(self, fail_at=None, fail=KeyboardInterrupt):
    self.calls, self.fail_at, self.fail = 0, fail_at, fail

  def answer_batch(self, questions, documents, **kw):
    self.calls += 1
    if self.calls == self.fail_at:
      raise self.fail("stopped")
    return [types.SimpleNamespace(prediction=f"a{q[1:-1]}", answer=f"\\boxed{{a{q[1:-1]}}}", boxed=None,
                                  num_chunks=1, document_tokens=2, memories=["m"], decoded_tokens=3,
                                  seconds=0.0) for q in questions]


@pytest.mark.parametrize("fail", [KeyboardInterrupt, ValueError])
def test_interrupted_eval_keeps_finished_batches(tmp_path, fail):
  out = tmp_path / "preds.jsonl"
  out.write_text("earlier results\n")
  with pytest.raises(fail):
    evaluation.run_eval(StubReader(fail_at=2, fail=fail), "squad", samples(), str(out), batch_size=2,
                        **GREEDY_EVAL)
  assert out.read_text() == "earlier results\n"  # never truncated
  rows = [json.loads(line) for line in (tmp_path / "preds.jsonl.partial").read_text().splitlines()]
  assert [r["index"] for r in rows] == [0, 1] and all(r["score"] == 1.0 for r in rows)
  summary = evaluation.run_eval(StubReader(), "squad", samples(), str(out), batch_size=2, **GREEDY_EVAL)
  assert summary["n"] == 5 and summary["score"] == 1.0
  assert len(out.read_text().splitlines()) == 5 and not (tmp_path / "preds.jsonl.partial").exists()


def test_run_eval_rejects_empty_input(tmp_path):
  with pytest.raises(ValueError, match="no samples to evaluate: n must be >= 1"):
    evaluation.run_eval(StubReader(), "squad", [], str(tmp_path / "o.jsonl"), batch_size=2, **GREEDY_EVAL)
  with pytest.raises(ValueError, match="batch_size=0: must be >= 1"):
    evaluation.run_eval(StubReader(), "squad", samples(), None, batch_size=0, **GREEDY_EVAL)
  assert not os.listdir(tmp_path)


def _eval(**kw):
  """`memagent eval` with its samples or reader from the test."""
  return {"eval": functools.partial(cli.cmd_eval, **kw)}


def test_failed_cli_eval_leaves_existing_out_untouched(tmp_path, capsys):
  out = tmp_path / "preds.jsonl"
  out.write_bytes(b'{"earlier": 1}\n')
  line = fails(capsys, ["eval", "--task", "niah_single_1", "--length", "300", "--n", "2", "--out", str(out)]
               + TINY[2:], commands=_eval(make_reader=lambda args, policy: StubReader(fail_at=1, fail=ValueError)))
  assert line == "memagent: error: stopped" and out.read_bytes() == b'{"earlier": 1}\n'


def test_default_eval_output_goes_under_runs(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  stubs = _eval(make_reader=lambda args, policy: StubReader(), make_samples=lambda *a, **k: samples(3))
  assert cli.main(["eval", "--task", "squad", "--length", "300", "--n", "3"] + TINY[2:], commands=stubs) == 0
  expected = os.path.join("runs", "eval", "eval_squad_300_memagent.jsonl")
  assert json.loads(capsys.readouterr().out.splitlines()[-1])["predictions"] == expected
  assert os.listdir(tmp_path) == ["runs"]
  assert os.listdir(tmp_path / "runs" / "eval") == [os.path.basename(expected)]
  assert len((tmp_path / expected).read_text().splitlines()) == 3


# --- Ctrl-C -------------------------------------------------------------------------------

def test_ctrl_c_stops_answer_at_once(tmp_path):
  """SIGINT while the worker is inside compiled code: exit 130 well within 2 s (measured)."""
  from memagent_jax.data import toy
  s = toy.generate(1, 12000, 0)[0]  # toy-word text: random:toy-tiny has its tokenizer
  (tmp_path / "d.txt").write_text(s["context"])
  cmd = [sys.executable, "-m", "memagent_jax.cli", "answer", "--doc", str(tmp_path / "d.txt"),
         "--question", s["question"], "--model", "random:toy-tiny", "--chunk-tokens", "32",
         "--memory-tokens", "8", "--answer-tokens", "8", "--block-chunks", "64", "--quiet"]
  # as from a terminal: SIGINT handled even when this suite runs as a background job, whose children
  # inherit SIGINT ignored (then Python installs no KeyboardInterrupt handler at all). A handled
  # signal is reset to its default in an exec'd child; no preexec_fn (fork in a threaded process).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO})
  finally:
    signal.signal(signal.SIGINT, previous)
  try:
    line = p.stderr.readline()
    assert line.startswith("[memagent] loaded"), line + p.stderr.read()
    time.sleep(1.0)  # compiling / running the memory recurrence now (a full run takes > 5 s)
    assert p.poll() is None
    p.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out, err = p.communicate(timeout=30)
    elapsed = time.monotonic() - t0
  finally:
    if p.poll() is None:
      p.kill()
  assert p.returncode == 130 and err.strip().splitlines()[-1] == "memagent: interrupted", err
  assert "Traceback" not in err and out == ""
  assert elapsed < 2.0, f"took {elapsed:.2f}s to stop after SIGINT"


def test_installed_cli_runs_outside_the_repository(tmp_path):
  """The console script's defaults come from configs/base.py, which is installed with the package:
  `memagent` works from any directory, without the repository on PYTHONPATH."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  out = subprocess.run([sys.executable, "-m", "memagent_jax.cli", "answer", "--help"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=env)
  assert out.returncode == 0, out.stderr
  assert "(default 5000)" in out.stdout and "(default 1024)" in out.stdout  # configs/base.py agent section


def test_run_eval_split_over_processes_writes_no_jsonl(tmp_path):
  """A split evaluation's lines live on their processes, so it refuses an output file; in one
  process it reads every row of each batch with its row id, and scores as the plain run does."""
  with pytest.raises(ValueError, match="split over processes writes no JSONL"):
    evaluation.run_eval(StubReader(), "squad", samples(), str(tmp_path / "o.jsonl"), batch_size=2,
                        split_over_processes=True, **GREEDY_EVAL)
  seen = []

  class RowIds(StubReader):
    def answer_batch(self, questions, documents, **kw):
      seen.append(list(kw["row_ids"]))
      return super().answer_batch(questions, documents)

  split = evaluation.run_eval(RowIds(), "squad", samples(), None, batch_size=2, split_over_processes=True,
                              **GREEDY_EVAL)
  plain = evaluation.run_eval(StubReader(), "squad", samples(), None, batch_size=2, **GREEDY_EVAL)
  assert seen == [[0, 1], [0, 1], [0]]  # each row's place in its batch: its sampling key
  assert {k: v for k, v in split.items() if k != "seconds"} == {k: v for k, v in plain.items() if k != "seconds"}
  assert not os.listdir(tmp_path)
