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
  """w [1024, 1024] sharded by rows over 4 chips: every step of both loops all-reduces a [64, 1024]
  bf16 partial product (128 KiB; a ring sends 2 x 3/4 of it), and per chip each step multiplies
  [64, 256] @ [256, 1024]."""
  w = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(v5p_mesh, P("fsdp")))
  x = jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16, sharding=NamedSharding(v5p_mesh, P()))
  compiled = jax.jit(_scan_then_while).lower(w, x).compile()
  stats = hlo_stats.ProgramStats(compiled.as_text())
  assert stats.total.flops == 12 * 2 * 64 * 256 * 1024
  assert compiled.cost_analysis()["flops"] < 0.25 * stats.total.flops  # XLA counts each body once
  assert sorted(l.trip_count for l in stats.loops) == [5, 7]
  ring = 2 * 3 / 4 * 64 * 1024 * 2  # = 196,608 bytes sent per chip
  for loop in stats.loops:
    assert loop.per_iteration.collectives == {"all-reduce": [1.0, ring]}
  assert stats.max_loop_collective_bytes() == ring


def test_shape_bytes():
  assert hlo_stats.shape_bytes("bf16[64,256]{1,0:T(8,128)(2,1)}") == 64 * 256 * 2
  assert hlo_stats.shape_bytes("(s32[], f32[8,4]{1,0}, pred[3])") == 4 + 128 + 3


# --- hand-written HLO: every expected number worked out in the comments ---

def _module(*computations: str, devices: int = 8) -> hlo_stats.ProgramStats:
  return hlo_stats.ProgramStats(f"HloModule m, num_partitions={devices}\n\n" + "\n\n".join(computations))


_ADD = """%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}"""


def test_ring_bytes_per_kind_and_replica_group_forms():
  """a f32[1024] = 4096 B, b f32[256] = 1024 B; 8 devices, groups of 4 unless said."""
  stats = _module(_ADD, """ENTRY %main (a: f32[1024], b: f32[256]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %b = f32[256]{0} parameter(1)
  %ar = f32[1024]{0} all-reduce(%a), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %ag = f32[1024]{0} all-gather(%b), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
  %rs = f32[256]{0} reduce-scatter(%a), channel_id=3, replica_groups=mesh['data'=2,'fsdp'=4] {'fsdp'}, dimensions={0}, to_apply=%add
  %a2a = f32[1024]{0} all-to-all(%a), channel_id=4, replica_groups={}, dimensions={0}
  %cp = f32[256]{0} collective-permute(%b), channel_id=5, source_target_pairs={{0,1},{1,0}}
  ROOT %r = f32[1024]{0} add(%ar, %ag)
}""")
  assert stats.total.collectives == {
      "all-reduce": [1, 6144],  # 2 x 3/4 x 4096 (reduce-scatter, then all-gather)
      "all-gather": [1, 3072],  # 3/4 x 4096 output = 3 x 1024 input
      "reduce-scatter": [1, 3072],  # 3/4 x 4096 input; the mesh form: group = the 'fsdp' axis, 4
      "all-to-all": [1, 3584],  # 7/8 x 4096: no groups = all 8 devices
      "collective-permute": [1, 1024]}  # its buffer, once
  assert stats.total.collective_bytes == 6144 + 3072 + 3072 + 3584 + 1024  # 16,896


def test_combined_and_async_collectives_count_every_operand_once():
  """A variadic all-reduce counts all three operands; an async all-gather over two operands counts once,
  at its -start, from its inputs (its tuple shape holds inputs and outputs: not read)."""
  stats = _module(_ADD, """ENTRY %main (a: f32[8,16], b: bf16[32], c: f32[4], x16: f32[16]) -> f32[64] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = bf16[32]{0} parameter(1)
  %c = f32[4]{0} parameter(2)
  %x16 = f32[16]{0} parameter(3)
  %ar = (f32[8,16]{1,0}, bf16[32]{0}, f32[4]{0}) all-reduce(%a, %b, %c), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %ags = ((f32[4]{0}, f32[16]{0}), (f32[16]{0}, f32[64]{0})) all-gather-start(%c, %x16), replica_groups=[2,4]<=[8], dimensions={0}
  %agd = (f32[16]{0}, f32[64]{0}) all-gather-done(%ags)
  ROOT %r = f32[64]{0} get-tuple-element(%agd), index=1
}""")
  # all-reduce: 512 + 64 + 16 = 592 B in, x 2 x 3/4 = 888; all-gather: 16 + 64 = 80 B in, x 3 = 240
  # (= 3/4 of its 64 + 256 = 320 B out)
  assert stats.total.collectives == {"all-reduce": [1, 888], "all-gather": [1, 240]}


