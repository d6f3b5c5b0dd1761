"""RULER-HotpotQA built as the paper builds it, on the shipped excerpt of the real dev file, and scored
with the paper's metric (sub_em) beside EM, F1 and, apart, the training verifier."""

import json
import os
import re
import types

import pytest

from memagent_jax import cli
from memagent_jax.agent.results import AgentResult
from memagent_jax.data import longqa, tasks
from memagent_jax.data import ruler_hotpotqa as rhq
from memagent_jax.evaluation import evaluate
from memagent_jax.evaluation.length_sweep import SweepSpec, sweep_lengths

DEV = os.path.join(os.path.dirname(__file__), "data", "hotpotqa_sample", "hotpot_dev_distractor_v1.json")
SMALLEST = (50, 100)  # the paper's two smallest lengths; the excerpt's pool (311 paragraphs) allows up to 200


def _raw():
  with open(DEV, encoding="utf-8") as f:
    return {item["_id"]: item for item in json.load(f)}


def _blocks(context: str) -> dict[int, str]:
  """Document number -> its paragraph, read back from the rendered text."""
  parts = re.split(r"(?:^|\n\n)Document (\d+):\n", context)
  return {int(num): text for num, text in zip(parts[1::2], parts[2::2])}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("rhq"))
  words = types.SimpleNamespace(encode_batch=lambda texts: [t.split() for t in texts])  # a countable "tokenizer"
  manifest = rhq.build_set(DEV, out, rhq.SetSpec(num_docs=SMALLEST, n=12, seed=0), tokenizer=words,
                          tokenizer_name="words")
  return out, manifest


def test_excerpt_is_the_dev_distractor_file():
  corpus = longqa.load_hotpotqa(DEV)
  assert len(corpus) == 32 and len(corpus.pool) == 311
  assert corpus.examples[0].id == "5a8b57f25542995d1e6f1371"  # the official dev file's first question
  assert all(len(ex.gold) == 2 and set(ex.gold) <= set(ex.paragraphs) for ex in corpus.examples)
  assert sorted(len(ex.paragraphs) for ex in corpus.examples) == [2] + [10] * 31  # one question came with 2
  assert rhq.paper_num_docs(len(corpus.pool)) == rhq.PAPER_NUM_DOCS
  assert rhq.paper_num_docs(66635)[-2:] == (12800, 25600)  # the full dev file's pool reaches 3.5M tokens
  assert rhq.paper_num_docs(20000)[-1] == 12800


def test_built_lengths_hold_the_gold_where_the_manifest_says(built):
  out, manifest = built
  raw = _raw()
  assert sorted(os.listdir(out)) == ["eval_100.json", "eval_50.json", "manifest.json"]
  assert [e["num_docs"] for e in manifest["lengths"]] == list(SMALLEST) and len(manifest["questions"]) == 12
  questions = None
  for entry in manifest["lengths"]:
    samples = rhq.load_samples(out, entry["num_docs"])
    assert questions in (None, [s["id"] for s in samples])  # the same questions at every length
    questions = [s["id"] for s in samples]
    for s in samples:
      item, blocks = raw[s["id"]], _blocks(s["context"])
      assert sorted(blocks) == list(range(1, entry["num_docs"] + 1))
      assert len(set(blocks.values())) == entry["num_docs"]  # distinct paragraphs
      supporting = {t for t, _ in item["supporting_facts"]}
      gold = {f"{t}\n{''.join(z)}" for t, z in item["context"] if t in supporting}
      own = {f"{t}\n{''.join(z)}" for t, z in item["context"]}
      assert s["gold_positions"] == sorted(k for k, text in blocks.items() if text in gold) and len(gold) == 2
      assert s["own_positions"] == sorted(k for k, text in blocks.items() if text in own)
      assert len(own) == len(item["context"])
      assert entry["gold_positions"][s["id"]] == s["gold_positions"]
      assert s["answers"] == [item["answer"]] and s["question"] == item["question"]
      assert s["context_tokens"] == len(s["context"].split())
    counts = [s["context_tokens"] for s in samples]
    assert entry["tokens_min"] == min(counts) and entry["tokens_mean"] == pytest.approx(sum(counts) / len(counts), abs=0.05)
  table = rhq.build_table(manifest, command="memagent build-ruler-hotpotqa ...")
  assert "| 50 | 7K |" in table and "| 100 | 14K |" in table
  assert f"| {questions[0]} | " in table


