"""The toy memory world: seeded key-value documents for CPU-scale MemAgent RL experiments.

A document is filler sentences with key-value facts ("the code of oslo is tiger .") scattered
through it. The question asks for the latest code of one key; distractor facts about other keys
and later overrides of the asked key (the LAST fact about it is the answer) make "what to keep
in a memory of a few tokens" a real decision (DESIGN.md, "The toy world").

Texts use canonical spacing: every token (word or punctuation mark) separated by one space, on
one line, so `word_tokenizer.toy_tokenizer()` counts exactly one token per space-separated item
and decode(encode(text)) == text. Lengths are in these toy tokens, and exact.

Values are chosen so that substring rewards are unambiguous: no value is inside another
vocabulary word, nor holds one (articles aside, which metrics drop; tests/test_toy.py checks
it), and the answer value appears in the document only in the last fact about the asked key.
"""

from __future__ import annotations

import random

TASK = "toy_kv"  # the name evaluation.make_samples knows this task by

# Defaults of the toy experiments: the memory cannot hold every fact of a document.
CHUNK_TOKENS = 64  # tokens per chunk the agent reads
MEMORY_TOKENS = 16  # memory cap: about two facts in sentence form
ANSWER_TOKENS = 8  # "\boxed{ tiger }" + <|im_end|> is 4
TRAIN_TOKENS = 512  # training document length: 8 chunks
NUM_DISTRACTORS = 6  # distractor facts per document (about other keys)
OVERRIDE_PROB = 0.5  # chance of each further override of the asked key, up to MAX_OVERRIDES
MAX_OVERRIDES = 2

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


def make_sample(rng: random.Random, num_tokens: int, num_distractors: int = NUM_DISTRACTORS,
                override_prob: float = OVERRIDE_PROB, max_overrides: int = MAX_OVERRIDES) -> dict:
  """One document of exactly `num_tokens` toy tokens, its question and answer."""
  if not 0.0 <= override_prob <= 1.0:
    raise ValueError(f"override_prob={override_prob} must lie in [0, 1]")
  if num_distractors < 0 or max_overrides < 0:
    raise ValueError(f"num_distractors={num_distractors} and max_overrides={max_overrides} "
                     "must be >= 0")
  key = rng.choice(KEYS)
  overrides = 0
  while overrides < max_overrides and rng.random() < override_prob:
    overrides += 1
  asked = rng.sample(VALUES, 1 + overrides)  # distinct: only the last fact holds the answer
  answer = asked[-1]
  other_keys = [k for k in KEYS if k != key]
  other_values = [v for v in VALUES if v != answer]
  distractors = [(rng.choice(other_keys), rng.choice(other_values)) for _ in range(num_distractors)]
  num_facts = len(asked) + num_distractors
  filler_total = num_tokens - FACT_TOKENS * num_facts
  if filler_total < 0:
    raise ValueError(f"num_tokens={num_tokens} is too short for {num_facts} facts of "
                     f"{FACT_TOKENS} tokens each")
  fillers = [_filler(rng, n) for n in _filler_lengths(rng, filler_total)]
  # Facts go between filler sentences at uniform slots; the asked key's facts keep their order.
  slots = sorted(rng.randint(0, len(fillers)) for _ in range(num_facts))
  asked_at = set(rng.sample(range(num_facts), len(asked)))
  asked_iter, distractor_iter = iter(asked), iter(distractors)
  placed = [(slot, (key, next(asked_iter)) if j in asked_at else next(distractor_iter))
            for j, slot in enumerate(slots)]
  parts, p = [], 0
  for i in range(len(fillers) + 1):
    while p < len(placed) and placed[p][0] == i:
      parts.append(fact(*placed[p][1]))
      p += 1
    if i < len(fillers):
      parts.append(fillers[i])
  return {
      "question": question(key),
      "context": " ".join(parts),
      "answers": [answer],
      "key": key,
      "facts": [list(kv) for _, kv in placed],  # (key, value) in document order
      "num_tokens": num_tokens,
      "num_overrides": overrides,
      "num_distractors": num_distractors,
  }


def generate(n: int, num_tokens: int = TRAIN_TOKENS, seed: int = 0,
             num_distractors: int | None = None, distractor_density: float | None = None,
             override_prob: float = OVERRIDE_PROB, max_overrides: int = MAX_OVERRIDES) -> list[dict]:
  """n toy samples with documents of exactly `num_tokens` toy tokens.

  Args:
    n: number of samples (indices 0..n-1; sample i does not depend on n).
    num_tokens: document length in toy tokens (question excluded).
    seed: dataset seed; same (num_tokens, seed, index) and options -> same sample.
    num_distractors: distractor facts per document (default NUM_DISTRACTORS).
    distractor_density: instead, distractor facts per 1000 tokens (rounded), so that longer
      documents hold proportionally more; give at most one of the two.
    override_prob: chance of each further override of the asked key (0: never, 1: always
      max_overrides).
    max_overrides: cap on overrides of the asked key.

  Returns:
    dicts with question, context, answers ([value of the last fact about key]), key, facts,
    num_tokens, num_overrides, num_distractors, task, length, seed and index (RULER's fields).
  """
  if num_distractors is not None and distractor_density is not None:
    raise ValueError("give num_distractors or distractor_density, not both")
  if distractor_density is not None:
    num_distractors = round(distractor_density * num_tokens / 1000)
  elif num_distractors is None:
    num_distractors = NUM_DISTRACTORS
  if num_tokens <= 0:
    raise ValueError(f"num_tokens must be a positive number of tokens, got {num_tokens}")
  out = []
  for i in range(n):
    s = make_sample(sample_rng(num_tokens, seed, i), num_tokens, num_distractors, override_prob,
                    max_overrides)
    out.append({**s, "task": TASK, "length": num_tokens, "seed": seed, "index": i})
  return out
