"""RULER's needle-in-a-haystack family (single, multikey, multivalue, multiquery)."""

from __future__ import annotations

import dataclasses
import random
from typing import Callable

from memagent_jax.data import needles as N
from memagent_jax.data.fitting import fit_size, guess_size
from memagent_jax.data.haystack import NOISE_SENTENCE, Essay
from memagent_jax.data.tokens import TokenCounter

HAYSTACKS = ("noise", "essay", "needle")


@dataclasses.dataclass(frozen=True)
class NiahSpec:
  """One NIAH variant: haystack type, needle key/value kinds and needle counts."""
  haystack: str  # "noise" | "essay" | "needle" (a haystack made of other needles)
  key_kind: str = "words"
  value_kind: str = "numbers"
  num_keys: int = 1  # needles with distinct keys: the queried ones plus distractors
  num_values: int = 1  # values per key (all must be returned)
  num_queries: int = 1  # keys asked about
  # (adjectives, nouns) that "words" keys and values are drawn from
  words: tuple[tuple[str, ...], tuple[str, ...]] = dataclasses.field(default=N.WORDS, repr=False)

  def __post_init__(self):
    if self.haystack not in HAYSTACKS:
      raise ValueError(f"unknown haystack {self.haystack!r}; known: {', '.join(HAYSTACKS)}")
    if not 1 <= self.num_queries <= self.num_keys:
      raise ValueError(f"need 1 <= num_queries <= num_keys, got {self.num_queries}, "
                       f"{self.num_keys}")


def _question(spec: NiahSpec, keys: list[str]) -> str:
  if spec.num_queries * spec.num_values == 1:
    return (f"What is the special magic {spec.value_kind[:-1]} for {keys[0]} mentioned in the "
            "provided text?")
  return (f"What are all the special magic {spec.value_kind} for {N.join_keys(keys)} mentioned "
          "in the provided text?")


class _NeedleFiller:
  """Endless filler needles with fresh keys/values that never collide with the real ones."""

  def __init__(self, spec: NiahSpec, seed: int, real_keys: set[str], real_values: set[str]):
    self._rng = random.Random(seed)
    self._spec = spec
    self._bad_keys, self._bad_values = real_keys, real_values
    self._units: list[str] = []

  def __call__(self, i: int) -> str:
    while len(self._units) <= i:
      key = N.random_item(self._rng, self._spec.key_kind, self._spec.words)
      value = N.random_item(self._rng, self._spec.value_kind, self._spec.words)
      if key in self._bad_keys or value in self._bad_values:
        continue
      self._units.append(N.needle(self._spec.value_kind, key, value))
    return self._units[i]


def _haystack_unit(spec: NiahSpec, rng: random.Random, keys: set[str],
                   values: set[str]) -> tuple[Callable[[int], str], str]:
  """(unit(i) -> i-th haystack unit, separator); units are a stable, seeded stream."""
  if spec.haystack == "noise":
    return (lambda i: NOISE_SENTENCE), "\n"
  if spec.haystack == "essay":
    return Essay(rng.getrandbits(64)).sentence, " "
  return _NeedleFiller(spec, rng.getrandbits(64), keys, values), "\n"


def make_niah(spec: NiahSpec, rng: random.Random, length: int,
              counter: TokenCounter) -> dict:
  """One sample whose context has as many tokens as fit in `length` (context only)."""
  used_keys: set[str] = set()
  used_values: set[str] = set()
  keys = N.distinct_items(rng, spec.key_kind, spec.num_keys, used_keys, spec.words)
  values = [N.distinct_items(rng, spec.value_kind, spec.num_values, used_values, spec.words) for _ in keys]
  needles = [N.needle(spec.value_kind, k, v) for k, vs in zip(keys, values) for v in vs]
  rng.shuffle(needles)
  depths = sorted(rng.random() for _ in needles)
  queried = rng.sample(range(spec.num_keys), spec.num_queries)
  unit, sep = _haystack_unit(spec, rng, set(used_keys), set(used_values))

  def render(n: int) -> str:
    return sep.join(N.insert_at_depths([unit(i) for i in range(n)], needles, depths))

  budget = length - sum(counter.piece(sep + x) for x in needles)
  guess = guess_size(lambda i: counter.piece(sep + unit(i)), budget)
  n, context, num_tokens = fit_size(render, length, counter.count, guess,
                                    what=f"{len(needles)} needle(s)")
  return {
      "question": _question(spec, [keys[i] for i in queried]),
      "context": context,
      "answers": [v for i in queried for v in values[i]],
      "num_tokens": num_tokens,
      "haystack_size": n,
  }
