"""`DecodeSpec`: how the next token is picked (temperature, top-p, top-k), translated once.

The user's three numbers become the switches the compiled sampler branches on (greedy, top-k,
top-p on or off) here and nowhere else. The spec is a pytree: the switches are its static
structure (part of the jit cache key), temperature, top-p and the divisor its traced leaves, so a new
temperature reuses the compiled program.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import numpy as np

MIN_TEMPERATURE = 1e-6  # sampled logits are divided by max(temperature, this): never by ~0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeSpec:
  """temperature 0 = greedy (argmax); top_k 0 = off; top_p 1 = off. Checks itself on construction."""
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  greedy: bool = dataclasses.field(init=False)  # temperature == 0: argmax, no sampling
  use_top_p: bool = dataclasses.field(init=False)  # top_p < 1: the nucleus filter runs
  divisor: float = dataclasses.field(init=False)  # max(temperature, MIN_TEMPERATURE): what logits are divided by

  def __post_init__(self):
    t, p, k = self.temperature, self.top_p, self.top_k
    real = lambda x: isinstance(x, numbers.Real) and not isinstance(x, bool)
    if not real(t) or not math.isfinite(t) or t < 0:
      raise ValueError(f"temperature={t!r} must be a finite number >= 0 (0 = greedy)")
    if not real(p) or not 0 < p <= 1:
      raise ValueError(f"top_p={p!r} must be a number in (0, 1] (1 = off)")
    if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 0:
      raise ValueError(f"top_k={k!r} must be an integer >= 0 (0 = off)")
    for name, value in (("temperature", float(t)), ("top_p", float(p)), ("top_k", int(k)),
                        ("greedy", bool(t == 0)), ("use_top_p", bool(p < 1)),
                        ("divisor", max(float(t), MIN_TEMPERATURE))):
      object.__setattr__(self, name, value)


GREEDY = DecodeSpec()  # argmax decoding, no truncation


_LEAVES, _STATIC = ("temperature", "top_p", "divisor"), ("top_k", "greedy", "use_top_p")


def _flatten(spec: DecodeSpec):
  """Leaves go to a jitted program as float32 scalars, computed on the host (as the sampler always took them)."""
  leaf = lambda x: np.float32(x) if isinstance(x, float) else x
  return tuple(leaf(getattr(spec, n)) for n in _LEAVES), tuple(getattr(spec, n) for n in _STATIC)


def _unflatten(static, leaves) -> DecodeSpec:
  """Rebuilds a spec around traced (or abstract) leaves without re-running the checks."""
  spec = object.__new__(DecodeSpec)
  for name, value in zip(_LEAVES + _STATIC, (*leaves, *static)):
    object.__setattr__(spec, name, value)
  return spec


jax.tree_util.register_pytree_node(DecodeSpec, _flatten, _unflatten)
