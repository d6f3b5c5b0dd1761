"""Token counting for length fitting: a tokenizer or a plain `str -> int` callable, cached."""

from __future__ import annotations

from typing import Callable, Union


TokenizerOrCounter = Union[Callable[[str], int], object]  # an object with encode(str) -> list[int]

WHITESPACE = "whitespace"  # a model-free counter: one token per whitespace-separated word


def whitespace_count(text: str) -> int:
  """Cheap, tokenizer-free count (tests, toy data)."""
  return len(text.split())


class TokenCounter:
  """Counts tokens of texts; memoizes short repeated pieces (haystack units, needles)."""

  def __init__(self, tokenizer_or_counter: TokenizerOrCounter):
    if isinstance(tokenizer_or_counter, TokenCounter):
      tokenizer_or_counter = tokenizer_or_counter.count
    self._fn = as_counter(tokenizer_or_counter)
    self._cache: dict[str, int] = {}

  def count(self, text: str) -> int:
    """Exact token count of a whole text (not cached: texts may be megabytes)."""
    return self._fn(text)

  def piece(self, text: str) -> int:
    """Cached count of a short piece, e.g. "\\n" + a haystack sentence."""
    n = self._cache.get(text)
    if n is None:
      n = self._cache[text] = self._fn(text)
    return n

  __call__ = count


def as_counter(tokenizer_or_counter: TokenizerOrCounter) -> Callable[[str], int]:
  """A tokenizer with `encode` becomes `len(encode(text))`; callables pass through."""
  if isinstance(tokenizer_or_counter, TokenCounter):
    return tokenizer_or_counter.count
  encode = getattr(tokenizer_or_counter, "encode", None)
  if callable(encode):
    return lambda text: len(encode(text))
  if callable(tokenizer_or_counter):
    return tokenizer_or_counter
  raise TypeError(f"expected a tokenizer with encode() or a Callable[[str], int], got "
                  f"{type(tokenizer_or_counter).__name__}")
