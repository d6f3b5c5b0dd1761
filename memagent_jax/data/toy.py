"""The toy memory world: seeded key-value documents for CPU-scale MemAgent RL experiments.

A document is filler sentences with key-value facts ("the code of oslo is tiger .") scattered
through it. The question asks for the latest code of one key, drawn per document from
`ASKED_KEYS`; distractor facts about other keys and later overrides of the asked key (the LAST
fact about it is the answer) make "what to keep in a memory of a few tokens" a real decision
(DESIGN.md, "The toy world").

Texts use canonical spacing: every token (word or punctuation mark) separated by one space, on
one line, so `toy_tokenizer.toy_tokenizer()` counts exactly one token per space-separated item
and decode(encode(text)) == text. Lengths are in these toy tokens, and exact.

Values are chosen so that substring rewards are unambiguous: no value is inside another
vocabulary word, nor holds one (articles aside, which metrics drop; tests/test_toy.py checks
it), and the answer value appears in the document only in the last fact about the asked key.

A fact never straddles a boundary of `chunk_tokens` (the agent's chunk size: a config's
agent.chunk_tokens, passed by `tasks.make_samples`), so every fact is readable within one chunk:
the world tests what a memory keeps, not how chunking cuts a sentence. The chunk size changes where
facts may stand, so documents differ between chunk sizes (same seed, other placement).
Distractors scale with the length (`DISTRACTOR_DENSITY` per 1000 tokens), so a longer document
holds proportionally more chances to overwrite the memory with the wrong fact.
"""

from __future__ import annotations

import dataclasses
import random

TASK = "toy_kv"  # the name tasks.make_samples knows this task by

# Defaults of the toy experiments: the memory cannot hold every fact of a document.
CHUNK_TOKENS = 64  # tokens per chunk the agent reads (default; a config's agent.chunk_tokens wins)
MEMORY_TOKENS = 16  # memory cap: about two facts in sentence form
ANSWER_TOKENS = 8  # "\boxed{ tiger }" + <|im_end|> is 4
TRAIN_TOKENS = 128  # training document length (1x): 2 chunks
DISTRACTOR_DENSITY = 8.0  # distractor facts per 1000 tokens (about other keys), at least one
# Keys a question may ask about, one drawn at random per document; distractors are facts about the
# other keys (these eight included), so a document states codes of several askable keys and the
# memory (two facts) cannot keep them all: what it keeps must depend on the question. A base model
# learns this content lookup in pretraining (configs/toy_memagent.py; docs/results/probe_recall.md).
ASKED_KEYS = ("berlin", "cairo", "delhi", "lima", "oslo", "paris", "rome", "tokyo")
# The one-key world (`toy_reproduction --world=one_key`): every question asks about oslo, so the memory
# never has to depend on the question; for models too small to learn lookup by key. Its documents are
# those of toy_kv with the same seed (same RNG draws), only the question differs.
ONE_KEY_TASK = "toy_kv_one_key"
ONE_KEY = ("oslo",)
TASKS = (TASK, ONE_KEY_TASK)  # both worlds: toy-word lengths, one-word answers scored by exact match
OVERRIDE_PROB = 0.5  # chance of each further override of the asked key, up to MAX_OVERRIDES
MAX_OVERRIDES = 2
DISTRACTOR_KEYS = ("any", "askable", "mixed")  # which keys distractor facts are about (make_sample)

KEYS = ("accra", "austin", "berlin", "boston", "cairo", "dakar", "delhi", "denver", "dublin",
        "hanoi", "kyiv", "lima", "madrid", "miami", "oslo", "paris", "quito", "riga", "rome",
        "seoul", "sydney", "tokyo", "vienna", "zagreb")
VALUES = ("badger", "camel", "crab", "eagle", "frog", "gecko", "goose", "hyena", "jaguar", "koala",
          "lemur", "llama", "moose", "mouse", "otter", "parrot", "raven", "shark", "sheep",
          "squid", "tiger", "turtle", "whale", "zebra")