def test_same_seed_same_set_other_seed_other_set(built, tmp_path):
  out, _ = built
  again = rhq.build_set(DEV, str(tmp_path / "a"), rhq.SetSpec(num_docs=(50,), n=12, seed=0))
  with open(os.path.join(out, "eval_50.json")) as f, open(tmp_path / "a" / "eval_50.json") as g:
    first, second = json.load(f), json.load(g)
  for s in first:
    s.pop("context_tokens")
  assert first == second  # a length does not depend on which other lengths were built, nor on token counting
  other = rhq.build_set(DEV, str(tmp_path / "b"), rhq.SetSpec(num_docs=(50,), n=12, seed=1))
  assert other["questions"] != again["questions"]
  corpus = longqa.load_hotpotqa(DEV)
  seed0, seed1 = (rhq.build_samples(corpus, [0, 1, 2], 50, seed) for seed in (0, 1))
  assert all(a["context"] != b["context"] for a, b in zip(seed0, seed1))  # the same questions, other documents


def test_refuses_lengths_the_pool_cannot_fill(tmp_path):
  with pytest.raises(ValueError, match=r"num_docs=400 needs 400 distinct paragraphs but the pool has only 311"):
    rhq.build_set(DEV, str(tmp_path / "x"), rhq.SetSpec(num_docs=(50, 400), n=4))
  assert not os.path.exists(tmp_path / "x")  # refused before anything was written
  with pytest.raises(ValueError, match="smaller than a question's own 10 paragraphs"):
    rhq.build_set(DEV, str(tmp_path / "y"), rhq.SetSpec(num_docs=(5,), n=4))
  with pytest.raises(ValueError, match=r"n=33 questions requested but the corpus has 32"):
    rhq.build_set(DEV, str(tmp_path / "z"), rhq.SetSpec(num_docs=(50,), n=33))
  with pytest.raises(ValueError, match="1 of the 2 requested question ids are not in the corpus"):
    rhq.build_set(DEV, str(tmp_path / "z"), rhq.SetSpec(num_docs=(50,), ids=["5a8b57f25542995d1e6f1371", "nope"]))


def test_tasks_read_the_built_set(built):
  out, manifest = built
  samples = tasks.make_samples(rhq.TASK, 100, 3, 7, None, out, chunk_tokens=5000)
  assert [s["id"] for s in samples] == manifest["questions"][:3] and samples[0]["num_docs"] == 100
  with pytest.raises(ValueError, match=r"has no length of 200 documents; built: \[50, 100\]"):
    tasks.make_samples(rhq.TASK, 200, 3, 0, None, out, chunk_tokens=5000)
  with pytest.raises(ValueError, match="n=13 but .* holds 12 questions"):
    tasks.make_samples(rhq.TASK, 50, 13, 0, None, out, chunk_tokens=5000)
  with pytest.raises(ValueError, match="reads a built set"):
    tasks.make_samples(rhq.TASK, 50, 3, 0, None, None, chunk_tokens=5000)


def _result(answer: str, prediction):
  return AgentResult(question="q", answer=answer, boxed=None, prediction=prediction, memories=[], conversations=[],
                     num_chunks=1, document_tokens=1, decoded_tokens=1, seconds=0.0)


def test_paper_metric_first_verifier_apart():
  # The eval prompt's answer "...the answer is Chief of Protocol of the United States": sub_em 1 (truth inside),
  # EM 0, F1 by hand: 3 shared tokens (chief, of, protocol) of 6 predicted and 3 true -> 2*0.5*1/1.5 = 2/3;
  # no \boxed{} so the training verifier gives 0.
  said = _result("Therefore, the answer is Chief of Protocol of the United States.", "Chief of Protocol of the United States")
  scores = evaluate.score(rhq.TASK, said, ["Chief of Protocol"])
  assert scores == pytest.approx({"score": 1.0, "em": 0.0, "f1": 2 / 3, "verifier": 0.0})
  boxed = _result("so \\boxed{Chief of Protocol}", "Chief of Protocol")
  assert evaluate.score(rhq.TASK, boxed, ["Chief of Protocol"]) == {"score": 1.0, "em": 1.0, "f1": 1.0, "verifier": 1.0}
  line = evaluate.format_scores(rhq.TASK, {**scores, "n": 1})
  assert line == ("sub_em (the paper's accuracy) 1.000, EM 0.000, F1 0.667; "
                  "training verifier (boxed exact match; not the paper's metric) 0.000")
  assert evaluate.format_scores("niah_single_1", {"score": 0.5}) == "string_match_all (paper Eq. 7) 0.500"