def test_a_call_counts_its_body_and_a_reduce_not_its_lambda():
  """The TPU7x compiler offloads collectives to its SparseCores as asynchronous calls (the form below is its
  optimised HLO of the 7B's answer program, shortened): `call-start(), async_execution_thread="sparsecore",
  to_apply=%body`, then call-update and call-done, which name no body. The body's all-reduce counts once, at
  the start, over a mesh-form group of 4 (bf16[64, 32]: 4096 B in, x 2 x 3/4 = 6144 B); a plain `call`'s body
  counts too (its dot: 2 x 64 x 32 x 8 = 32768 FLOPs); the all-reduce's own to_apply (%add, per element) is no
  body."""
  stats = _module(_ADD, """%called_computation.87 (p: bf16[64,32]) -> bf16[64,32] {
  %p = bf16[64,32]{1,0} parameter(0)
  ROOT %ar = bf16[64,32]{1,0} all-reduce(%p), channel_id=178, replica_groups=mesh['data'=1,'fsdp'=8,'tensor'=4] {'tensor'}, use_global_device_ids=true, to_apply=%add
}""", """%wrapped (x: bf16[64,8], w: bf16[8,32]) -> bf16[64,32] {
  %x = bf16[64,8]{1,0} parameter(0)
  %w = bf16[8,32]{1,0} parameter(1)
  ROOT %d = bf16[64,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""", """ENTRY %main (x: bf16[64,8], w: bf16[8,32]) -> bf16[64,32] {
  %x = bf16[64,8]{1,0} parameter(0)
  %w = bf16[8,32]{1,0} parameter(1)
  %d = bf16[64,32]{1,0} call(%x, %w), to_apply=%wrapped
  %ar.call-start = ((), (), (s32[1]{0})) call-start(), async_execution_thread="sparsecore", to_apply=%called_computation.87
  %ar.call-update = ((), (), (s32[1]{0})) call-update(%ar.call-start, %d)
  ROOT %ar.call-done = bf16[64,32]{1,0} call-done(%ar.call-update)
}""")
  assert stats.total.collectives == {"all-reduce": [1, 6144]}
  assert stats.total.flops == 32768


_DOT_BODY = """  %w = f32[16,4]{1,0} constant({...})
  %x = f32[8,16]{1,0} broadcast(%one), dimensions={}
  %d = f32[8,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}"""  # 2 x 8 x 4 x 16 = 1024


def _counter_loop(name: str, n: str, body_extra: str = "") -> str:
  """A loop computation pair counting s32 i from 0 while i < n (n a constant or a parameter)."""
  bound = f"  %n = s32[] constant({n})" if n.isdigit() else "  %n = s32[] get-tuple-element(%p), index=1"
  return f"""%{name}_cond (p: (s32[], s32[])) -> pred[] {{
  %p = (s32[], s32[]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
{bound}
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

%{name}_body (p: (s32[], s32[])) -> (s32[], s32[]) {{
  %p = (s32[], s32[]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %m = s32[] get-tuple-element(%p), index=1
  %one = f32[] constant(1)
{_DOT_BODY}
{body_extra}
  %c1 = s32[] constant(1)
  %next = s32[] add(%i, %c1)
  ROOT %t = (s32[], s32[]) tuple(%next, %m)
}}"""


def _entry_loop(name: str, attrs: str = "") -> str:
  """An entry computation running loop `name` from i = 0 with m its second tuple element."""
  return f"""ENTRY %main (m: s32[]) -> (s32[], s32[]) {{
  %m = s32[] parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], s32[]) tuple(%z, %m)
  ROOT %w = (s32[], s32[]) while(%init), condition=%{name}_cond, body=%{name}_body{attrs}
}}"""


