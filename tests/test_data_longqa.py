"""Long-document QA: SQuAD/HotpotQA loading, padding, numbering, seeded shuffle, errors."""

import json
import re

import pytest

from memagent_jax.data import longqa
from conftest import SQUAD_SAMPLE

DOC_RE = re.compile(r"(?:^|\n\n)Document (\d+):\n")


def _docs(context: str) -> tuple[list[int], list[str]]:
  """Splits a rendered context into (numbers, documents)."""
  parts = DOC_RE.split(context)
  assert parts[0] == ""
  return [int(n) for n in parts[1::2]], parts[2::2]


@pytest.fixture(scope="module")
def squad():
  return longqa.load_squad(SQUAD_SAMPLE)


def test_load_squad(squad):
  raw = json.load(open(SQUAD_SAMPLE))
  paras = [p for a in raw["data"] for p in a["paragraphs"]]
  assert len(squad.examples) == sum(len(p["qas"]) for p in paras)
  assert len(squad) == 269 and len(squad.pool) == 55
  by_id = {ex.id: ex for ex in squad.examples}
  for p in paras:
    for qa in p["qas"]:
      ex = by_id[qa["id"]]
      assert ex.question == qa["question"] and ex.paragraphs == (p["context"],)
      for a in qa["answers"]:  # SQuAD answers are spans of their own paragraph
        assert p["context"][a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
        assert a["text"] in ex.answers


def test_build_long_qa_squad(squad):
  samples = longqa.build_long_qa(squad, num_docs=10, seed=0)
  assert len(samples) == len(squad)
  pool = set(squad.pool)
  positions = set()
  for s, ex in zip(samples, squad.examples):
    nums, docs = _docs(s["context"])
    assert nums == list(range(1, 11)) and s["num_docs"] == 10
    assert len(set(docs)) == 10 and set(docs) <= pool  # distinct pool paragraphs
    assert docs.count(ex.paragraphs[0]) == 1  # its own paragraph, once
    positions.add(docs.index(ex.paragraphs[0]))
    assert all(a in s["context"] for a in s["answers"])
    assert s["question"] == ex.question and s["answers"] == list(ex.answers)
  assert len(positions) >= 5  # the own paragraph is shuffled to various places


def test_seeded_and_stable(squad):
  a = longqa.build_long_qa(squad.examples[:20], 8, seed=3, pool=squad.pool)
  assert a == longqa.build_long_qa(squad.examples[:20], 8, seed=3, pool=squad.pool)
  b = longqa.build_long_qa(squad.examples[:20], 8, seed=4, pool=squad.pool)
  assert sum(x["context"] != y["context"] for x, y in zip(a, b)) >= 18
  # Per-question randomness: a sample does not depend on the others in the list.
  assert longqa.build_long_qa(squad, 8, seed=3)[:20] == a


def test_render_documents_format():
  assert longqa.render_documents(["a\nb", "c"]) == "Document 1:\na\nb\n\nDocument 2:\nc"


def _hotpot(tmp_path):
  shared = ["Shared", [" A paragraph two questions use.", " Second sentence."]]
  items = []
  for i in range(4):
    items.append({
        "_id": f"q{i}", "question": f"Question {i}?", "answer": f"answer{i}",
        "supporting_facts": [[f"Gold{i}", 0]],
        "context": [[f"Gold{i}", [f"Gold{i} holds answer{i}.", " More text."]],
                    [f"Other{i}", [f"Other{i} is a distractor."]], shared],
    })
  path = tmp_path / "hotpot.json"
  path.write_text(json.dumps(items))
  return str(path)


def test_load_and_build_hotpotqa(tmp_path):
  corpus = longqa.load_hotpotqa(_hotpot(tmp_path))
  assert len(corpus) == 4 and len(corpus.pool) == 9  # 4 gold + 4 other + 1 shared (deduplicated)
  ex = corpus.examples[0]
  assert ex.paragraphs[0] == "Gold0\nGold0 holds answer0. More text."
  assert "Shared\n A paragraph two questions use. Second sentence." in ex.paragraphs
  assert len(ex.paragraphs) == 3 and ex.answers == ("answer0",)
  for s, ex in zip(longqa.build_long_qa(corpus, 5, seed=0), corpus.examples):
    _, docs = _docs(s["context"])
    assert len(docs) == 5 and len(set(docs)) == 5
    assert set(ex.paragraphs) <= set(docs)
    assert s["answers"][0] in s["context"]
  sup = longqa.load_hotpotqa(_hotpot(tmp_path), own="supporting")
  assert sup.examples[1].paragraphs == ("Gold1\nGold1 holds answer1. More text.",)
  assert sup.pool == corpus.pool


def test_errors(tmp_path, squad):
  corpus = longqa.load_hotpotqa(_hotpot(tmp_path))
  with pytest.raises(ValueError, match="smaller than the question's own 3"):
    longqa.build_long_qa(corpus, 2)
  with pytest.raises(ValueError, match="pool has only 54"):
    longqa.build_long_qa(squad, 56)
  longqa.build_long_qa(squad.examples[:1], 55, pool=squad.pool)  # exactly the whole pool is fine
  missing = tmp_path / "nope.json"
  with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
    longqa.load_squad(str(missing))
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(ValueError, match=re.escape(str(bad))):
    longqa.load_hotpotqa(str(bad))
  wrong = tmp_path / "wrong.json"
  wrong.write_text(json.dumps({"data": [{"title": "x"}]}))
  with pytest.raises(ValueError, match="not SQuAD"):
    longqa.load_squad(str(wrong))
  with pytest.raises(ValueError, match="not HotpotQA"):
    longqa.load_hotpotqa(str(wrong))
