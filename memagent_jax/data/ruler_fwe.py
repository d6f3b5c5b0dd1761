"""RULER's frequent words extraction: coded words with Zipf counts; find the top three."""

from __future__ import annotations

import random
import string

from memagent_jax.data.fitting import fit_size
from memagent_jax.data.tokens import TokenCounter

NOISE_WORD = "...."  # the most frequent "word": dots the question says to ignore


def _vocab(rng: random.Random, size: int, word_len: int) -> list[str]:
  """size distinct random lowercase words; rank 0 is replaced by the dots."""
  seen: set[str] = set()
  vocab: list[str] = []
  while len(vocab) < size:
    w = "".join(rng.choices(string.ascii_lowercase, k=word_len))
    if w not in seen:
      seen.add(w)
      vocab.append(w)
  vocab[0] = NOISE_WORD
  return vocab


def zipf_counts(total: int, size: int, alpha: float) -> list[int]:
  """floor(total * k^-alpha / sum_j j^-alpha) for ranks k = 1..size (deterministic counts)."""
  weights = [k ** -alpha for k in range(1, size + 1)]
  z = sum(weights)
  return [int(total * w / z) for w in weights]


def make_fwe(rng: random.Random, length: int, counter: TokenCounter, alpha: float = 2.0,
             word_len: int = 6, vocab_size: int | None = None) -> dict:
  """Answer: the three most frequent coded words (ranks 2-4; rank 1 is the dots)."""
  size = max(vocab_size or length // 50, 16)
  vocab = _vocab(rng, size, word_len)
  shuffle_seed = rng.getrandbits(64)

  def render(total: int) -> str:
    words = [w for w, c in zip(vocab, zipf_counts(total, size, alpha)) for _ in range(c)]
    random.Random(shuffle_seed).shuffle(words)
    return " ".join(words)

  def estimate(total: int) -> int:
    return sum(c * counter.piece(" " + w)
               for w, c in zip(vocab, zipf_counts(total, size, alpha)) if c)

  lo, hi = 0, 1  # additive estimate of the fit, by doubling + bisection
  while estimate(hi) <= length:
    lo, hi = hi, hi * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if estimate(mid) <= length else (lo, mid)
  total, context, num_tokens = fit_size(render, length, counter.count, lo, what="coded text")
  counts = zipf_counts(total, size, alpha)
  if not counts[1] > counts[2] > counts[3] > counts[4]:
    raise ValueError(f"length={length} tokens is too small for fwe: the top-3 word counts "
                     f"{counts[1:5]} are not distinct")
  return {
      "question": ("Read the coded text and track the frequency of each coded word. Ignore the "
                   f"dots '{NOISE_WORD}'. What are the three most frequently appeared coded "
                   "words in the provided text?"),
      "context": context,
      "answers": vocab[1:4],
      "num_tokens": num_tokens,
      "haystack_size": total,
  }