def test_nested_loops_multiply_trip_counts():
  """An outer loop of 3 (XLA's known_trip_count) around an inner loop of 5 (read from `i < 5`), each body
  one 1024-FLOP dot: 3 x 1024 + 3 x 5 x 1024 = 18,432 FLOPs."""
  inner = "  %z = s32[] constant(0)\n  %init = (s32[], s32[]) tuple(%z, %m)\n  " \
          "%w2 = (s32[], s32[]) while(%init), condition=%inner_cond, body=%inner_body"
  stats = _module(_counter_loop("inner", "5"), _counter_loop("outer", "99", inner),
                  _entry_loop("outer", ', backend_config={"known_trip_count":{"n":"3"}}'))
  assert sorted(l.trip_count for l in stats.loops) == [3, 5]  # the outer's 3 overrides its `i < 99`
  assert stats.total.flops == 3 * 1024 + 3 * 5 * 1024
  assert stats.unknown_trip_counts() == 0


def test_unknown_trip_count_counts_once_and_is_reported():
  """`i < m`, m a parameter: the trip count is unknown, the body's 1024 FLOPs count once."""
  stats = _module(_counter_loop("loop", "m"), _entry_loop("loop"))
  assert [l.trip_count for l in stats.loops] == [None]
  assert stats.unknown_trip_counts() == 1
  assert stats.total.flops == 1024


def test_conditional_counts_its_costliest_branch():
  """Branch 0: one [8, 16] @ [16, 4] dot (1024 FLOPs); branch 1: [8, 16] @ [16, 32] (2 x 8 x 32 x 16 =
  8192): the conditional counts 8192, not the sum."""
  stats = _module("""%small (x: f32[8,16]) -> f32[8,4] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,4]{1,0} constant({...})
  ROOT %d = f32[8,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""", """%large (x: f32[8,16]) -> f32[8,32] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,32]{1,0} constant({...})
  ROOT %d = f32[8,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""", """ENTRY %main (b: s32[], x: f32[8,16]) -> f32[8,4] {
  %b = s32[] parameter(0)
  %x = f32[8,16]{1,0} parameter(1)
  ROOT %c = f32[8,4]{1,0} conditional(%b, %x, %x), branch_computations={%small, %large}
}""")
  assert stats.total.flops == 8192


