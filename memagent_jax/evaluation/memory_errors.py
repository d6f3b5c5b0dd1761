"""Where a toy-world memory goes wrong: the first chunk after which it no longer holds the asked
key's latest code, and what that chunk held: where long-document errors come from.

A memory is right after chunk i when it holds the latest value the document has given the asked
key so far, as a word, in whatever wording (before the first fact about the key, any memory is
right: nothing is known yet). The test is on the value, not on "the code of <key> is <value> .":
RL drifts from the teacher's wording (measured: "code code of berlin is crab ."), and the answer
step reads the value, so a memory that files it under a garbled key still answers right. The first
wrong chunk is classified by what it held:
  missed_update         a fact about the asked key, which the memory did not take
  distractor_overwrite  only other keys' facts, and the asked key's fact was lost or changed
  copy_corruption       no fact at all: the memory changed while it only had to be copied
A document whose memories were all right but whose answer was wrong is an `answer` error.
"""

from __future__ import annotations

from collections import Counter

from memagent_jax.data import toy

CHUNK_KINDS = ("missed_update", "distractor_overwrite", "copy_corruption")  # named by what the chunk held
KINDS = (*CHUNK_KINDS, "answer")
# distractor-only chunks by what tempts the memory: a fact about another key some question asks about,
# or only facts no question asks about (a memory that keeps "any askable key" fails only the first)
DISTRACTOR_SPLIT = ("other_askable", "unaskable")


def askable_keys(sample: dict) -> tuple[str, ...]:
  """The keys a question of the sample's world may ask about."""
  return toy.ONE_KEY if sample.get("task") == toy.ONE_KEY_TASK else toy.ASKED_KEYS


