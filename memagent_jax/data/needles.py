"""Needle sentences and their random keys/values (numbers, uuids, adjective-noun words)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence

from memagent_jax.data import words as W

NEEDLE = "One of the special magic {kind} for {key} is: {value}."
KINDS = ("numbers", "uuids", "words")


def needle(kind: str, key: str, value: str) -> str:
  return NEEDLE.format(kind=kind, key=key, value=value)


WORDS = (W.KEY_ADJECTIVES, W.KEY_NOUNS)  # what "adjective-noun" word items are drawn from


def random_item(rng: random.Random, kind: str, words: tuple[Sequence[str], Sequence[str]] = WORDS) -> str:
  """A 7-digit number, a version-4 uuid, or an "adjective-noun" word (from `words`), as RULER draws them."""
  if kind == "numbers":
    return str(rng.randint(10**6, 10**7 - 1))
  if kind == "uuids":
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))
  if kind == "words":
    return f"{rng.choice(words[0])}-{rng.choice(words[1])}"
  raise ValueError(f"unknown needle kind {kind!r}; known: {', '.join(KINDS)}")


def distinct_items(rng: random.Random, kind: str, k: int, exclude: set[str],
                   words: tuple[Sequence[str], Sequence[str]] = WORDS) -> list[str]:
  """k new items not in `exclude`; adds them to `exclude` so answers are never ambiguous."""
  out = []
  while len(out) < k:
    item = random_item(rng, kind, words)
    if item not in exclude:
      exclude.add(item)
      out.append(item)
  return out


def join_keys(keys: list[str]) -> str:
  """'a', 'a and b', 'a, b, and c' (RULER's query phrasing)."""
  if len(keys) == 1:
    return keys[0]
  if len(keys) == 2:
    return f"{keys[0]} and {keys[1]}"
  return ", ".join(keys[:-1]) + ", and " + keys[-1]


def insert_at_depths(units: list[str], items: list[str], depths: list[float]) -> list[str]:
  """Inserts items (in order) between units at fractional depths in [0, 1] (sorted)."""
  out, prev = [], 0
  n = len(units)
  for item, depth in zip(items, depths):
    pos = min(max(round(depth * n), prev), n)
    out.extend(units[prev:pos])
    out.append(item)
    prev = pos
  out.extend(units[prev:])
  return out