FILLER_WORDS = ("a", "away", "bright", "calm", "cloud", "cold", "dark", "day", "far", "field",
                "gentle", "grass", "hill", "home", "morning", "near", "night", "old", "over",
                "path", "quiet", "rain", "river", "road", "slow", "small", "soft", "song",
                "stone", "sun", "tall", "under", "valley", "walks", "warm", "water", "wind",
                "winter", "with", "young")
FACT_WORDS = ("the", "code", "of", "is", "what", "latest", ".", "?")
FACT_TOKENS = 7  # "the code of <key> is <value> ."
FILLER_MIN, FILLER_MAX = 3, 12  # filler sentence length in tokens (only a last remainder is shorter)


def vocabulary_words() -> tuple[str, ...]:
  """Every token a toy text can hold (the word tokenizer's toy part)."""
  return KEYS + VALUES + FILLER_WORDS + FACT_WORDS


def fact(key: str, value: str) -> str:
  return f"the code of {key} is {value} ."


def question(key: str) -> str:
  return f"what is the latest code of {key} ?"


def _filler_lengths(rng: random.Random, total: int) -> list[int]:
  """Sentence lengths summing to exactly `total`; all in [FILLER_MIN, FILLER_MAX] but a total
  below FILLER_MIN, which becomes one short sentence."""
  out = []
  while total > 0:
    n = total if total <= FILLER_MAX else rng.randint(FILLER_MIN, FILLER_MAX)
    if 0 < total - n < FILLER_MIN:
      n = total - FILLER_MIN  # leave a remainder that is still a full sentence
    out.append(n)
    total -= n
  return out


def _filler(rng: random.Random, n: int) -> str:
  """n tokens of filler: n - 1 words and a full stop (a lone word when n == 1)."""
  words = [rng.choice(FILLER_WORDS) for _ in range(max(1, n - 1))]
  return " ".join(words + (["."] if n > 1 else []))


def sample_rng(num_tokens: int, seed: int, index: int) -> random.Random:
  """Per-sample RNG: sample `index` is the same whatever n and order it is generated in."""
  return random.Random(f"{TASK}:{num_tokens}:{seed}:{index}")