class _Reader:
  """Says the answer in the eval prompt's words on 50 documents, boxes it exactly on more."""
  tokenizer = None

  def answer_batch(self, questions, documents, temperature=0.0, top_p=1.0, seed=0):
    truth = {s["question"]: s["answers"][0] for s in self.samples}
    out = []
    for q, d in zip(questions, documents):
      short = d.count("\n\nDocument ") < 60
      answer = f"Therefore, the answer is {truth[q]} indeed" if short else f"\\boxed{{{truth[q]}}}"
      out.append(AgentResult(question=q, answer=answer, boxed=None if short else truth[q],
                             prediction=f"{truth[q]} indeed" if short else truth[q], memories=[], conversations=[],
                             num_chunks=1, document_tokens=len(d.split()), decoded_tokens=1, seconds=0.0))
    return out


def test_length_sweep_over_the_built_set(built):
  out, _ = built
  reader = _Reader()
  reader.samples = rhq.load_samples(out, 50)
  spec = SweepSpec(task=rhq.TASK, lengths=SMALLEST, n=4, seed=0, batch_size=4, temperature=0.0, top_p=1.0,
                   chunk_tokens=5000, warmup_each_length=False, data_dir=out)
  rows = sweep_lengths(reader, "stub", spec, progress=False)
  assert [r.length for r in rows] == list(SMALLEST) and [r.accuracy for r in rows] == [1.0, 1.0]
  assert [r.others["em"] for r in rows] == [0.0, 1.0] and [r.others["verifier"] for r in rows] == [0.0, 1.0]
  assert 0 < rows[0].others["f1"] < 1 == rows[1].others["f1"]
  assert rows[1].doc_tokens > 1.5 * rows[0].doc_tokens
  # the evaluation script's table and plot (experiments/ruler_hotpotqa.py) from these rows: sub_em headlined as
  # the paper's accuracy beside the paper's 14B, EM / F1 / verifier per length
  from experiments import ruler_hotpotqa as script
  manifest = rhq.load_manifest(out)
  table = script.markdown(rows, manifest, "cmd", "stub")
  assert "| MemAgent, this model | 100.0 | 100.0 |" in table
  assert "| RL-MemAgent-14B (paper) | 83.6 | - |" in table  # the paper reports 50 documents, not 100
  assert "| 100 | 14K |" in table and "| 100.0 | 100.0 |" in table.splitlines()[-1]
  assert "| 50 | 7K |" in table and "| 0.0 | " in next(l for l in table.splitlines() if l.startswith("| 50 | 7K |"))
  script.plot(rows, os.path.join(out, "plot.png"), "stub")
  assert os.path.getsize(os.path.join(out, "plot.png")) > 1000


def test_cli_builds_and_refuses(tmp_path, capsys):
  table = tmp_path / "build.md"
  assert cli.main(["build-ruler-hotpotqa", f"--input={DEV}", f"--out={tmp_path / 'set'}", "--num-docs=50",
                   "--n=3", "--tokenizer=none", f"--table={table}"]) == 0
  assert "| 50 | 7K | - |" in table.read_text() and (tmp_path / "set" / "eval_50.json").exists()
  with pytest.raises(SystemExit) as e:
    cli.main(["build-ruler-hotpotqa", f"--input={DEV}", f"--out={tmp_path / 'big'}", "--num-docs=50,400",
              "--n=3", "--tokenizer=none"])
  assert e.value.code == 2
  assert "memagent: error: num_docs=400 needs 400 distinct paragraphs but the pool has only 311" in capsys.readouterr().err
