"""RULER's variable tracking: follow `VAR Y = VAR X` chains hidden in noise."""

from __future__ import annotations

import random
import string

from memagent_jax.data import needles as N
from memagent_jax.data.fitting import fit_size, guess_size
from memagent_jax.data.haystack import NOISE_SENTENCE
from memagent_jax.data.tokens import TokenCounter


def _names(rng: random.Random, k: int) -> list[str]:
  """k distinct 5-letter uppercase variable names."""
  out: list[str] = []
  seen: set[str] = set()
  while len(out) < k:
    name = "".join(rng.choices(string.ascii_uppercase, k=5))
    if name not in seen and name != "VAR":
      seen.add(name)
      out.append(name)
  return out


def make_vt(rng: random.Random, length: int, counter: TokenCounter, num_chains: int = 1,
            num_hops: int = 4) -> dict:
  """Chain 0 is queried; the other chains hold other values and act as distractors."""
  if num_chains < 1 or num_hops < 0:
    raise ValueError(f"need num_chains >= 1 and num_hops >= 0, got {num_chains}, {num_hops}")
  names = _names(rng, num_chains * (num_hops + 1))
  values = [str(v) for v in rng.sample(range(10000, 100000), num_chains)]  # 5 digits, distinct
  chains = []
  for c in range(num_chains):
    vs = names[c * (num_hops + 1):(c + 1) * (num_hops + 1)]
    chains.append([f"VAR {vs[0]} = {values[c]}"] + [f"VAR {vs[j + 1]} = VAR {vs[j]}"
                                                    for j in range(num_hops)])
  # Each chain keeps its order: its statements get sorted depths; then all are merged.
  placed = []
  for c, chain in enumerate(chains):
    ds = sorted(rng.random() for _ in chain)
    placed += [(d, c, j, s) for j, (d, s) in enumerate(zip(ds, chain))]
  placed.sort()
  statements = [p[3] for p in placed]
  depths = [p[0] for p in placed]

  def render(n: int) -> str:
    return "\n".join(N.insert_at_depths([NOISE_SENTENCE] * n, statements, depths))

  budget = length - sum(counter.piece("\n" + s) for s in statements)
  guess = guess_size(lambda i: counter.piece("\n" + NOISE_SENTENCE), budget)
  n, context, num_tokens = fit_size(render, length, counter.count, guess,
                                    what=f"{len(statements)} variable assignment(s)")
  return {
      "question": ("Memorize and track the chain(s) of variable assignment hidden in the "
                   f"provided text. Find all variables that are assigned the value {values[0]} "
                   "in the provided text."),
      "context": context,
      "answers": names[:num_hops + 1],
      "num_tokens": num_tokens,
      "haystack_size": n,
  }