def _fact_starts(rng: random.Random, num_tokens: int, num_facts: int, chunk_tokens: int | None,
                 late_share: float = 0.0) -> list[int]:
  """Sorted, non-overlapping start positions of `num_facts` facts, none across a chunk boundary.
  late_share: the chance that a fact goes into the last two fact lengths of its chunk (where the
  memory's residual overwrites sit), when such a place is free."""
  def fits(s: int) -> bool:
    return chunk_tokens is None or s // chunk_tokens == (s + FACT_TOKENS - 1) // chunk_tokens
  starts = [s for s in range(num_tokens - FACT_TOKENS + 1) if fits(s)]
  late = [s for s in starts if chunk_tokens and s % chunk_tokens >= chunk_tokens - 2 * FACT_TOKENS]
  taken = bytearray(num_tokens)
  out = []
  for _ in range(num_facts):
    free_late = [s for s in late if not any(taken[s:s + FACT_TOKENS])] if late_share else []
    if free_late and rng.random() < late_share:
      s = rng.choice(free_late)
    else:
      for _ in range(1000):
        s = rng.choice(starts)
        if not any(taken[s:s + FACT_TOKENS]):
          break
      else:
        raise ValueError(f"cannot place {num_facts} facts of {FACT_TOKENS} tokens in {num_tokens} tokens "
                         f"(chunk_tokens={chunk_tokens}); lower the number of distractors")
    taken[s:s + FACT_TOKENS] = b"\x01" * FACT_TOKENS
    out.append(s)
  return sorted(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Makeup:
  """The document makeup of the toy world: how many distractors, how many overrides of the asked key,
  the chunk boundaries facts keep inside, which keys are asked and what distractors are about."""
  num_distractors: int | None = None  # a fixed number of distractor facts per document
  distractor_density: float | None = None  # instead, per 1000 tokens (None: DISTRACTOR_DENSITY); give one
  override_prob: float = OVERRIDE_PROB  # chance of each further override of the asked key, in [0, 1]
  max_overrides: int = MAX_OVERRIDES  # cap on overrides of the asked key
  chunk_tokens: int | None = CHUNK_TOKENS  # no fact crosses a boundary of it (None: facts anywhere)
  asked_keys: tuple[str, ...] | None = ASKED_KEYS  # keys a question may ask about (None: any of KEYS)
  distractor_keys: str = "any"  # one of DISTRACTOR_KEYS: which keys distractors are about (make_sample)
  askable_share: float | None = None  # with "mixed": chance a distractor names an askable key (None: 0.5)
  late_fact_share: float = 0.0  # chance a fact sits at the end of its chunk (_fact_starts), in [0, 1]

  def __post_init__(self):
    if self.num_distractors is not None and self.distractor_density is not None:
      raise ValueError("give num_distractors or distractor_density, not both")
    if self.distractor_density is not None and self.distractor_density < 0:
      raise ValueError(f"distractor_density={self.distractor_density} must be >= 0")
    if self.distractor_keys not in DISTRACTOR_KEYS:
      raise ValueError(f"distractor_keys={self.distractor_keys!r}: choose one of {DISTRACTOR_KEYS}")
    if self.askable_share is not None and (self.distractor_keys != "mixed"
                                           or not 0.0 <= self.askable_share <= 1.0):
      raise ValueError(f"askable_share={self.askable_share} needs distractor_keys='mixed' (given "
                       f"{self.distractor_keys!r}) and a value in [0, 1]")
    if not 0.0 <= self.late_fact_share <= 1.0 or (self.late_fact_share and self.chunk_tokens is None):
      raise ValueError(f"late_fact_share={self.late_fact_share} needs chunks (chunk_tokens="
                       f"{self.chunk_tokens}) and a value in [0, 1]")
    if not 0.0 <= self.override_prob <= 1.0:
      raise ValueError(f"override_prob={self.override_prob} must lie in [0, 1]")
    if (self.num_distractors is not None and self.num_distractors < 0) or self.max_overrides < 0:
      raise ValueError(f"num_distractors={self.num_distractors} and max_overrides={self.max_overrides} "
                       "must be >= 0")
    if self.chunk_tokens is not None and self.chunk_tokens < FACT_TOKENS:
      raise ValueError(f"chunk_tokens={self.chunk_tokens} is shorter than one fact ({FACT_TOKENS} tokens)")
    asked = self.asked_keys
    if asked is not None and (not asked or set(asked) - set(KEYS)):
      raise ValueError(f"asked_keys={asked!r} must be a non-empty subset of toy.KEYS")
    if self.distractor_keys != "any" and asked and len(set(asked)) == 1:  # no other askable key
      raise ValueError(f"distractor_keys={self.distractor_keys!r} but no askable key other than {asked[0]!r}")
    if self.distractor_keys == "mixed" and not set(KEYS) - set(asked or KEYS):
      raise ValueError("distractor_keys='mixed' but every key is askable")

  def distractors(self, num_tokens: int) -> int:
    """Distractor facts in a document of `num_tokens` tokens: num_distractors, else the density's
    share (rounded, at least one; none at density 0)."""
    if self.num_distractors is not None:
      return self.num_distractors
    density = DISTRACTOR_DENSITY if self.distractor_density is None else self.distractor_density
    return max(1, round(density * num_tokens / 1000)) if density > 0 else 0


def make_sample(rng: random.Random, num_tokens: int, makeup: Makeup) -> dict:
  """One document of exactly `num_tokens` toy tokens, its question and answer.

  makeup.distractor_keys: "any" (distractors about any other key), "askable" (only about the other
  askable keys: rows where "keep the latest askable fact" fails and only matching the question's key
  to the fact's key answers right, what a lookup pretraining needs), or "mixed" (each distractor
  about another askable key with probability makeup.askable_share, default 0.5, else about an
  unaskable one: both kinds of tempting overwrite).
  makeup.late_fact_share: the chance that a fact sits at the end of its chunk (_fact_starts)."""
  num_distractors = makeup.distractors(num_tokens)
  asked_keys, distractor_keys = makeup.asked_keys, makeup.distractor_keys
  key = rng.choice(asked_keys or KEYS)
  overrides = 0
  while overrides < makeup.max_overrides and rng.random() < makeup.override_prob:
    overrides += 1
  asked = rng.sample(VALUES, 1 + overrides)  # distinct: only the last fact holds the answer
  answer = asked[-1]
  other_keys = [k for k in (KEYS if distractor_keys == "any" or not asked_keys else asked_keys) if k != key]
  other_values = [v for v in VALUES if v != answer]
  if distractor_keys == "mixed":
    unaskable = [k for k in KEYS if k not in (asked_keys or KEYS)]
    share = 0.5 if makeup.askable_share is None else makeup.askable_share
    pools = [other_keys if rng.random() < share else unaskable for _ in range(num_distractors)]
  else:
    pools = [other_keys] * num_distractors
  distractors = [(rng.choice(pool), rng.choice(other_values)) for pool in pools]
  num_facts = len(asked) + num_distractors
  if FACT_TOKENS * num_facts > num_tokens:
    raise ValueError(f"num_tokens={num_tokens} is too short for {num_facts} facts of "
                     f"{FACT_TOKENS} tokens each")
  starts = _fact_starts(rng, num_tokens, num_facts, makeup.chunk_tokens, makeup.late_fact_share)
  # The asked key's facts take random slots among the sorted ones and keep their order.
  asked_at = set(rng.sample(range(num_facts), len(asked)))
  asked_iter, distractor_iter = iter(asked), iter(distractors)
  placed = [(key, next(asked_iter)) if j in asked_at else next(distractor_iter) for j in range(num_facts)]
  parts, pos = [], 0
  for start, kv in zip(starts + [num_tokens], placed + [None]):
    parts += [_filler(rng, n) for n in _filler_lengths(rng, start - pos)]  # the gap, exactly
    if kv is not None:
      parts.append(fact(*kv))
    pos = start + FACT_TOKENS
  return {
      "question": question(key),
      "context": " ".join(parts),
      "answers": [answer],
      "key": key,
      "facts": [list(kv) for kv in placed],  # (key, value) in document order
      "fact_starts": starts,  # token offset of each fact
      "num_tokens": num_tokens,
      "num_overrides": overrides,
      "num_distractors": num_distractors,
  }


def generate(n: int, num_tokens: int = TRAIN_TOKENS, seed: int = 0, makeup: Makeup = Makeup()) -> list[dict]:
  """n toy samples with documents of exactly `num_tokens` toy tokens.

  Args:
    n: number of samples (indices 0..n-1; sample i does not depend on n).
    num_tokens: document length in toy tokens (question excluded).
    seed: dataset seed; same (num_tokens, seed, index) and makeup -> same sample.
    makeup: what the documents hold (Makeup, validated on construction): the number of distractor facts
      (num_distractors, or distractor_density per 1000 tokens, rounded, at least one; default
      DISTRACTOR_DENSITY, so longer documents hold proportionally more), overrides of the asked key
      (override_prob each, up to max_overrides), the chunk boundaries no fact crosses (chunk_tokens),
      the keys questions ask about (asked_keys), which keys distractors name (distractor_keys,
      askable_share) and how often a fact sits at the end of its chunk (late_fact_share).

  Returns:
    dicts with question, context, answers ([value of the last fact about key]), key, facts,
    num_tokens, num_overrides, num_distractors, task, length, seed and index (RULER's fields).
  """
  if num_tokens <= 0:
    raise ValueError(f"num_tokens must be a positive number of tokens, got {num_tokens}")
  out = []
  for i in range(n):
    s = make_sample(sample_rng(num_tokens, seed, i), num_tokens, makeup)
    out.append({**s, "task": TASK, "length": num_tokens, "seed": seed, "index": i})
  return out
