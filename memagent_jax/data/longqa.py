"""MemAgent's long-document QA: a question's own paragraphs hidden among many others.

Training (HotpotQA) and the main test set pad each question with other paragraphs of
the corpus to `num_docs` documents, shuffle them with a fixed seed and render them as
`Document {i}:\\n{doc}` joined by blank lines (MEMAGENT_FACTS section 4).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Iterator, Sequence

DOCUMENT = "Document {i}:\n{doc}"


@dataclasses.dataclass(frozen=True)
class QAExample:
  """A question, its reference answers and the paragraphs it is about."""
  id: str
  question: str
  answers: tuple[str, ...]
  paragraphs: tuple[str, ...]  # its own paragraphs (SQuAD: 1; HotpotQA distractor: ~10)
  gold: tuple[str, ...] = ()  # those the answer rests on (SQuAD: its paragraph; HotpotQA: supporting_facts titles)


@dataclasses.dataclass(frozen=True)
class QACorpus:
  """Examples plus the corpus-wide pool of distinct paragraphs used as padding."""
  examples: tuple[QAExample, ...]
  pool: tuple[str, ...]  # distinct paragraphs, in order of first appearance

  def __len__(self) -> int:
    return len(self.examples)


def _read_json(path: str):
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"QA file not found: {path}")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"malformed JSON in {path}: {e}") from None


def _dedup(items) -> tuple[str, ...]:
  return tuple(dict.fromkeys(items))


def load_squad(path: str) -> QACorpus:
  """SQuAD v1.1 (or v2.0, unanswerable questions skipped) JSON -> QACorpus."""
  data = _read_json(path)
  try:
    examples, pool = [], []
    for article in data["data"]:
      for para in article["paragraphs"]:
        pool.append(para["context"])
        for qa in para["qas"]:
          answers = _dedup(a["text"] for a in qa["answers"])
          if qa.get("is_impossible") or not answers:
            continue
          examples.append(QAExample(str(qa["id"]), qa["question"], answers, (para["context"],),
                                    gold=(para["context"],)))
  except (KeyError, TypeError) as e:
    raise ValueError(f"{path} is not SQuAD JSON (missing or bad field {e})") from None
  return QACorpus(tuple(examples), _dedup(pool))


def hotpot_paragraph(title: str, sentences: Sequence[str]) -> str:
  """`{title}\\n{sentences}`; HotpotQA sentences carry their own leading spaces, so join with ''."""
  return f"{title}\n{''.join(sentences)}"


def load_hotpotqa(path: str, own: str = "all") -> QACorpus:
  """HotpotQA train / dev-distractor JSON -> QACorpus.

  `own="all"` keeps every context paragraph of the question (gold + its distractors, as
  MemAgent does); `own="supporting"` keeps only the titles in `supporting_facts`.
  """
  if own not in ("all", "supporting"):
    raise ValueError(f"own must be 'all' or 'supporting', got {own!r}")
  data = _read_json(path)
  try:
    examples, pool = [], []
    for i, item in enumerate(data):
      paras = [(t, hotpot_paragraph(t, s)) for t, s in item["context"]]
      pool.extend(p for _, p in paras)
      titles = {t for t, _ in item["supporting_facts"]}
      gold = _dedup(p for t, p in paras if t in titles)
      if own == "supporting":
        paras = [(t, p) for t, p in paras if t in titles]
      examples.append(QAExample(str(item.get("_id", i)), item["question"], (item["answer"],),
                                _dedup(p for _, p in paras), gold=gold))
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{path} is not HotpotQA JSON (missing or bad field {e})") from None
  return QACorpus(tuple(examples), _dedup(pool))


def render_documents(docs: Sequence[str]) -> str:
  """`Document 1:\\n...` blocks joined by blank lines."""
  return "\n\n".join(DOCUMENT.format(i=i, doc=d) for i, d in enumerate(docs, start=1))


def pad_documents(own: Sequence[str], pool: Sequence[str], num_docs: int, rng: random.Random,
                  pool_set: set[str] | frozenset[str] | None = None) -> list[str]:
  """own + (num_docs - len(own)) distinct pool paragraphs that are not own, shuffled.

  `pool` must be deduplicated; pass `pool_set = set(pool)` when padding many questions.
  """
  own = list(_dedup(own))
  pool_set = set(pool) if pool_set is None else pool_set
  if num_docs < len(own):
    raise ValueError(f"num_docs={num_docs} is smaller than the question's own "
                     f"{len(own)} paragraph(s)")
  need = num_docs - len(own)
  own_set = set(own)
  others = len(pool) - sum(p in pool_set for p in own)
  if need > others:
    raise ValueError(f"num_docs={num_docs} needs {need} padding paragraphs but the pool has only "
                     f"{others} other distinct paragraphs")
  picked: list[str] = []
  for j in rng.sample(range(len(pool)), min(len(pool), need + len(own))):
    if pool[j] not in own_set:
      picked.append(pool[j])
      if len(picked) == need:
        break
  docs = own + picked
  rng.shuffle(docs)
  return docs


def iter_long_qa(examples: QACorpus | Sequence[QAExample], num_docs: int, seed: int = 0,
                 pool: Sequence[str] | None = None) -> Iterator[dict]:
  """Lazy `build_long_qa` (samples of large num_docs are megabytes each)."""
  if pool is None:
    pool = (examples.pool if isinstance(examples, QACorpus)
            else [p for ex in examples for p in ex.paragraphs])
  pool = list(_dedup(pool))
  pool_set = frozenset(pool)
  items = examples.examples if isinstance(examples, QACorpus) else examples
  for index, ex in enumerate(items):
    yield padded_sample(ex, index, num_docs, seed, pool, pool_set)


def padded_sample(ex: QAExample, index: int, num_docs: int, seed: int, pool: Sequence[str],
                  pool_set: frozenset[str]) -> dict:
  """Sample `index` of a padded set: ex's paragraphs among pool paragraphs, shuffled by (seed, index).

  `pool` must be deduplicated and `pool_set` its set."""
  rng = random.Random(f"longqa:{seed}:{index}")
  docs = pad_documents(ex.paragraphs, pool, num_docs, rng, pool_set)
  return {"question": ex.question, "context": render_documents(docs),
          "answers": list(ex.answers), "num_docs": num_docs, "id": ex.id, "index": index}


def build_long_qa(examples: QACorpus | Sequence[QAExample], num_docs: int, seed: int = 0,
                  pool: Sequence[str] | None = None) -> list[dict]:
  """One padded long-document sample per example.

  Args:
    examples: a QACorpus (its pool is used) or a sequence of QAExample.
    num_docs: documents per sample, the question's own paragraphs included.
    seed: padding choice and shuffle seed; the same seed gives the same samples.
    pool: padding paragraphs; default: the corpus pool, else all examples' paragraphs.

  Returns:
    dicts {question, context, answers (list[str]), num_docs, id, index}.
  """
  return list(iter_long_qa(examples, num_docs, seed, pool))