def test_splash_custom_calls_count_from_shapes_and_others_are_listed():
  """q, k, v bf16 [B=2, H=4, T=256, D=64], causal: 256 x 257 / 2 = 32,896 of 65,536 pairs. Forward 2
  matmuls: 2 x 2 x (2 x 4) x 32,896 x 64 = 67,371,008 (= 4 B H T^2 D x (T+1)/(2T)); dkv 4 matmuls:
  134,742,016; dq 3: 101,056,512. An unknown Mosaic kernel is listed as uncounted; a Sharding
  annotation is not."""
  qkv = "bf16[2,4,256,64]{3,2,1,0}"
  stats = _module(f"""ENTRY %main (q: {qkv}, k: {qkv}, v: {qkv}) -> f32[8] {{
  %q = {qkv} parameter(0)
  %k = {qkv} parameter(1)
  %v = {qkv} parameter(2)
  %mask = s8[1,1,1]{{2,1,0}} constant({{...}})
  %seg = s32[2,256]{{1,0}} constant({{...}})
  %lse = f32[2,4,256]{{2,1,0}} constant({{...}})
  %fwd = ({qkv}, f32[2,4,256]{{2,1,0}}) custom-call(%mask, %q, %seg, %k, %v), custom_call_target="tpu_custom_call", metadata={{op_name="jit(f)/splash_mha_fwd_residuals/pallas_call"}}
  %splash_mha_dkv_no_residuals.4 = ({qkv}, {qkv}) custom-call(%mask, %q, %k, %v, %lse, %q), custom_call_target="tpu_custom_call"
  %splash_mha_dq_no_residuals.5 = {qkv} custom-call(%mask, %q, %k, %v, %lse, %q), custom_call_target="tpu_custom_call"
  %other = f32[8]{{0}} custom-call(%lse), custom_call_target="tpu_custom_call", metadata={{op_name="jit(f)/my_kernel"}}
  ROOT %sh = f32[8]{{0}} custom-call(%other), custom_call_target="Sharding", sharding={{replicated}}
}}""")
  fwd = 2 * 2 * (2 * 4) * (256 * 257 // 2) * 64
  assert fwd == 67_371_008 == 4 * 2 * 4 * 256 * 256 * 64 * 257 // 512
  assert stats.total.flops == fwd + 2 * fwd + 3 * fwd // 2
  assert stats.uncounted_custom_calls() == {"tpu_custom_call": 1}
  assert hlo_stats.causal_pairs(4, 2) == 1 + 2 + 2 + 2  # more queries than keys: rows past Tk see all


def test_real_splash_kernels_match_the_shape_rule(v5p_mesh):
  """The project's splash attention, forward and backward, compiled for 4 v5p chips, rows split over them:
  per chip B = 2 rows, 2 kv heads x G = 2 query heads, T = 256, D = 128. Forward 4 B H T^2 D (T+1)/(2T)
  = 4 x 2 x 4 x 256^2 x 128 x 257/512 = 134,742,016; dq 1.5x, dkv 2x: 4.5 x forward in all."""
  from memagent_jax.models import attention
  b, t, h, kh, d = 8, 256, 4, 2, 128
  rows = NamedSharding(v5p_mesh, P("fsdp"))

  def loss(q, k, v):
    valid = jnp.ones((b, t), bool)
    out = jax.shard_map(attention.splash_attention, mesh=v5p_mesh, in_specs=(P("fsdp"),) * 4,
                        out_specs=P("fsdp"), check_vma=False)(q, k, v, valid)
    return out.astype(jnp.float32).sum()
  q = jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16, sharding=rows)
  k = jax.ShapeDtypeStruct((b, kh, t, d), jnp.bfloat16, sharding=rows)
  with jax.default_matmul_precision("default"):  # conftest's "highest" asks Mosaic for an fp32 bf16 matmul
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k).compile()
  stats = hlo_stats.ProgramStats(compiled.as_text())
  fwd = 4 * 2 * 4 * 256 * 256 * 128 * 257 // 512
  assert fwd == 134_742_016
  assert stats.custom_calls() == {"tpu_custom_call": 3}
  assert stats.total.flops == 4.5 * fwd  # the kernels are the only matmuls
  assert stats.uncounted_custom_calls() == {}


def test_sliced_prefetch_reads_each_slice_once():
  """The TPU compiler prefetches a KV cache in slices (slice-start: its tuple shape holds the source, the
  slice and a context) and joins them by ConcatBitcast (no data moves): the cache's bytes once, not the
  source per slice. Here f32[8,16] (512 B) in 4 slices of 128 B: 512 B, where counting every tuple
  element and the joining call gave 4 x (512 + 128 + 4 + 512) + 2 x 512 = 5,648."""
  stats = _module("", """ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %s0 = ((f32[8,16]{1,0}), f32[2,16]{1,0:S(1)}, s32[]) slice-start(%a), slice={[0:2], [0:16]}
  %s1 = ((f32[8,16]{1,0}), f32[2,16]{1,0:S(1)}, s32[]) slice-start(%a), slice={[2:4], [0:16]}
  %s2 = ((f32[8,16]{1,0}), f32[2,16]{1,0:S(1)}, s32[]) slice-start(%a), slice={[4:6], [0:16]}
  %s3 = ((f32[8,16]{1,0}), f32[2,16]{1,0:S(1)}, s32[]) slice-start(%a), slice={[6:8], [0:16]}
  %d0 = f32[2,16]{1,0:S(1)} slice-done(%s0)
  %d1 = f32[2,16]{1,0:S(1)} slice-done(%s1)
  %d2 = f32[2,16]{1,0:S(1)} slice-done(%s2)
  %d3 = f32[2,16]{1,0:S(1)} slice-done(%s3)
  ROOT %c = f32[8,16]{1,0:S(1)} custom-call(%d0, %d1, %d2, %d3), custom_call_target="ConcatBitcast"
}""")
  assert stats.total.bytes_accessed == 4 * 2 * 16 * 4
  assert not stats.total.uncounted
