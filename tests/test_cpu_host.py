"""runtime/cpu_host: importing memagent_jax keeps XLA:CPU's per-call temporaries in the process (no page
faults on repeated calls), can be turned off, and says so when JAX started first."""

import json
import os
import subprocess
import sys

import pytest

from memagent_jax.runtime import cpu_host

# A program whose temporary (the [4096, 4096] product, 64 MB: above glibc's largest mmap threshold)
# is allocated and freed by every call; prints what the process's settings are and the pages it
# faulted in per call after the first two (the median of 5 calls: a rare one-off re-fault of the heap,
# seen once in a full suite run, is not the per-call mechanism this measures).
_PROBE = """
import json, resource, sys
import memagent_jax, jax, jax.numpy as jnp
from memagent_jax.runtime import cpu_host
f = jax.jit(lambda x: jnp.sort(x @ x.T, axis=1)[:, :4])
x = jnp.ones((4096, 64), jnp.float32)
jax.block_until_ready(f(x))
jax.block_until_ready(f(x))  # the heap settles in two calls
per_call = []
for _ in range(5):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  jax.block_until_ready(f(x))
  per_call.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
faults = sorted(per_call)[2]
print(json.dumps(dict(settings=cpu_host.tune_cpu_host(),
                      async_dispatch=jax.config.values["jax_cpu_enable_async_dispatch"], faults=faults)))
"""


def _probe(setting: str | None) -> dict:
  env = dict(os.environ)
  env.pop(cpu_host.ENV_VAR, None)
  if setting is not None:
    env[cpu_host.ENV_VAR] = setting
  out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(cpu_host._glibc() is None, reason="mallopt's thresholds are glibc's")
def test_import_keeps_cpu_temporaries_resident_and_the_switch_turns_it_off():
  """[4096, 4096] fp32 temporaries (64 MB) are faulted in anew on every call by default glibc;
  with the settings a call after the first faults almost nothing."""
  on, off = _probe(None), _probe("0")
  assert on["settings"] == {"keep_freed_memory": True, "synchronous_dispatch": True, "unrolled_threefry": True}
  assert on["async_dispatch"] is False
  assert off["settings"] == {"keep_freed_memory": False, "synchronous_dispatch": False, "unrolled_threefry": False}
  assert off["async_dispatch"] is True
  pages_of_temporary = 4096 * 4096 * 4 / 4096
  assert off["faults"] > 0.5 * pages_of_temporary, off  # the mechanism this module exists for
  assert on["faults"] < 0.05 * pages_of_temporary, on


def test_import_after_jax_started_warns_and_keeps_async_dispatch():
  code = ("import jax, jax.numpy as jnp; jnp.ones(1).block_until_ready(); import memagent_jax; "
          "from memagent_jax.runtime import cpu_host; print(cpu_host.tune_cpu_host()['synchronous_dispatch'])")
  env = {k: v for k, v in os.environ.items() if k != cpu_host.ENV_VAR}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
  assert out.stdout.strip().splitlines()[-1] == "False"
  assert "imported after JAX started" in out.stderr