def chunk_facts(sample: dict, chunk_tokens: int) -> list[list[tuple[str, str]]]:
  """(key, value) facts of each chunk of a toy sample, from its generator's fact offsets."""
  num_chunks = -(-sample["num_tokens"] // chunk_tokens)
  out: list[list[tuple[str, str]]] = [[] for _ in range(num_chunks)]
  for (key, value), start in zip(sample["facts"], sample["fact_starts"]):
    if start // chunk_tokens != (start + toy.FACT_TOKENS - 1) // chunk_tokens:
      raise ValueError(f"a fact at token {start} crosses a chunk boundary of {chunk_tokens}: the sample "
                       "was generated for another chunk size")
    out[start // chunk_tokens].append((key, value))
  return out


def holds(memory: str, value: str) -> bool:
  """Whether the memory text has `value` as one of its words."""
  return value in memory.replace("{", " ").replace("}", " ").split()


def _walk(sample: dict, memories: list[str], chunk_tokens: int):
  """(chunk index, kind, memory, expected, right) for every chunk that could have gone wrong, up to
  and including the first that did. kind: what the chunk held (the three chunk kinds of KINDS)."""
  per_chunk = chunk_facts(sample, chunk_tokens)
  if len(memories) != len(per_chunk):
    raise ValueError(f"{len(memories)} memories for a document of {len(per_chunk)} chunks of {chunk_tokens}")
  key, latest = sample["key"], None
  for i, (facts, memory) in enumerate(zip(per_chunk, memories)):
    asked = [v for k, v in facts if k == key]
    latest = asked[-1] if asked else latest
    if latest is None:
      continue  # nothing known about the asked key yet: no memory can be wrong
    kind = "missed_update" if asked else "distractor_overwrite" if facts else "copy_corruption"
    right = holds(memory, latest)
    yield i, kind, memory, latest, right
    if not right:
      return


def first_error(sample: dict, memories: list[str], *, correct: bool, chunk_tokens: int) -> dict | None:
  """The first chunk after which the memory is wrong, with its kind; None for a right document.

  Args:
    sample: a toy sample (facts, fact_starts, key, num_tokens).
    memories: the memory after each chunk, one per chunk.
    correct: whether the final answer was scored right.
    chunk_tokens: the reader's chunk size (the one the sample was generated for).
  """
  num_chunks, latest = len(chunk_facts(sample, chunk_tokens)), None
  for i, kind, memory, latest, right in _walk(sample, memories, chunk_tokens):
    if not right:
      return {"chunk": i, "num_chunks": num_chunks, "kind": kind, "memory": memory, "expected": latest}
  if correct:
    return None
  return {"chunk": num_chunks, "num_chunks": num_chunks, "kind": "answer",
          "memory": memories[-1] if memories else "", "expected": latest}


def exposures(sample: dict, memories: list[str], *, chunk_tokens: int) -> Counter:
  """Chunks of each kind read while the memory was still right (the first wrong one included):
  the denominators of per-chunk error rates."""
  return Counter(kind for _, kind, *_ in _walk(sample, memories, chunk_tokens))


def error_table(samples: list[dict], rows: list[dict], *, chunk_tokens: int) -> dict:
  """Counts of first-error kinds over evaluated documents (`rows`: run_eval's JSON lines, matched
  to `samples` by index; "score" is exact match for the toy tasks), and how many wrong memories
  were still followed by a right answer. "per_chunk": for each chunk kind, (first errors, chunks
  of that kind read while the memory was right), over every document: the per-chunk hazard.
  "distractor_split": the same for distractor-only chunks, split by DISTRACTOR_SPLIT."""
  by_index = {s["index"]: s for s in samples}
  kinds, lucky, chunks_at = Counter(), 0, []
  exposed, failed, split_read, split_lost = Counter(), Counter(), Counter(), Counter()
  for row in rows:
    if row.get("memories") is None:
      raise ValueError("evaluation rows without 'memories' (written before every chunk's memory was kept)")
    sample = by_index[row["index"]]
    if "question" in row and row["question"] != sample["question"]:
      raise ValueError(f"document {row['index']}: evaluated question {row['question']!r} but the regenerated "
                       f"sample asks {sample['question']!r}: another task, length or seed than the evaluation's")
    err = first_error(sample, row["memories"], correct=bool(row["score"]), chunk_tokens=chunk_tokens)
    facts, others = chunk_facts(sample, chunk_tokens), set(askable_keys(sample)) - {sample["key"]}
    for i, kind, _, _, right in _walk(sample, row["memories"], chunk_tokens):
      exposed[kind] += 1
      if kind == "distractor_overwrite":  # which facts tempted it: another key a question may ask about?
        split = "other_askable" if any(k in others for k, _ in facts[i]) else "unaskable"
        split_read[split] += 1
        split_lost[split] += not right
    if err is not None and err["kind"] != "answer":
      failed[err["kind"]] += 1
    if err is None:
      continue
    if row["score"]:
      lucky += 1  # wrong memory, right answer (a later fact or a guess repaired it)
      continue
    kinds[err["kind"]] += 1
    chunks_at.append(err["chunk"] / max(1, err["num_chunks"]))
  return {"documents": len(rows), "wrong": sum(kinds.values()), **{k: kinds[k] for k in KINDS},
          "right_despite_wrong_memory": lucky,
          "mean_relative_chunk": sum(chunks_at) / len(chunks_at) if chunks_at else None,
          "per_chunk": {k: (failed[k], exposed[k]) for k in CHUNK_KINDS},
          "distractor_split": {k: (split_lost[k], split_read[k]) for k in DISTRACTOR_SPLIT}}


# What a distractor-only chunk's overwrite rate is broken down by (distractor_hazards)
HAZARD_FACTORS = ("last_fact_offset", "facts_in_chunk", "asked_key", "distractor_value", "document_quarter",
                  "memory_before")


def canonical_memory(memory: str, key: str) -> bool:
  """Whether a memory is exactly the teacher's one fact about `key` ("the code of <key> is <v> .")."""
  words = memory.split()
  return len(words) == 7 and words[:4] == ["the", "code", "of", key] and words[4] == "is" and words[6] == "."


def distractor_hazards(samples: list[dict], rows: list[dict], *, chunk_tokens: int) -> dict:
  """Overwrite rate of distractor-only chunks read while the memory was right, broken down by each of
  HAZARD_FACTORS: {factor: {level: (lost, read)}}. It says whether the error is spread evenly or sits
  with a fact's place in the chunk, the chunk's load, a key, a value, the place in the document, or a
  memory already off the teacher's wording. A chunk with two values counts under each."""
  by_index = {s["index"]: s for s in samples}
  out: dict[str, dict] = {f: {} for f in HAZARD_FACTORS}

  def count(factor, level, lost):
    lost_read = out[factor].get(level, (0, 0))
    out[factor][level] = (lost_read[0] + lost, lost_read[1] + 1)

  quarter = max(1, chunk_tokens // 4)
  for row in rows:
    sample, memories = by_index[row["index"]], row["memories"]
    facts = chunk_facts(sample, chunk_tokens)
    offsets: dict[int, list[int]] = {}
    for start in sample["fact_starts"]:
      offsets.setdefault(start // chunk_tokens, []).append(start % chunk_tokens)
    for i, kind, _, _, right in _walk(sample, memories, chunk_tokens):
      if kind != "distractor_overwrite":
        continue
      lost = int(not right)
      last = max(offsets[i]) // quarter
      count("last_fact_offset", f"{last * quarter}-{(last + 1) * quarter - 1}", lost)
      count("facts_in_chunk", str(min(len(facts[i]), 3)) + ("+" if len(facts[i]) >= 3 else ""), lost)
      count("asked_key", sample["key"], lost)
      for value in sorted({v for _, v in facts[i]}):
        count("distractor_value", value, lost)
      count("document_quarter", str(min(3, 4 * i // len(facts)) + 1), lost)
      before = canonical_memory(memories[i - 1], sample["key"])  # i >= 1: the asked fact came earlier
      count("memory_before", "the teacher's wording" if before else "other wording", lost)
  return {f: dict(sorted(levels.items())) for f, levels in out.items()}
