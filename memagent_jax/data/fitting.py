"""Fits a generated text to a token budget by searching on its haystack size."""

from __future__ import annotations

from typing import Callable


def guess_size(unit_cost: Callable[[int], int], budget: int, limit: int = 1 << 30) -> int:
  """Largest n with sum(unit_cost(i) for i < n) <= budget: an additive estimate of the fit."""
  total, n = 0, 0
  while n < limit:
    total += unit_cost(n)
    if total > budget:
      return n
    n += 1
  return n


def fit_size(render: Callable[[int], str], target: int, count: Callable[[str], int],
             guess: int = 0, what: str = "text") -> tuple[int, str, int]:
  """Largest haystack size n with count(render(n)) <= target -> (n, text, num_tokens).

  Exact counts are monotone in n (each unit adds tokens), so we gallop from the
  additive `guess` to bracket the answer, then binary-search; a good guess costs
  two or three full tokenizations.
  """
  counts: dict[int, int] = {}

  def tokens(n: int) -> int:
    if n not in counts:
      counts[n] = count(render(n))
    return counts[n]

  if tokens(0) > target:
    raise ValueError(f"length={target} tokens is too small: the {what} needs {tokens(0)} tokens "
                     "before any haystack is added")
  n0 = max(guess, 0)
  if tokens(n0) <= target:  # gallop up: lo fits, hi does not
    lo, step = n0, 1
    while tokens(lo + step) <= target:
      lo, step = lo + step, step * 2
    hi = lo + step
  else:  # gallop down
    hi, step = n0, 1
    while tokens(max(hi - step, 0)) > target:
      hi, step = max(hi - step, 0), step * 2
    lo = max(hi - step, 0)
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if tokens(mid) <= target:
      lo = mid
    else:
      hi = mid
  return lo, render(lo), tokens(lo)
