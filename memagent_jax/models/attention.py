"""Attention backends behind one function, `attend`: `xla` (portable, every platform), `cudnn`
(fused flash attention through `jax.nn.dot_product_attention`), `splash` (Pallas TPU kernel).

Every mask in this codebase is "causal over slots AND key slot holds a real token", so callers
pass key_valid [B, S] and the first query's slot; no backend ever builds a [B, T, T] mask or
score tensor for long rows. `model.attention` = auto | xla | cudnn | splash picks the backend.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

BACKENDS = ("auto", "xla", "cudnn", "splash")
# A very negative (finite) score so fully masked rows give a uniform softmax, never NaN.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_HALF_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@functools.lru_cache(maxsize=None)
def _has_cudnn() -> bool:
  """An NVIDIA GPU backend that compiles cuDNN flash attention (ROCm and CPU do not): a tiny bf16 call is
  compiled once per process and the answer kept."""
  if jax.default_backend() != "gpu":
    return False
  x = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.bfloat16)
  try:
    jax.jit(functools.partial(jax.nn.dot_product_attention, implementation="cudnn")).lower(x, x, x).compile()
  except Exception:  # noqa: BLE001  (jax raises its own error kinds for a missing cuDNN)
    return False
  return True


def check_backend(name: str, platform: str | None = None, *, has_cudnn: bool | None = None) -> str:
  """Validates a `model.attention` choice against the platform the program is compiled for (default:
  this process's; a compile-only TPU target passes "tpu" from a CPU host); returns it.
  has_cudnn: whether the GPU has cuDNN attention (None: as this process's jaxlib says)."""
  if name not in BACKENDS:
    raise ValueError(f"model.attention={name!r} is not a backend; choose one of {', '.join(BACKENDS)}")
  platform = platform or jax.default_backend()
  has_cudnn = _has_cudnn() if has_cudnn is None else has_cudnn
  if name == "cudnn" and not (platform == "gpu" and has_cudnn):
    where = "a GPU without cuDNN bindings" if platform == "gpu" else f"platform {platform!r}"
    raise ValueError(f"model.attention='cudnn' needs an NVIDIA GPU with cuDNN, but this process "
                     f"runs on {where}; use model.attention='xla' (portable) or 'auto' (picks by platform)")
  if name == "splash" and platform != "tpu":
    raise ValueError(f"model.attention='splash' (Pallas TPU splash attention) needs a TPU, but this "
                     f"process runs on platform {platform!r}; use model.attention='xla' or 'auto'")
  return name


def resolve_backend(name: str, dtype, platform: str | None = None, *, has_cudnn: bool | None = None) -> str:
  """'auto' -> splash on TPU, cudnn on an NVIDIA GPU for 16-bit activations, else xla (cuDNN flash
  attention has no float32 kernel). An explicit choice the platform or dtype lacks raises.
  platform: where the program runs (default: this process's backend); has_cudnn: see check_backend."""
  platform = platform or jax.default_backend()
  has_cudnn = _has_cudnn() if has_cudnn is None else has_cudnn
  check_backend(name, platform, has_cudnn=has_cudnn)
  half = jnp.dtype(dtype) in _HALF_DTYPES
  if name == "auto":
    if platform == "tpu":
      return "splash"
    return "cudnn" if half and platform == "gpu" and has_cudnn else "xla"
  if name == "cudnn" and not half:
    raise ValueError(f"model.attention='cudnn' runs bfloat16 or float16 activations only (cuDNN flash "
                     f"attention has no {jnp.dtype(dtype).name} kernel); set model.dtype='bfloat16' or "
                     "model.attention='xla'")
  return name


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionSpec:
  """Everything attention reads while tracing (hashable: a static field of the Decoder).

  emulate_kernels runs a fused backend's glue on any platform with a stand-in kernel: `cudnn` with the
  XLA implementation of `jax.nn.dot_product_attention`, `splash` with its Pallas kernel in interpret
  mode; the platform check is skipped for them (tests, CPU debugging)."""
  backend: str = "auto"  # auto | xla | cudnn | splash (`model.attention`)
  platform: str | None = None  # where the programs run (None: this process's backend)
  # xla backend: prefill attention runs in query blocks of this many tokens, each against only the
  # keys it can see (causal), which halves attention FLOPs and keeps score tensors small.
  query_block: int = 512
  # xla backend: square attention longer than this runs block by block in a loop (bounded memory).
  scan_from: int = 8192
  emulate_kernels: bool = False

  def __post_init__(self):
    if self.backend not in BACKENDS:
      check_backend(self.backend)  # raises, naming the backends
    if self.query_block < 1 or self.scan_from < 1:
      raise ValueError(f"AttentionSpec: query_block={self.query_block} and scan_from={self.scan_from} "
                       "must be >= 1")

  def check(self) -> "AttentionSpec":
    """Raises when the platform lacks the chosen backend (unless emulated); returns self."""
    if not (self.emulate_kernels and self.backend in ("cudnn", "splash")):
      check_backend(self.backend, self.platform)
    return self

  def resolve(self, dtype) -> str:
    """The backend that runs activations of `dtype` (see resolve_backend)."""
    if self.emulate_kernels and self.backend in ("cudnn", "splash"):
      return self.backend
    return resolve_backend(self.backend, dtype, self.platform)

  def whole_rows_fused(self, dtype) -> bool:
    """Whether whole rows run a fused kernel (cudnn, splash) that attention through a cache, as a
    shared prefix needs, would give up."""
    return self.resolve(dtype) in ("cudnn", "splash")


def attend(q, k, v, key_valid, *, q_offset=0, spec: AttentionSpec = AttentionSpec()):
  """Causal attention over slots. q [B, T, H, D]; k, v [B, K, S', D] (H = G * K); key_valid [B, S]
  with S <= S': the keys are the first S slots (the rest of a decode-sized cache is not read)
  -> [B, T, H, D]. Query t sits at slot q_offset + t and sees the valid keys at slots <= its own.

  T == S (a whole row, q_offset 0: training, prefill) runs on the spec's backend; T < S (decoding or
  a prefill against a cache) runs on xla, whose mask is then only [B, T, S].
  Outputs at padding queries are unspecified (finite); nothing downstream reads them."""
  b, t, h, d = q.shape
  if k.shape[0] != b or k.shape != v.shape or k.shape[3] != d or h % k.shape[1]:
    raise ValueError(f"attend: q {q.shape} needs k, v [B={b}, K, S', D={d}] with H={h} a multiple of K; "
                     f"got k {k.shape}, v {v.shape}")
  s = key_valid.shape[-1] if key_valid.ndim == 2 else -1
  if key_valid.shape != (b, s) or s > k.shape[2]:
    raise ValueError(f"attend: key_valid {key_valid.shape} must be [B={b}, S] with S at most the "
                     f"{k.shape[2]} slots of k, v")
  if t > s:
    raise ValueError(f"attend: {t} queries but only {s} key slots; queries must be slots of the keys")
  if t == s and isinstance(q_offset, int) and q_offset:
    raise ValueError(f"attend: T == S == {t} means the queries are slots 0..{t - 1}; got q_offset={q_offset}")
  kind = spec.resolve(q.dtype)
  k, v = k[:, :, :s], v[:, :, :s]
  if t == s and kind == "cudnn":
    return cudnn_attention(q, k, v, key_valid, implementation="xla" if spec.emulate_kernels else "cudnn")
  if t == s and kind == "splash":
    return _per_shard(functools.partial(splash_attention, interpret=spec.emulate_kernels), q, k, v, key_valid)
  return xla_attention(q, k, v, key_valid, q_offset=q_offset, query_block=spec.query_block,
                       scan_from=spec.scan_from)


# --- xla: portable, masks built per query block ----------------------------------------------

def slot_mask(key_valid, first_row, rows: int):
  """[B, rows, S]: query slot first_row + i may see key slot j iff j <= that slot and key j is valid."""
  slots = first_row + jnp.arange(rows)
  return (slots[:, None] >= jnp.arange(key_valid.shape[1])[None, :])[None] & key_valid[:, None, :]


def xla_attention(q, k, v, key_valid, *, q_offset=0, query_block: int = AttentionSpec.query_block,
                  scan_from: int = AttentionSpec.scan_from):
  """Plain XLA attention; long rows in causal query blocks, the longest in a loop (see AttentionSpec)."""
  t, s = q.shape[1], k.shape[2]
  if (t == s and t > scan_from) or (t < s and t > query_block):
    return _mapped_blocks(q, k, v, key_valid, q_offset, query_block)
  if t == s and t > query_block:  # whole rows: each query block sees only the keys up to its end
    return jnp.concatenate([
        dense_attention(q[:, i:i + query_block], k[:, :, :i + query_block], v[:, :, :i + query_block],
                        slot_mask(key_valid[:, :i + query_block], i, min(query_block, t - i)))
        for i in range(0, t, query_block)], axis=1)
  return dense_attention(q, k, v, slot_mask(key_valid, q_offset, t))


def _mapped_blocks(q, k, v, key_valid, q_offset, query_block: int):
  """One query block at a time inside `lax.map`, each against all keys: memory O(block x S)
  instead of O(T x S), since XLA keeps every unrolled block's scores alive at once (2.6 GB at
  16K tokens for a tiny model). Each block is rematerialised, so the backward pass stores only
  its queries, not a [n, block, S] stack of probabilities (that stack is the T x S matrix)."""
  b, t, h, d = q.shape
  n = -(-t // query_block)
  qp = jnp.pad(q, ((0, 0), (0, n * query_block - t), (0, 0), (0, 0)))  # rows past t are dropped
  qb = qp.reshape(b, n, query_block, h, d).swapaxes(0, 1)  # [n, B, QB, H, D]

  @functools.partial(jax.checkpoint, prevent_cse=False)
  def block(args):
    i, qi = args
    return dense_attention(qi, k, v, slot_mask(key_valid, q_offset + i * query_block, query_block))

  out = jax.lax.map(block, (jnp.arange(n), qb))  # [n, B, QB, H, D]
  return out.swapaxes(0, 1).reshape(b, n * query_block, h, d)[:, :t]


def dense_attention(q, k, v, mask):
  """Softmax attention. q [B, T, H, D]; k, v [B, K, S, D]; mask [B, T, S] -> [B, T, H, D].

  The G = H / K query heads that share a key head are stacked along the query axis, so each
  key head is one large matmul instead of G small ones."""
  b, t, h, d = q.shape
  kh = k.shape[1]
  g = h // kh
  qm = q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, d)  # [B, K, G*T, D]
  scores = jnp.einsum("bkmd,bksd->bkms", qm, k).astype(jnp.float32) * (d ** -0.5)  # [B, K, G*T, S]
  scores = jnp.where(jnp.tile(mask, (1, g, 1))[:, None], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = jnp.einsum("bkms,bksd->bkmd", probs, v)  # [B, K, G*T, D]
  return out.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


# --- cudnn: lengths on packed rows ----------------------------------------------------------

def _rows_take(x, index):
  """x [B, T, ...], index [B, T] -> x[b, index[b, t]] (a per-row gather along the sequence)."""
  return jax.vmap(lambda row, i: jnp.take(row, i, axis=0))(x, index)


def cudnn_attention(q, k, v, key_valid, *, implementation: str = "cudnn"):
  """Fused causal attention on whole rows. The kernel takes padding only as sequence lengths
  (real tokens first), so each row's valid tokens are packed to the front in order (a per-row
  gather; for a left-padded prompt it is a roll), run with length = their count, and moved back.
  Causal over the packed order equals causal over slots restricted to valid keys: RoPE positions
  were applied before packing. q [B, T, H, D]; k, v [B, K, T, D]; key_valid [B, T].
  implementation: of `jax.nn.dot_product_attention` ("xla" runs the glue without a GPU)."""
  ones = key_valid.astype(jnp.int32)
  count = jnp.sum(ones, axis=1)  # [B]
  src = jnp.argsort(1 - ones, axis=1, stable=True)  # [B, T] packed slot j <- row slot src[b, j]
  dest = jnp.where(key_valid, jnp.cumsum(ones, 1) - 1, count[:, None] + jnp.cumsum(1 - ones, 1) - 1)
  qp = _rows_take(q, src)  # [B, T, H, D]
  kp = _rows_take(k.swapaxes(1, 2), src)  # [B, T, K, D]
  vp = _rows_take(v.swapaxes(1, 2), src)
  lengths = jnp.maximum(count, 1)  # an all-padding row attends to one slot: finite, then zeroed
  out = jax.nn.dot_product_attention(qp, kp, vp, is_causal=True, query_seq_lengths=lengths,
                                     key_value_seq_lengths=lengths, implementation=implementation)
  out = _rows_take(out, dest)  # [B, T, H, D] back in slot order
  return jnp.where(key_valid[:, :, None, None], out, 0).astype(q.dtype)


# --- splash: segment ids ---

def row_axes(rows: int) -> tuple[str, ...] | None:
  """Mesh axes in context ("data", "fsdp" where > 1) that split `rows` evenly; None when there is no
  mesh, one device, a manual (shard_map) region, or the rows do not divide."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or mesh.are_all_axes_manual:
    return None
  axes = tuple(a for a in ("data", "fsdp") if mesh.shape.get(a, 1) > 1)
  if not axes or rows % math.prod(mesh.shape[a] for a in axes):
    return None
  return axes


def constrain_rows(x):
  """x [B, ...] split by rows over the mesh in context. Between blocks this keeps FSDP honest: XLA
  then gathers each fsdp-sharded weight to the rows, instead of sharding activations like the weights
  and holding every row's [B, T, F] intermediates on every chip."""
  axes = row_axes(x.shape[0])
  if axes is None:
    return x
  return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(axes, *([None] * (x.ndim - 1))))


def _per_shard(kernel, q, k, v, key_valid):
  """Runs a custom-call kernel on each device's rows and kv heads (shard_map over the mesh in context,
  `jax.set_mesh`): XLA cannot partition a Mosaic call, and would otherwise gather every row to every
  device. Rows split over ("data", "fsdp"), heads over "tensor" where the sizes divide."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or mesh.are_all_axes_manual:  # manual: already one device's rows
    return kernel(q, k, v, key_valid)
  P = jax.sharding.PartitionSpec
  rows = row_axes(q.shape[0])
  tp = mesh.shape.get("tensor", 1)
  heads = "tensor" if tp > 1 and k.shape[1] % tp == 0 else None
  rows = rows or None
  return jax.shard_map(kernel, mesh=mesh, in_specs=(P(rows, None, heads, None), P(rows, heads, None, None),
                                                    P(rows, heads, None, None), P(rows, None)),
                       out_specs=P(rows, None, heads, None), check_vma=False)(q, k, v, key_valid)


_SPLASH_LANE = 128  # splash tiles the sequence in multiples of this


@functools.lru_cache(maxsize=32)
def _splash_kernel(t: int, heads: int, interpret: bool):
  """A causal multi-query splash kernel for rows of t tokens (t a multiple of 128)."""
  # TPU backend only: the Pallas splash kernels load when the splash backend is chosen
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  blk = next(b for b in (512, 256, 128) if t % b == 0)
  sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                        block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
  mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(heads)])
  # concrete mask tables, even when first built inside a traced loop body (a scan over layers): the cached
  # kernel outlives that trace
  with jax.ensure_compile_time_eval():
    return sk.make_splash_mqa(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q, k, v, key_valid, *, interpret: bool = False):
  """Pallas TPU splash attention on whole rows: causal as a static block-sparse mask, padding as
  segment ids (1 = real token, 0 = padding; a query sees only keys of its own segment, and every
  query sees itself, so no softmax row is empty). Each kv head runs the G query heads it serves
  as one multi-query kernel. q [B, T, H, D]; k, v [B, K, T, D]; key_valid [B, T].
  interpret: Pallas interpret mode (runs the kernel without a TPU)."""
  # TPU backend only (see _splash_kernel)
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  b, t, h, d = q.shape
  kh = k.shape[1]
  g = h // kh
  tp = -(-t // _SPLASH_LANE) * _SPLASH_LANE
  pad = lambda x, axis: jnp.pad(x, [(0, tp - t if a == axis else 0) for a in range(x.ndim)])
  qg = (q * jnp.asarray(d ** -0.5, q.dtype)).reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
  qg, kp, vp = pad(qg, 3), pad(k, 2), pad(v, 2)
  segments = pad(key_valid.astype(jnp.int32), 1)  # [B, Tp]; the tail padding is segment 0
  kernel = _splash_kernel(tp, g, interpret)
  one = lambda qh, kh_, vh, seg: kernel(qh, kh_, vh, segment_ids=sk.SegmentIds(q=seg, kv=seg))
  out = jax.vmap(jax.vmap(one, in_axes=(0, 0, 0, None)))(qg, kp, vp, segments)  # [B, K, G, Tp, D]
  return out[:, :, :, :t].transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)
