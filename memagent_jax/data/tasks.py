"""Tasks by name -> samples: RULER tasks fitted to a token length, long-document QA, the toy world.

Training pools and evaluation sets are both drawn here, so a task name (with its options) means
the same data everywhere.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Mapping, Sequence

from memagent_jax.data import jsonl_qa, longqa, ruler, ruler_hotpotqa, toy

# "jsonl": your own questions, one JSON object a line (data/jsonl_qa.py); its data_dir is the file itself
QA_TASKS = ("squad", "hotpotqa", "jsonl")
BUILT_QA_TASKS = (ruler_hotpotqa.TASK,)  # read from a set built beforehand; lengths in documents
QA_FILES = {"squad": ("dev-v1.1.json", "train-v1.1.json"),
            "hotpotqa": ("hotpot_dev_distractor_v1.json", "hotpot_train_v1.1.json")}


@dataclasses.dataclass(frozen=True)
class QuestionBatch:
  """The questions a rollout step draws: each with its document and its reference answers."""
  question: tuple[str, ...]
  context: tuple[str, ...]  # the document read chunk by chunk
  answers: tuple[tuple[str, ...], ...]  # every accepted answer (the verifier reads the first)

  def __post_init__(self):
    if not len(self.question) == len(self.context) == len(self.answers):
      raise ValueError(f"a question batch needs one context and one answer list per question; got "
                       f"{len(self.question)} questions, {len(self.context)} contexts, {len(self.answers)} answer lists")

  def __len__(self) -> int:
    return len(self.question)

  @classmethod
  def of(cls, samples: Sequence[Mapping]) -> "QuestionBatch":
    """From samples ({"question", "context", "answers", ...}; other fields are not rollout inputs)."""
    return cls(question=tuple(s["question"] for s in samples), context=tuple(s["context"] for s in samples),
               answers=tuple(tuple(s["answers"]) for s in samples))

  @classmethod
  def from_columns(cls, columns: Mapping[str, Sequence]) -> "QuestionBatch":
    """From a pipeline batch (`pipeline.collate`: one list per field)."""
    return cls(question=tuple(columns["question"]), context=tuple(columns["context"]),
               answers=tuple(tuple(a) for a in columns["answers"]))


def task_names() -> list[str]:
  return list(ruler.TASKS) + list(QA_TASKS) + list(BUILT_QA_TASKS) + list(toy.TASKS)


def _qa_file(task: str, data_dir: str | None) -> str:
  if task == "jsonl":
    if not data_dir:
      raise ValueError("task 'jsonl' reads your JSONL file: pass its path (--data-dir FILE; in a config "
                       "data.data_dir, and eval.data_dir for the held-out file)")
    if os.path.isdir(data_dir):
      raise IsADirectoryError(f"task 'jsonl' reads one JSONL file, got the directory {data_dir}")
    return data_dir
  if not data_dir:
    raise ValueError(f"task {task!r} reads a local corpus: pass --data-dir with one of "
                     f"{', '.join(QA_FILES[task])}")
  if os.path.isfile(data_dir):
    return data_dir
  for name in QA_FILES[task]:
    path = os.path.join(data_dir, name)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(f"no {task} file in {data_dir} (looked for {', '.join(QA_FILES[task])})")


# Generator options a task takes from a config's data.options (the toy world's document makeup, e.g.
# RL documents denser in distractors than the evaluated world); any other task takes none.
TOY_OPTIONS = ("distractor_density", "num_distractors", "override_prob", "max_overrides", "distractor_keys",
               "askable_share", "late_fact_share")


def make_samples(task: str, length: int, n: int, seed: int, tokenizer, data_dir: str | None = None, *,
                 chunk_tokens: int, options: Mapping | None = None) -> list[dict]:
  """n samples whose contexts have about `length` tokens (RULER: fitted; QA: padded documents).

  ruler_hotpotqa: `length` is a document count of the set built in data_dir (the paper's lengths are
  50, 100, ... documents), n its first questions; the set was drawn when it was built, so `seed` and
  `tokenizer` are not used.

  chunk_tokens: the reader's chunk size. The toy world places no fact across a boundary of it
  (so a config's agent.chunk_tokens shapes its documents; None: facts anywhere); other tasks
  ignore it.
  options: generator options (toy tasks: TOY_OPTIONS, fields of toy.Makeup); an option a task does not
  take is an error, never ignored."""
  options = dict(options or {})
  allowed = TOY_OPTIONS if task in toy.TASKS else ()
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise ValueError(f"task {task!r} takes no data option {unknown[0]!r} (given {sorted(options)}; "
                     f"it takes {list(allowed) or 'none'})")
  if task in ruler.TASKS:
    return ruler.generate(task, length, n, seed, tokenizer=tokenizer)
  if task == toy.TASK:  # lengths in toy (word) tokens, whatever the tokenizer
    return toy.generate(n, length, seed, makeup=toy.Makeup(chunk_tokens=chunk_tokens, **options))
  if task == toy.ONE_KEY_TASK:
    makeup = toy.Makeup(chunk_tokens=chunk_tokens, asked_keys=toy.ONE_KEY, **options)
    return [{**s, "task": task} for s in toy.generate(n, length, seed, makeup=makeup)]
  if task == ruler_hotpotqa.TASK:
    if not data_dir:
      raise ValueError(f"task {task!r} reads a built set: pass its directory as data_dir (--data-dir); build it "
                       "with `memagent build-ruler-hotpotqa`")
    return ruler_hotpotqa.load_samples(data_dir, length, n)
  if task not in QA_TASKS:
    raise ValueError(f"unknown task {task!r}; known: {', '.join(task_names())}")
  path = _qa_file(task, data_dir)
  if task == "jsonl":
    corpus = jsonl_qa.load_jsonl(path)
  else:
    corpus = longqa.load_squad(path) if task == "squad" else longqa.load_hotpotqa(path)
  if n > len(corpus):
    raise ValueError(f"{n} questions asked for (data.train_size, eval.size or --n) but {path} has only "
                     f"{len(corpus)}")
  chosen = random.Random(f"eval:{task}:{seed}").sample(range(len(corpus)), n)  # spread over articles
  if task == "jsonl":
    padded = [corpus.examples[i] for i in chosen if corpus.padded[i]]
    num_docs = documents_for_length(padded, corpus.pool, length, tokenizer, path) if padded else 0
    return jsonl_qa.build_samples(corpus, chosen, num_docs, seed)
  examples = [corpus.examples[i] for i in chosen]
  num_docs = documents_for_length(examples, corpus.pool, length, tokenizer, path)
  return longqa.build_long_qa(longqa.QACorpus(tuple(examples), corpus.pool), num_docs, seed)


def documents_for_length(examples: Sequence[longqa.QAExample], pool: Sequence[str], length: int, tokenizer,
                         path: str) -> int:
  """Documents per padded sample for about `length` tokens (mean pool paragraph + its header), at least
  every example's own; an error when the corpus has too few distinct documents for that."""
  sample_pool = pool[:200]
  per_doc = sum(len(tokenizer.encode(p)) for p in sample_pool) / max(1, len(sample_pool))
  num_docs = max(max(len(e.paragraphs) for e in examples), round(length / (per_doc + 5)))
  if num_docs > len(pool):
    raise ValueError(f"{length} tokens take about {num_docs} documents per question but {path} has only "
                     f"{len(pool)} distinct documents to pad with: lower the length (data.length, eval.length "
                     "or --length) or add documents")
  return num_docs
