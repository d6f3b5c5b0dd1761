"""Threefry-2x32 on XLA:CPU as straight-line code instead of a loop, bit for bit the same numbers.

JAX lowers its PRNG hash (Threefry-2x32, 20 rounds) on CPU as a `while` loop of five steps, to keep
compile times down. Inside a decode loop that runs every token, each step is a handful of tiny thunks
(loop-carried copies, counters): about 90 of a toy decode step's 350, and 1-3% of a toy sweep batch
(docs/results/toy_rl_step_speed.md). `unroll_threefry_on_cpu` registers a lowering
that writes the 20 rounds out, so XLA fuses them into a few elementwise kernels. The function is the
same integer arithmetic (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
Random123 reference), so every random number is unchanged; other platforms keep their lowering.
"""

from __future__ import annotations

import numpy as np
from jax import lax
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

# Threefry-2x32 rotation distances, round r uses _ROTATIONS[r % 8] (Random123's R_32x2_*).
_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_KEY_PARITY = np.uint32(0x1BD11BDA)  # the third key word is k0 ^ k1 ^ this constant
ROUNDS = 20


def _rotate_left(x, distance: int):
  return lax.shift_left(x, np.uint32(distance)) | lax.shift_right_logical(x, np.uint32(32 - distance))


def threefry2x32_rounds(key0, key1, count0, count1):
  """Threefry-2x32-20 of the counter words (count0, count1) under the key (key0, key1), all uint32 of
  broadcastable shapes -> the two output words. A key word is injected after every fourth round."""
  keys = (key0, key1, key0 ^ key1 ^ _KEY_PARITY)
  x0, x1 = count0 + keys[0], count1 + keys[1]
  for r in range(ROUNDS):
    x0 = x0 + x1
    x1 = _rotate_left(x1, _ROTATIONS[r % 8]) ^ x0
    if r % 4 == 3:
      s = (r + 1) // 4  # the s-th key injection: words s and s + 1 of the schedule, plus s
      x0 = x0 + keys[s % 3]
      x1 = x1 + keys[(s + 1) % 3] + np.uint32(s)
  return x0, x1


def unroll_threefry_on_cpu() -> bool:
  """Registers the unrolled lowering of JAX's threefry2x32 primitive for CPU (again is harmless);
  programs traced after it use it, already compiled ones keep theirs. True: it is registered."""
  # out of line, as JAX emits its own unrolled rule (XLA inlines it again): one copy in the module
  mlir.register_lowering(threefry2x32_p, mlir.lower_fun(threefry2x32_rounds, multiple_results=True),
                         platform="cpu", inline=False)
  return True
