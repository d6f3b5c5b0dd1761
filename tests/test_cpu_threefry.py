"""runtime/cpu_threefry: the unrolled Threefry-2x32 gives the reference's known answers and JAX's own
random numbers bit for bit, and importing memagent_jax puts it in force on CPU (no loop in the program)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

import memagent_jax  # noqa: F401  (registers the lowering at import)
from memagent_jax.runtime import cpu_host, cpu_threefry

# Random123's known-answer vectors for threefry2x32_20 (kat_vectors): key, counter -> output words.
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]

# Random numbers the samplers draw, in one jitted program; printed as lists so two processes compare.
_DRAWS = """
import json, jax, jax.numpy as jnp, numpy as np
def draws(seed):
  key = jax.random.PRNGKey(seed)
  rows = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(5, dtype=jnp.uint32))  # [5, 2]
  steps = jax.vmap(jax.random.fold_in, in_axes=(0, None))(rows, jnp.uint32(7))
  logits = jnp.linspace(-3.0, 3.0, 5 * 193).reshape(5, 193)
  return dict(bits=jax.random.bits(key, (3, 7)), odd=jax.random.bits(key, (5,)), split=jax.random.split(key, 3),
              uniform=jax.random.uniform(key, (4, 9)), rows=rows,
              categorical=jax.vmap(jax.random.categorical)(steps, logits),
              gumbel=jax.vmap(lambda k: jax.random.gumbel(k, (193,)))(steps))
fn = jax.jit(draws)
hlo = fn.lower(0).compile().as_text()
out = {k: np.asarray(v).tolist() for k, v in fn(1234).items()}
jax.config.update("jax_threefry_partitionable", False)  # the other counter layout: odd sizes are padded
odd = jax.jit(lambda k: (jax.random.bits(k, (5,)), jax.random.bits(k, (3, 7)), jax.random.split(k, 3)))
out["original_layout"] = [np.asarray(v).tolist() for v in odd(jax.random.PRNGKey(99))]
"""


def test_rounds_give_the_reference_known_answers():
  for key, count, want in KNOWN_ANSWERS:
    words = [np.asarray([w], np.uint32) for w in key + count]
    got = cpu_threefry.threefry2x32_rounds(*words)
    assert [int(np.asarray(g)[0]) for g in got] == list(want), (key, count)


@pytest.mark.skipif(os.environ.get(cpu_host.ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"),
                    reason="the CPU host settings are switched off in this process")
def test_import_registers_it_and_jax_random_runs_without_a_loop():
  assert cpu_host.tune_cpu_host()["unrolled_threefry"] is True
  key, count, want = KNOWN_ANSWERS[2]
  fn = jax.jit(lambda k, c: threefry_2x32(k, c))
  args = (jnp.asarray(key, jnp.uint32), jnp.asarray(count, jnp.uint32))
  assert [int(x) for x in fn(*args)] == list(want)
  assert "while" not in fn.lower(*args).compile().as_text()  # JAX's CPU lowering is a five-step loop


def test_random_numbers_equal_jax_stock_lowering_bit_for_bit():
  """Keys, bits, uniform, Gumbel and categorical draws of the samplers' kind, and bits and keys in JAX's
  other counter layout (odd sizes padded), against a process with the settings off (JAX's own five-step
  loop on CPU)."""
  code = _DRAWS + "print(json.dumps(dict(out=out, has_loop='while' in hlo)))"
  runs = {}
  for setting in ("1", "0"):
    env = dict(os.environ, **{cpu_host.ENV_VAR: setting})
    done = subprocess.run([sys.executable, "-c", "import memagent_jax\n" + code], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    runs[setting] = json.loads(done.stdout.strip().splitlines()[-1])
  assert runs["0"]["has_loop"] and not runs["1"]["has_loop"]  # stock vs unrolled, as the setting says
  assert runs["1"]["out"] == runs["0"]["out"]
  assert len(set(map(str, runs["1"]["out"]["categorical"]))) > 1  # the draws are not degenerate
