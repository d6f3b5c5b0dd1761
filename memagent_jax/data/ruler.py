"""RULER-style synthetic tasks (arXiv 2404.06654) fitted to a token length, seeded.

`length` is the token budget of the *context* (the document MemAgent reads chunk by
chunk); the question is separate and not counted. Each context is fitted by searching
the haystack size so that `num_tokens <= length` and as large as possible.
"""

from __future__ import annotations

import functools
import random
from typing import Callable

from memagent_jax.data.ruler_fwe import make_fwe
from memagent_jax.data.ruler_niah import NiahSpec, make_niah
from memagent_jax.data.ruler_vt import make_vt
from memagent_jax.data.tokens import TokenCounter, TokenizerOrCounter

NIAH_SPECS = {
    "niah_single_1": NiahSpec("noise", "words", "numbers"),
    "niah_single_2": NiahSpec("essay", "words", "numbers"),
    "niah_single_3": NiahSpec("essay", "words", "uuids"),
    "niah_multikey_1": NiahSpec("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NiahSpec("needle", "words", "numbers"),
    "niah_multikey_3": NiahSpec("needle", "uuids", "uuids"),
    "niah_multivalue": NiahSpec("essay", "words", "numbers", num_values=4),
    "niah_multiquery": NiahSpec("essay", "words", "numbers", num_keys=4, num_queries=4),
}

# name -> make(rng, length, counter, **options) -> {question, context, answers, num_tokens, ...}
TASKS: dict[str, Callable[..., dict]] = {
    **{name: functools.partial(make_niah, spec) for name, spec in NIAH_SPECS.items()},
    "vt": make_vt,
    "fwe": make_fwe,
}


def _check(task: str, length: int):
  if task not in TASKS:
    raise ValueError(f"unknown RULER task {task!r}; known: {', '.join(TASKS)}")
  if length <= 0:
    raise ValueError(f"length must be a positive number of tokens, got {length}")


def sample_rng(task: str, length: int, seed: int, index: int) -> random.Random:
  """Per-sample RNG: samples are independent of n and of generation order."""
  return random.Random(f"ruler:{task}:{length}:{seed}:{index}")


def generate_one(task: str, length: int, seed: int, index: int,
                 tokenizer: TokenizerOrCounter, **options) -> dict:
  """Sample `index` of the (task, length, seed) set; see `generate`."""
  _check(task, length)
  counter = tokenizer if isinstance(tokenizer, TokenCounter) else TokenCounter(tokenizer)
  out = TASKS[task](sample_rng(task, length, seed, index), length, counter, **options)
  return {**out, "task": task, "length": length, "seed": seed, "index": index}


def generate(task: str, length: int, n: int = 1, seed: int = 0, *,
             tokenizer: TokenizerOrCounter, **options) -> list[dict]:
  """n samples of `task` with contexts of at most `length` tokens.

  Args:
    task: a key of `TASKS`.
    length: token budget of the context (question excluded).
    n: number of samples (indices 0..n-1).
    seed: dataset seed; same (task, length, seed, index) -> same sample.
    tokenizer: an object with `encode(str) -> list[int]`, a `Callable[[str], int]`
      token counter.
    **options: task options (vt: num_chains, num_hops; fwe: alpha, word_len, vocab_size).

  Returns:
    dicts with question, context, answers (list[str]), task, length, num_tokens,
    haystack_size, seed and index.
  """
  _check(task, length)
  counter = tokenizer if isinstance(tokenizer, TokenCounter) else TokenCounter(tokenizer)
  return [generate_one(task, length, seed, i, counter, **options) for i in range(n)]
