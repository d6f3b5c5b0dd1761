"""Training on your own data: the JSONL task (tests/data/own_qa), every malformed line refused with file,
line and field, padding as longqa pads HotpotQA, a 2-step training that evaluates the held-out file, and
`memagent eval --task jsonl`."""

import json
import os
import re

import pytest

from configs import own_data
from memagent_jax import cli
from memagent_jax.data import jsonl_qa, longqa, tasks
from memagent_jax.experiment import assembly

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "data", "own_qa", "train.jsonl")
DEV = os.path.join(HERE, "data", "own_qa", "dev.jsonl")
DOC_RE = re.compile(r"(?:^|\n\n)Document (\d+):\n")


class WordCount:
  """A stand-in tokenizer: one token a whitespace-separated word (only counts matter to the data)."""

  def encode(self, text):
    return text.split()


def _lines(path):
  return [json.loads(line) for line in open(path)]


def test_example_files_load_whole():
  train, dev = jsonl_qa.load_jsonl(TRAIN), jsonl_qa.load_jsonl(DEV)
  raw = _lines(TRAIN)
  assert len(raw) == len(train) == 10 and len(dev) == 5
  assert [ex.id for ex in train.examples] == [r["id"] for r in raw]
  assert [ex.answers for ex in train.examples] == [tuple(r["answers"]) for r in raw]
  assert train.padded == tuple("documents" in r for r in raw) and 0 < sum(train.padded) < 10
  assert list(train.pool) == [d for r in raw for d in r.get("documents", [])]  # all distinct, in file order
  assert not {r["question"] for r in raw} & {ex.question for ex in dev.examples}  # held out


def test_samples_pad_documents_as_hotpotqa_and_keep_contexts():
  corpus = jsonl_qa.load_jsonl(TRAIN)
  samples = tasks.make_samples("jsonl", 120, 10, 3, WordCount(), TRAIN, chunk_tokens=64)
  per_doc = sum(len(p.split()) for p in corpus.pool) / len(corpus.pool)
  num_docs = round(120 / (per_doc + 5))
  assert 2 < num_docs < len(corpus.pool)
  by_id = {ex.id: (ex, pad) for ex, pad in zip(corpus.examples, corpus.padded)}
  assert sorted(s["id"] for s in samples) == sorted(by_id)
  padded = [s for s in samples if by_id[s["id"]][1]]
  for s in samples:
    ex, pad = by_id[s["id"]]
    assert s["question"] == ex.question and s["answers"] == list(ex.answers)
    if not pad:  # a context is the document, as given
      assert s["context"] == ex.paragraphs[0] and "Document 1:" not in s["context"]
      continue
    parts = DOC_RE.split(s["context"])
    nums, docs = [int(n) for n in parts[1::2]], parts[2::2]
    assert parts[0] == "" and nums == list(range(1, num_docs + 1)) and s["num_docs"] == num_docs
    assert set(ex.paragraphs) <= set(docs) <= set(corpus.pool) and len(set(docs)) == num_docs
  # the padding is longqa's own: the same question, index and seed give HotpotQA's sample
  s = padded[0]
  ex = by_id[s["id"]][0]
  assert s == longqa.padded_sample(ex, s["index"], num_docs, 3, list(corpus.pool), frozenset(corpus.pool))
  assert samples == tasks.make_samples("jsonl", 120, 10, 3, WordCount(), TRAIN, chunk_tokens=64)  # seeded


BAD_LINES = [  # (line 2 of a file, the error after "<path>:2: ")
    ('{"question": "Q?", "answers": "x", "context": "c"}', 'field "answers" must be a list of strings, got str'),
    ('{"question": "Q?", "answers": [], "context": "c"}', 'field "answers" is an empty list'),
    ('{"question": "Q?", "answers": ["a", 3], "context": "c"}', 'field "answers" item 1 must be a non-empty string, got int'),
    ('{"answers": ["a"], "context": "c"}', 'field "question" is missing'),
    ('{"question": "", "answers": ["a"], "context": "c"}', 'field "question" must be a non-empty string, got an empty string'),
    ('{"question": "Q?", "answers": ["a"]}', 'give either field "context"'),
    ('{"question": "Q?", "answers": ["a"], "context": "c", "documents": ["d"]}', 'fields "context" and "documents" are both given'),
    ('{"question": "Q?", "answers": ["a"], "documents": "d"}', 'field "documents" must be a list of strings, got str'),
    ('{"question": "Q?", "answers": ["a"], "context": ["c"]}', 'field "context" must be a non-empty string, got list'),
    ('{"question": "Q?", "answer": ["a"], "context": "c"}', 'unknown field "answer"'),
    ('{"question": "Q?", "answers": ["a"], "context": "c", "id": 1.5}', 'field "id" must be a string or an integer, got float'),
    ('{"question": "Q?", "answers": ["a"], "context": "c", "id": "one"}', "field \"id\" 'one' was already used on line 1"),
    ('{"question": "Q?", "answers": ["a"], "context": "c"', "not valid JSON"),
    ('["Q?", ["a"], "c"]', "a line must be a JSON object, got list"),
]


