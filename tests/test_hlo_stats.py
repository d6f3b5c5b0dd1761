"""runtime/hlo_stats.py against hand-computed counts: matmul FLOPs with loop trip counts multiplied in,
collectives per loop iteration, in-place cache writes, on the CPU and on compile-only TPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from memagent_jax.runtime import hlo_stats, tpu_targets


def _scan_then_while(w, x):
  """7 scan steps and 5 while steps of x [64, K] @ w [K, N] (N == K), then a sum."""
  y, _ = jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=7)
  _, z = jax.lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w)), (0, y))
  return z.sum()


def test_cpu_loop_flops_are_multiplied_by_trip_counts():
  w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
  compiled = jax.jit(_scan_then_while).lower(w, x).compile()
  stats = hlo_stats.ProgramStats(compiled.as_text())
  per_step = 2 * 64 * 256 * 256
  assert stats.total.flops == 12 * per_step
  assert sorted(l.trip_count for l in stats.loops) == [5, 7]
  assert all(l.per_iteration.flops == per_step for l in stats.loops)


def test_loop_free_program_matches_xla_cost_analysis():
  """Without loops XLA's own count is right: ours must agree on FLOPs and roughly on bytes."""
  def mlp(a, b, c):  # [128, 512] @ [512, 1024] -> relu -> @ [1024, 256]
    return jax.nn.relu(a @ b) @ c
  args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((128, 512), (512, 1024), (1024, 256))]
  compiled = jax.jit(mlp).lower(*args).compile()
  stats = hlo_stats.ProgramStats(compiled.as_text())
  xla = compiled.cost_analysis()
  assert stats.total.flops == 2 * 128 * 512 * 1024 + 2 * 128 * 1024 * 256
  assert abs(stats.total.flops - xla["flops"]) / xla["flops"] < 0.01
  assert 0.5 < stats.total.bytes_accessed / xla["bytes accessed"] < 2.0


def test_in_place_update_moves_the_update_not_the_buffer():
  def write(cache, row, i):  # cache [4096, 1024]: one row written in place
    return jax.lax.dynamic_update_slice(cache, row, (i, 0))
  args = (jax.ShapeDtypeStruct((4096, 1024), jnp.float32), jax.ShapeDtypeStruct((1, 1024), jnp.float32),
          jax.ShapeDtypeStruct((), jnp.int32))
  compiled = jax.jit(write, donate_argnums=0).lower(*args).compile()
  stats = hlo_stats.ProgramStats(compiled.as_text())
  assert stats.total.bytes_accessed < 0.01 * 4096 * 1024 * 4


@pytest.fixture(scope="module")
def v5p_mesh():
  devices = tpu_targets.compile_only_devices(tpu_targets.parse_topology("v5p-8"))
  return jax.sharding.Mesh(np.array(devices), ("fsdp",))


def test_tpu_collectives_per_iteration(v5p_mesh):
  """w [1024, 1024] sharded by rows over 4 chips: every step of both loops reduce-scatters a
  [64, 1024] bf16 product (128 KiB), and per chip each step multiplies [64, 256] @ [256, 1024]."""
  w = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(v5p_mesh, P("fsdp")))
  x = jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16, sharding=NamedSharding(v5p_mesh, P()))
  compiled = jax.jit(_scan_then_while).lower(w, x).compile()
  stats = hlo_stats.ProgramStats(compiled.as_text())
  assert stats.total.flops == 12 * 2 * 64 * 256 * 1024
  assert compiled.cost_analysis()["flops"] < 0.25 * stats.total.flops  # XLA counts each body once
  assert sorted(l.trip_count for l in stats.loops) == [5, 7]
  for loop in stats.loops:
    assert loop.per_iteration.collective_bytes == 64 * 1024 * 2
  assert stats.max_loop_collective_bytes() == 64 * 1024 * 2


def test_shape_bytes():
  assert hlo_stats.shape_bytes("bf16[64,256]{1,0:T(8,128)(2,1)}") == 64 * 256 * 2
  assert hlo_stats.shape_bytes("(s32[], f32[8,4]{1,0}, pred[3])") == 4 + 128 + 3
