"""Your own QA data: a JSONL file, one question a line, read into long-document QA samples.

A line is {"question": str, "answers": [str, ...], "context": str} (one document, read as given) or
{"question", "answers", "documents": [str, ...]} (its own documents, padded with the file's other
documents as MemAgent pads HotpotQA: longqa.padded_sample), with an optional "id". Every line is
checked; a bad one is an error naming the file, the line and the field, never skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

from memagent_jax.data import longqa

FIELDS = ("question", "answers", "context", "documents", "id")


@dataclasses.dataclass(frozen=True)
class JsonlCorpus:
  """A JSONL file's questions; `padded[i]`: example i gave `documents`, else its one `context`."""
  path: str
  examples: tuple[longqa.QAExample, ...]  # paragraphs: the line's documents, or its one context
  padded: tuple[bool, ...]
  pool: tuple[str, ...]  # every line's documents, distinct, in order of first appearance: the padding

  def __len__(self) -> int:
    return len(self.examples)


class JsonlLineError(ValueError):
  """A malformed line: `path:line: problem`."""


def _type_name(value) -> str:
  return "null" if value is None else {dict: "object", list: "list", str: "str", bool: "bool",
                                       int: "int", float: "float"}.get(type(value), type(value).__name__)


def _text(record: dict, field: str, fail) -> str:
  """record[field] as a non-empty string."""
  value = record[field]
  if not isinstance(value, str) or not value.strip():
    got = "an empty string" if isinstance(value, str) else _type_name(value)
    fail(f'field "{field}" must be a non-empty string, got {got}')
  return value


def _texts(record: dict, field: str, fail) -> tuple[str, ...]:
  """record[field] as a non-empty list of non-empty strings."""
  value = record[field]
  if not isinstance(value, list):
    fail(f'field "{field}" must be a list of strings, got {_type_name(value)}')
  if not value:
    fail(f'field "{field}" is an empty list (it needs at least one string)')
  for i, item in enumerate(value):
    if not isinstance(item, str) or not item.strip():
      got = "an empty string" if isinstance(item, str) else _type_name(item)
      fail(f'field "{field}" item {i} must be a non-empty string, got {got}')
  return tuple(value)


def parse_line(record, fail) -> tuple[longqa.QAExample, bool]:
  """One decoded line -> (its example, whether it is padded); `fail(message)` raises."""
  if not isinstance(record, dict):
    fail(f"a line must be a JSON object, got {_type_name(record)}")
  unknown = [k for k in record if k not in FIELDS]
  if unknown:
    fail(f'unknown field "{unknown[0]}" (a line has question, answers, context or documents, and id)')
  for field in ("question", "answers"):
    if field not in record:
      fail(f'field "{field}" is missing')
  question = _text(record, "question", fail)
  answers = _texts(record, "answers", fail)
  has_context, has_documents = "context" in record, "documents" in record
  if has_context and has_documents:
    fail('fields "context" and "documents" are both given: give one, not both')
  if not has_context and not has_documents:
    fail('give either field "context" (one document) or field "documents" (a list of documents)')
  paragraphs = (_text(record, "context", fail),) if has_context else _texts(record, "documents", fail)
  ex_id = record.get("id", "")
  if not isinstance(ex_id, (str, int)) or isinstance(ex_id, bool):
    fail(f'field "id" must be a string or an integer, got {_type_name(ex_id)}')
  return longqa.QAExample(str(ex_id), question, answers, paragraphs), has_documents


def load_jsonl(path: str) -> JsonlCorpus:
  """Reads and checks every line of a JSONL QA file (blank lines hold nothing and are passed over).

  Raises JsonlLineError `path:line: ...` at the first bad line; lines without an "id" get their line
  number as id; an id given twice is an error."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL file not found: {path}")
  examples, padded, seen = [], [], {}
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      def fail(message, number=number):
        raise JsonlLineError(f"{path}:{number}: {message}")
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        fail(f"not UTF-8 ({e.reason} at byte {e.start})")
      if not text.strip():
        continue
      try:
        record = json.loads(text)
      except json.JSONDecodeError as e:
        fail(f"not valid JSON ({e.msg} at column {e.colno})")
      ex, is_padded = parse_line(record, fail)
      if not ex.id:
        ex = dataclasses.replace(ex, id=str(number))
      if ex.id in seen:
        fail(f'field "id" {ex.id!r} was already used on line {seen[ex.id]}')
      seen[ex.id] = number
      examples.append(ex)
      padded.append(is_padded)
  if not examples:
    raise ValueError(f"{path} holds no questions (one JSON object a line)")
  pool = tuple(dict.fromkeys(p for ex, pad in zip(examples, padded) if pad for p in ex.paragraphs))
  return JsonlCorpus(path, tuple(examples), tuple(padded), pool)


def build_samples(corpus: JsonlCorpus, chosen: Sequence[int], num_docs: int, seed: int) -> list[dict]:
  """The samples of examples `chosen` (indices), in that order: padded ones with `num_docs` documents
  (the same as longqa.build_long_qa), the others with their context as given."""
  pool = list(corpus.pool)
  pool_set = frozenset(pool)
  samples = []
  for index, i in enumerate(chosen):
    ex = corpus.examples[i]
    if corpus.padded[i]:
      samples.append(longqa.padded_sample(ex, index, num_docs, seed, pool, pool_set))
    else:
      samples.append({"question": ex.question, "context": ex.paragraphs[0], "answers": list(ex.answers),
                      "num_docs": 1, "id": ex.id, "index": index})
  return samples
