"""RULER-HotpotQA, MemAgent's main test set: the same dev questions at growing document counts.

The paper pads each question's own distractor-setting paragraphs (its gold paragraphs and HotpotQA's
8 distractors) with other paragraphs of the dev file to 50, 100, 200, ... 25600 documents (about 7K,
14K, 28K, ... 3.5M tokens), shuffles them and renders `Document {i}:` blocks (MEMAGENT_FACTS
sections 4, 5). Lengths are chosen in documents, as the paper does; tokens are measured afterwards.
A built set is a folder of `eval_{num_docs}.json` files plus `manifest.json` (seed, questions, the
gold paragraphs' document numbers, token counts), so every reader sees the same documents.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import statistics
from typing import Sequence

from memagent_jax.data import longqa
from memagent_jax.runtime.atomic_io import atomic_write

TASK = "ruler_hotpotqa"
PAPER_NUM_DOCS = (50, 100, 200, 400, 800, 1600, 3200, 6400)  # the paper's table up to 896K tokens
PAPER_OVER_1M = (12800, 25600)  # 1.75M and 3.5M tokens: only when the dev file's pool allows
PAPER_TOKENS = {50: "7K", 100: "14K", 200: "28K", 400: "56K", 800: "112K", 1600: "224K", 3200: "448K",
                6400: "896K", 12800: "1.75M", 25600: "3.5M"}  # the paper's names of the lengths
PAPER_QUESTIONS = 128
MANIFEST = "manifest.json"


def set_file(num_docs: int) -> str:
  """The file of one length inside a built set (the reference's name)."""
  return f"eval_{num_docs}.json"


def paper_num_docs(pool_size: int) -> tuple[int, ...]:
  """The paper's document counts: up to 6400 always, 12800 and 25600 when the pool holds them."""
  return PAPER_NUM_DOCS + tuple(n for n in PAPER_OVER_1M if n <= pool_size)


def choose_questions(corpus: longqa.QACorpus, n: int, seed: int, ids: Sequence[str] | None = None) -> list[int]:
  """Indices of the questions a set asks, the same at every length, in file order.

  ids: the questions to ask, by HotpotQA `_id` (e.g. the paper's 128, which are the first 200 dev
  questions minus those Qwen2.5-7B-Instruct answers without the document); else `n` drawn by seed."""
  if ids is not None:
    where = {ex.id: i for i, ex in enumerate(corpus.examples)}
    missing = [q for q in ids if q not in where]
    if missing:
      raise ValueError(f"{len(missing)} of the {len(ids)} requested question ids are not in the corpus "
                       f"(first: {missing[0]!r})")
    return sorted(dict.fromkeys(where[q] for q in ids))
  if not 1 <= n <= len(corpus):
    raise ValueError(f"n={n} questions requested but the corpus has {len(corpus)}; n must be in [1, {len(corpus)}]")
  return sorted(random.Random(f"{TASK}:questions:{seed}").sample(range(len(corpus)), n))


def check_num_docs(corpus: longqa.QACorpus, indices: Sequence[int], num_docs: Sequence[int]):
  """Refuses, before anything is built, a length the pool cannot fill or a question cannot fit."""
  if not num_docs:
    raise ValueError("no lengths (num_docs) given")
  most_own = max(len(corpus.examples[i].paragraphs) for i in indices)
  for n in num_docs:
    if n > len(corpus.pool):
      raise ValueError(f"num_docs={n} needs {n} distinct paragraphs but the pool has only {len(corpus.pool)}; "
                       f"this file allows lengths up to {len(corpus.pool)} documents")
    if n < most_own:
      raise ValueError(f"num_docs={n} is smaller than a question's own {most_own} paragraphs")


def build_samples(corpus: longqa.QACorpus, indices: Sequence[int], num_docs: int, seed: int) -> list[dict]:
  """One sample per question at `num_docs` documents, with the gold paragraphs' document numbers.

  Each question's padding and order come from its own generator (seed, num_docs, question id), so a
  sample depends neither on the other questions nor on the other lengths built."""
  pool = corpus.pool
  pool_set = frozenset(pool)
  samples = []
  for index in indices:
    ex = corpus.examples[index]
    rng = random.Random(f"{TASK}:{seed}:{num_docs}:{ex.id}")
    docs = longqa.pad_documents(ex.paragraphs, pool, num_docs, rng, pool_set)
    where = {d: i for i, d in enumerate(docs, start=1)}  # document numbers as the rendered text has them
    samples.append({"id": ex.id, "index": index, "question": ex.question, "answers": list(ex.answers),
                    "num_docs": num_docs, "gold_positions": sorted(where[g] for g in ex.gold),
                    "own_positions": sorted(where[p] for p in ex.paragraphs),
                    "context": longqa.render_documents(docs)})
  return samples


@dataclasses.dataclass(frozen=True)
class LengthSummary:
  """What a built length holds: its size in documents and measured tokens, and where the gold is."""
  num_docs: int
  file: str
  tokens_mean: float | None  # None: built without a tokenizer
  tokens_min: int | None
  tokens_max: int | None
  gold_positions: dict[str, list[int]]  # question id -> document numbers of its gold paragraphs


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SetSpec:
  """Which set to build: its lengths and its questions (the same at every length)."""
  num_docs: Sequence[int] | None = None  # lengths in documents (None: the paper's, as far as the pool allows)
  n: int = PAPER_QUESTIONS  # questions, drawn with `seed` (ignored when `ids` names them)
  seed: int = 0  # the questions' draw and every length's padding paragraphs and order
  ids: Sequence[str] | None = None  # HotpotQA ids of the questions (asked in the file's order)


def build_set(path: str, out_dir: str, spec: SetSpec = SetSpec(), *, tokenizer=None,
              tokenizer_name: str | None = None, progress=None) -> dict:
  """Builds RULER-HotpotQA from a HotpotQA dev-distractor JSON into out_dir; returns the manifest.

  A length the pool cannot fill is refused before any file is written. tokenizer (the project's
  Tokenizer): measures each length's tokens for the manifest. progress(num_docs): called per length."""
  corpus = longqa.load_hotpotqa(path)
  num_docs, seed = spec.num_docs, spec.seed
  lengths = tuple(paper_num_docs(len(corpus.pool)) if num_docs is None else num_docs)
  indices = choose_questions(corpus, spec.n, seed, spec.ids)
  check_num_docs(corpus, indices, lengths)
  summaries = []
  for length in lengths:
    if progress:
      progress(length)
    samples = build_samples(corpus, indices, length, seed)
    counts = None
    if tokenizer is not None:
      counts = [len(ids) for ids in tokenizer.encode_batch([s["context"] for s in samples])]
      for s, c in zip(samples, counts):
        s["context_tokens"] = c
    with atomic_write(os.path.join(out_dir, set_file(length))) as f:
      json.dump(samples, f, ensure_ascii=False)
    summaries.append(LengthSummary(
        num_docs=length, file=set_file(length), tokens_mean=round(statistics.fmean(counts), 1) if counts else None,
        tokens_min=min(counts) if counts else None, tokens_max=max(counts) if counts else None,
        gold_positions={s["id"]: s["gold_positions"] for s in samples}))
  manifest = {"task": TASK, "source": os.path.basename(path), "source_sha256": _sha256(path), "seed": seed,
              "questions": [corpus.examples[i].id for i in indices], "pool_paragraphs": len(corpus.pool),
              "tokenizer": tokenizer_name if tokenizer is not None else None,
              "lengths": [dataclasses.asdict(s) for s in summaries]}
  with atomic_write(os.path.join(out_dir, MANIFEST)) as f:
    json.dump(manifest, f, indent=1)
  return manifest


def load_manifest(set_dir: str) -> dict:
  path = os.path.join(set_dir, MANIFEST)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{set_dir} is not a built {TASK} set: no {MANIFEST} (build it with "
                            f"`memagent build-ruler-hotpotqa --input=<dev.json> --out={set_dir}`)")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def load_samples(set_dir: str, num_docs: int, n: int | None = None) -> list[dict]:
  """The first n samples (all when None) of a built length; the same questions at every length."""
  built = [entry["num_docs"] for entry in load_manifest(set_dir)["lengths"]]
  if num_docs not in built:
    raise ValueError(f"{set_dir} has no length of {num_docs} documents; built: {built}")
  with open(os.path.join(set_dir, set_file(num_docs)), encoding="utf-8") as f:
    samples = json.load(f)
  if n is not None and not 1 <= n <= len(samples):
    raise ValueError(f"n={n} but {set_dir} holds {len(samples)} questions per length; n must be in [1, {len(samples)}]")
  return samples if n is None else samples[:n]


def build_table(manifest: dict, command: str | None = None) -> str:
  """Markdown: each length's documents and measured tokens, then each question's gold positions."""
  lengths = manifest["lengths"]
  tok = manifest.get("tokenizer") or "no tokenizer"
  lines = [f"# {TASK}: the built set", ""]
  if command:
    lines += [f"Command: `{command}`", ""]
  lines += [f"Source `{manifest['source']}` (sha256 {manifest['source_sha256'][:12]}...), seed {manifest['seed']}, "
            f"{len(manifest['questions'])} questions, a pool of {manifest['pool_paragraphs']} distinct paragraphs. "
            f"Tokens measured with {tok}; the paper's names assume Qwen2.5's tokenizer.", "",
            "| documents | paper's length | context tokens mean | min | max | gold depth mean |",
            "|---|---|---|---|---|---|"]
  for e in lengths:
    depths = [(p - 0.5) / e["num_docs"] for ps in e["gold_positions"].values() for p in ps]
    fmt = lambda v: "-" if v is None else f"{v:,}"
    lines.append(f"| {e['num_docs']} | {PAPER_TOKENS.get(e['num_docs'], '-')} | {fmt(e['tokens_mean'])} | "
                 f"{fmt(e['tokens_min'])} | {fmt(e['tokens_max'])} | {statistics.fmean(depths):.2f} |")
  lines += ["", "Gold depth: (document number - 0.5) / documents, over every gold paragraph (0 = start, 1 = end).",
            "", "Document numbers of each question's gold (supporting-fact) paragraphs:", "",
            "| question id | " + " | ".join(f"{e['num_docs']} docs" for e in lengths) + " |",
            "|---|" + "---|" * len(lengths)]
  for q in manifest["questions"]:
    lines.append(f"| {q} | " + " | ".join(", ".join(map(str, e["gold_positions"][q])) for e in lengths) + " |")
  return "\n".join(lines) + "\n"