@pytest.mark.parametrize("line,error", BAD_LINES)
def test_a_malformed_line_is_refused_naming_file_line_and_field(tmp_path, line, error):
  path = tmp_path / "mine.jsonl"
  path.write_text('{"id": "one", "question": "Q1?", "answers": ["a"], "context": "c1"}\n' + line + "\n"
                  + '{"question": "Q3?", "answers": ["a"], "context": "c3"}\n')
  with pytest.raises(ValueError) as e:
    jsonl_qa.load_jsonl(str(path))
  assert str(e.value).startswith(f"{path}:2: {error}"), str(e.value)
  assert "\n" not in str(e.value)


def test_blank_lines_hold_nothing_and_bytes_that_are_not_utf8_are_refused(tmp_path):
  path = tmp_path / "mine.jsonl"
  path.write_text('\n{"question": "Q?", "answers": ["a"], "context": "c"}\n\n')
  corpus = jsonl_qa.load_jsonl(str(path))
  assert len(corpus) == 1 and corpus.examples[0].id == "2"  # its line number
  path.write_bytes(b'{"question": "Q?", "answers": ["a"], "context": "c"}\n{"question": "\xff"}\n')
  with pytest.raises(ValueError, match=re.escape(f"{path}:2: not UTF-8")):
    jsonl_qa.load_jsonl(str(path))
  path.write_text("\n\n")
  with pytest.raises(ValueError, match="holds no questions"):
    jsonl_qa.load_jsonl(str(path))


def test_too_few_documents_or_questions_for_what_is_asked():
  with pytest.raises(ValueError, match=r"about \d+ documents per question but .*dev.jsonl has only 10 distinct"):
    tasks.make_samples("jsonl", 4000, 5, 0, WordCount(), DEV, chunk_tokens=64)
  with pytest.raises(ValueError, match=r"6 questions asked for .* has only 5"):
    tasks.make_samples("jsonl", 60, 6, 0, WordCount(), DEV, chunk_tokens=64)
  with pytest.raises(IsADirectoryError, match="one JSONL file"):
    tasks.make_samples("jsonl", 60, 2, 0, WordCount(), os.path.dirname(DEV), chunk_tokens=64)
  with pytest.raises(ValueError, match="pass its path"):
    tasks.make_samples("jsonl", 60, 2, 0, WordCount(), "", chunk_tokens=64)


def test_evaluating_training_questions_is_refused(tmp_path):
  cfg = own_data.get_config("tiny")
  cfg.eval.data_dir = cfg.data.data_dir
  with pytest.raises(ValueError, match="also training questions: set eval.data_dir"):
    assembly.build_experiment(cfg, workdir=str(tmp_path))


@pytest.mark.slow
def test_two_training_steps_evaluate_the_held_out_file(tmp_path):
  cfg = own_data.get_config("tiny")
  # 2 of the file's questions (both steps see the same documents: one update program, not one per step's
  # row count); the whole file's loading and padding are tested above
  cfg.data.update(data_dir=TRAIN, train_size=2)
  cfg.eval.data_dir = DEV
  experiment = assembly.build_experiment(cfg, workdir=str(tmp_path))
  pool = [s["question"] for s in experiment.train_pool]
  assert len(set(pool)) == 2 and set(pool) <= {r["question"] for r in _lines(TRAIN)}
  held_out = [s["question"] for s in experiment.evaluator.samples]
  assert len(set(held_out)) == 4 and set(held_out) <= {r["question"] for r in _lines(DEV)}
  out = experiment.trainer.train()
  experiment.trainer.close()
  assert out.step == 2 and [h.step for h in out.history] == [1, 2]
  metrics = [json.loads(line) for line in open(tmp_path / "logs" / "metrics.jsonl")]
  assert [m["step"] for m in metrics if "eval/score" in m] == [0, 2]  # the held-out file, before and after
  assert all(m["train/updates"] == 1 for m in metrics if "train/updates" in m)  # 2 questions, 1 mini-batch


def test_memagent_eval_scores_a_jsonl_file(tmp_path, capsys):
  out = tmp_path / "preds.jsonl"
  cli.main(["eval", "--task", "jsonl", "--data-dir", DEV, "--length", "256", "--n", "5", "--batch-size", "5",
            "--out", str(out), "--model", "random:tiny-smollm2", "--chunk-tokens", "64", "--memory-tokens", "8",
            "--answer-tokens", "6", "--quiet"])
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert summary["task"] == "jsonl" and summary["n"] == 5 and {"score", "em", "f1"} <= set(summary)
  assert sorted(r["question"] for r in rows) == sorted(r["question"] for r in _lines(DEV))
  assert summary["score"] == pytest.approx(sum(r["score"] for r in rows) / 5)


def test_memagent_eval_names_the_bad_line(tmp_path, capsys):
  bad = tmp_path / "train.jsonl"
  lines = open(TRAIN).read().splitlines()
  lines[6] = lines[6].replace('"answers": ["Agnes Paley"]', '"answers": "Agnes Paley"')
  bad.write_text("\n".join(lines) + "\n")
  with pytest.raises(SystemExit) as e:
    cli.main(["eval", "--task", "jsonl", "--data-dir", str(bad), "--length", "256", "--n", "2",
              "--model", "random:tiny-smollm2", "--quiet"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2
  assert err[-1] == f'memagent: error: {bad}:7: field "answers" must be a list of strings, got str'
