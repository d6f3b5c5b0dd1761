"""Filler text for needle tasks: RULER's noise sentence and an offline, seeded "essay".

RULER fills its essay haystack with Paul Graham essays; those are not shipped, so the
essay here is plain English generated from a small grammar (memagent_jax.data.words):
varied, natural-looking sentences with no digits, hyphens or "magic" words.
"""

from __future__ import annotations

import random

from memagent_jax.data import words as W

NOISE_SENTENCE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again.")


def _cap(s: str) -> str:
  return s[:1].upper() + s[1:]


def _a(word: str) -> str:
  return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _subject(rng: random.Random) -> str:
  r = rng.random()
  if r < 0.3:
    return rng.choice(W.NAMES)
  if r < 0.6:
    return f"the {rng.choice(W.ADJECTIVES)} {rng.choice(W.NOUNS)}"
  if r < 0.8:
    return f"{rng.choice(('my', 'our', 'their', 'his', 'her'))} {rng.choice(W.NOUNS)}"
  return _a(rng.choice(W.NOUNS))


def _object(rng: random.Random) -> str:
  if rng.random() < 0.5:
    return f"the {rng.choice(W.NOUNS)}"
  return f"{_a(rng.choice(W.ADJECTIVES))} {rng.choice(W.NOUNS)}"


def _clause(rng: random.Random) -> str:
  if rng.random() < 0.55:
    return f"{_subject(rng)} {rng.choice(W.VERBS_TRANSITIVE)} {_object(rng)}"
  return f"{_subject(rng)} {rng.choice(W.VERBS_INTRANSITIVE)} {rng.choice(W.ADVERBS)}"


def essay_sentence(rng: random.Random) -> str:
  """One sentence from a handful of templates; all randomness comes from `rng`."""
  kind = rng.randrange(8)
  if kind == 0:
    s = f"{_clause(rng)} {rng.choice(W.PLACES)}"
  elif kind == 1:
    s = f"{rng.choice(W.OPENERS)}, {_clause(rng)}"
  elif kind == 2:
    s = f"{_clause(rng)} {rng.choice(W.CONNECTIVES)} {_clause(rng)}"
  elif kind == 3:
    s = f"{_clause(rng)} {rng.choice(W.TIMES)}"
  elif kind == 4:
    s = (f"it was {rng.choice(W.ADJECTIVES)} and {rng.choice(W.ADJECTIVES)} "
         f"{rng.choice(W.PLACES)}, so {_clause(rng)}")
  elif kind == 5:
    s = (f"nobody knew why {_subject(rng)} {rng.choice(W.VERBS_TRANSITIVE)} {_object(rng)} "
         f"{rng.choice(W.TIMES)}")
  elif kind == 6:
    s = f"{_clause(rng)}, and {_clause(rng)}"
  else:
    return _cap(f"did {_subject(rng)} really think about {_object(rng)} {rng.choice(W.TIMES)}?")
  return _cap(s) + "."


class Essay:
  """An endless, seeded stream of essay sentences; `sentences(n)` is a stable prefix."""

  def __init__(self, seed: int | str = 0):
    self._rng = random.Random(f"essay:{seed}")
    self._sentences: list[str] = []

  def sentence(self, i: int) -> str:
    while len(self._sentences) <= i:
      self._sentences.append(essay_sentence(self._rng))
    return self._sentences[i]

  def sentences(self, n: int) -> list[str]:
    if n > 0:
      self.sentence(n - 1)
    return self._sentences[:n]
