"""Device mesh, logical axis rules, and sharding of params, optimizer state and batches.

Every parameter names its dimensions logically (`out_sharding` metadata, e.g.
("embed", "q_heads", "head_dim")); rules map those names to the mesh axes
("data", "fsdp", "tensor"), so one model runs on a laptop or a pod by config alone.
Batches are split by rows over ("data", "fsdp") (`shard_micro_batches`); on a mesh that
spans processes every process holds the whole batch and places its rows from the host value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from memagent_jax.runtime.distributed import (CLUSTER_CHOICES, DistributedSpec,  # noqa: F401 - re-exported
                                              initialize_distributed)

MESH_AXES = ("data", "fsdp", "tensor")
# Rows of a batch are split over both data-parallel axes (FSDP is data parallel too).
BATCH_AXES = ("data", "fsdp")

# (logical name, mesh axis / tuple of axes / None): one rule per logical axis of the params
# (models/decoder.py). A mesh axis shards at most one dimension of an array, so two logical axes of one
# param that map to the same mesh axis are an error (`logical_to_spec`), never a silent replication.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
)

# mesh.rollout: the weight layout rollouts decode with. "train": the training layout (FSDP-sharded
# weights are all-gathered at every decoded token); "replicated": tensor-parallel over "tensor" and whole
# on every data x fsdp device, re-sharded once per step, so a decoded token moves activations only.
ROLLOUT_LAYOUTS = ("train", "replicated")

_log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------
# Mesh
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshSpec:
  """Mesh axis sizes (one may be -1: the rest of the devices), axis rules overriding the defaults,
  and the weight layout rollouts decode with; checks itself on construction."""
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  rules: tuple[tuple[str, Any], ...] = ()  # (logical name, mesh axis / tuple of axes / None)
  rollout: str = "train"  # ROLLOUT_LAYOUTS

  def __post_init__(self):
    sizes = self.sizes()
    desc = " x ".join(f"{n}={s}" for n, s in zip(MESH_AXES, sizes))
    if sizes.count(-1) > 1:
      raise ValueError(f"mesh {desc}: at most one axis may be -1 (the rest of the devices)")
    if any(s == 0 or s < -1 for s in sizes):
      raise ValueError(f"mesh {desc}: sizes must be positive (or one -1)")
    if self.rollout not in ROLLOUT_LAYOUTS:
      raise ValueError(f"mesh.rollout={self.rollout!r}; choose one of {ROLLOUT_LAYOUTS}")
    axis_rules(self.rules)  # a malformed rule raises here

  def sizes(self) -> list[int]:
    return [int(self.data), int(self.fsdp), int(self.tensor)]

  def axis_rules(self) -> tuple[tuple[str, Any], ...]:
    """The default rules with this spec's overrides."""
    return axis_rules(self.rules or None)


def mesh_shape(spec: MeshSpec, num_devices: int) -> tuple[int, int, int]:
  """Resolves (data, fsdp, tensor) sizes; at most one may be -1 ("the rest")."""
  sizes = spec.sizes()
  desc = " x ".join(f"{n}={s}" for n, s in zip(MESH_AXES, sizes))
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % fixed:
      raise ValueError(f"mesh {desc}: the fixed axes ({fixed}) do not divide the "
                       f"{num_devices} available devices")
    sizes[sizes.index(-1)] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(f"mesh {desc} = {fixed} does not match the {num_devices} available devices")
  return tuple(sizes)


def make_mesh(spec: MeshSpec | None = None, devices: Sequence[Any] | None = None) -> Mesh:
  """A ("data", "fsdp", "tensor") mesh over `devices` (default: all global devices).

  Axes are Auto (XLA's partitioner propagates shardings), so model code needs no
  explicit-sharding annotations. Devices are in process order, so the outer `data`
  axis spans hosts and `tensor` stays within one host when sizes allow.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(spec or MeshSpec(), len(devices))
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  if slices > 1:  # multi-slice: the outer `data` axis crosses slices (DCN), the rest stays inside one
    if shape[0] % slices:
      raise ValueError(f"mesh data={shape[0]} must be a multiple of the {slices} slices (data spans slices)")
    grid = mesh_utils.create_hybrid_device_mesh((shape[0] // slices, *shape[1:]), (slices, 1, 1), devices)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))
  # jax.make_mesh's own device order, but physical torus axes may be split on every chip (jax.make_mesh
  # splits only on v5e): the released 7B's data 2 x fsdp 8 x tensor 4 on v6e-64's 8x8 needs it. A split
  # happens only where no assignment of whole axes exists (MaxText's allow_split_physical_axes).
  grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


# ---------------------------------------------------------------------------------------
# Logical axis rules
# ---------------------------------------------------------------------------------------


def _axes_tuple(target) -> tuple[str, ...]:
  if target is None:
    return ()
  return (target,) if isinstance(target, str) else tuple(target)


def axis_rules(overrides: Sequence[tuple[str, Any]] | None = None) -> tuple[tuple[str, Any], ...]:
  """Default rules with `overrides` ((logical name, mesh axes) pairs, `mesh.rules`) replacing names,
  so `[("embed", None)]` turns FSDP off for weights. A name given twice is refused."""
  if not overrides:
    return DEFAULT_RULES
  pairs = []
  for pair in overrides:
    if len(pair) != 2:
      raise ValueError(f"axis rule {pair!r} must be a (logical_name, mesh_axis) pair")
    name, target = pair
    if any(name == n for n, _ in pairs):
      raise ValueError(f"axis rule for {name!r} given twice in {list(overrides)}; give one")
    target = target if target is None or isinstance(target, str) else tuple(target)
    for axis in _axes_tuple(target):
      if axis not in MESH_AXES:
        raise ValueError(f"axis rule {name!r} -> {axis!r}: mesh axes are {MESH_AXES}")
    pairs.append((str(name), target))
  named = {name for name, _ in pairs}
  return tuple(pairs) + tuple(r for r in DEFAULT_RULES if r[0] not in named)


def rollout_rules(rules, layout: str) -> tuple[tuple[str, Any], ...]:
  """The axis rules of a rollout weight layout (see ROLLOUT_LAYOUTS) derived from training's `rules`."""
  if layout not in ROLLOUT_LAYOUTS:
    raise ValueError(f"mesh.rollout={layout!r}; choose one of {ROLLOUT_LAYOUTS}")
  rules = tuple(rules) if rules is not None else DEFAULT_RULES
  if layout == "train":
    return rules
  batch = set(BATCH_AXES)
  return tuple((name, None if batch.intersection(_axes_tuple(t)) else t) for name, t in rules)


def logical_to_spec(logical_axes: Sequence[str | None], rules=DEFAULT_RULES) -> PartitionSpec:
  """("embed", "mlp") -> PartitionSpec("fsdp", "tensor"). A mesh axis shards one dimension at most:
  two logical axes mapped to the same mesh axis raise, naming both and the mesh axis."""
  owner: dict[str, str] = {}  # mesh axis -> the logical axis that took it
  spec = []
  for name in logical_axes:
    if name is None:
      spec.append(None)
      continue
    targets = [target for rule_name, target in rules if rule_name == name]
    if not targets:
      raise KeyError(f"logical axis {name!r} has no rule; rules cover "
                     f"{sorted({n for n, _ in rules})}")
    for axis in _axes_tuple(targets[0]):
      if axis in owner:
        raise ValueError(f"sharding rules map logical axes {owner[axis]!r} and {name!r} (of "
                         f"{tuple(logical_axes)}) both to mesh axis {axis!r}; a mesh axis can shard one "
                         "dimension only: change one of the two rules (mesh.rules)")
      owner[axis] = name
    spec.append(targets[0])
  return PartitionSpec(*spec)


# ---------------------------------------------------------------------------------------
# Parameters and optimizer state
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fallback:
  """A parameter dimension left replicated because its size does not divide the mesh axes."""
  path: str
  dim: int
  logical: str
  mesh_axes: tuple[str, ...]
  size: int
  mesh_size: int

  def __str__(self):
    return (f"{self.path} dim {self.dim} ({self.logical}={self.size}) not divisible by "
            f"{'x'.join(self.mesh_axes)}={self.mesh_size}: replicated")


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def _plan(state, mesh: Mesh, rules):
  """Per-leaf PartitionSpecs (same tree as `state`) and the list of fallbacks."""
  rules = axis_rules(rules) if rules is not None else DEFAULT_RULES
  fallbacks: list[Fallback] = []

  def spec_for(path, leaf):
    value = leaf.get_value() if _is_var(leaf) else leaf
    shape = tuple(getattr(value, "shape", ()))
    logical = leaf.get_metadata("out_sharding", None) if _is_var(leaf) else None
    if not logical:
      spec = PartitionSpec()
    else:
      if len(logical) != len(shape):
        raise ValueError(f"param {jax.tree_util.keystr(path)} has shape {shape} but "
                         f"{len(logical)} logical axes {tuple(logical)}")
      entries = list(logical_to_spec(logical, rules))
      for dim, (name, target) in enumerate(zip(logical, entries)):
        axes = _axes_tuple(target)
        size = math.prod(mesh.shape[a] for a in axes)
        if shape[dim] % size:
          fallbacks.append(Fallback(jax.tree_util.keystr(path), dim, name, axes, shape[dim], size))
          entries[dim] = None
      spec = PartitionSpec(*entries)
    return leaf.replace(spec) if _is_var(leaf) else spec

  specs = jax.tree_util.tree_map_with_path(spec_for, state, is_leaf=_is_var)
  return specs, fallbacks


def param_shardings(state, mesh: Mesh, rules=None):
  """NamedSharding tree mirroring `state`, from each Param's logical axes.

  Leaves without `out_sharding` metadata (or plain arrays) are replicated. A
  non-divisible dimension (e.g. 4 kv heads on tensor=8) is replicated and logged.
  """
  specs, fallbacks = _plan(state, mesh, rules)
  for fb in fallbacks:
    _log.warning("sharding fallback: %s", fb)
  to_named = lambda s: NamedSharding(mesh, s)
  return jax.tree.map(to_named, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _shape(x) -> tuple[int, ...]:
  return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def _place(tree, shardings):
  """device_put that also places host values onto shardings spanning other processes."""

  def put(x, s):
    if s.is_fully_addressable:
      return jax.device_put(x, s)
    host = np.asarray(x)  # identical on every process (same init / same checkpoint)
    return jax.make_array_from_callback(host.shape, s, lambda idx: host[idx])

  return jax.tree.map(put, tree, shardings)


def shard_params(state, mesh: Mesh, rules=None):
  """`state` with every array placed by its logical-axis sharding."""
  return _place(state, param_shardings(state, mesh, rules))


def opt_state_shardings(opt_state, params, shardings, mesh: Mesh):
  """Shardings for an optax state: subtrees mirroring `params` get the param shardings.

  A subtree mirrors the params when it has their leaf count and leaf shapes in flatten
  order, as adam's mu/nu from `tx.init(params)` do (whether params are an nnx State or
  a pure dict). Every other leaf (count, schedule state) is replicated.
  """
  p_def = jax.tree.structure(params)
  p_shapes = [_shape(x) for x in jax.tree.leaves(params)]
  s_leaves = jax.tree.leaves(shardings)
  replicated = NamedSharding(mesh, PartitionSpec())

  def mirrors(node) -> bool:
    node_def = jax.tree.structure(node)
    if node_def.num_leaves != len(p_shapes) or (node_def != p_def and node_def.num_nodes == 1):
      return False
    return [_shape(x) for x in jax.tree.leaves(node)] == p_shapes

  def assign(node):
    if mirrors(node):
      return jax.tree.unflatten(jax.tree.structure(node), s_leaves)
    return replicated

  return jax.tree.map(assign, opt_state, is_leaf=mirrors)


def shard_opt_state(opt_state, params, shardings, mesh: Mesh):
  """`opt_state` placed alongside params sharded by `shardings` (see opt_state_shardings)."""
  return _place(opt_state, opt_state_shardings(opt_state, params, shardings, mesh))


# ---------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------


def trace_mesh(mesh: Mesh | None):
  """Context for tracing the model's programs on `mesh`: a custom-call attention kernel (splash) runs per
  shard of the abstract mesh in context (models/attention.py)."""
  if mesh is None or mesh.size == 1:
    return contextlib.nullcontext()
  return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def batch_shards(mesh: Mesh) -> int:
  """Ways the row axis is split (data x fsdp): row counts must be multiples of it."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def shard_micro_batches(x, mesh: Mesh):
  """[M, r, ...] host array -> global array with rows r over ("data", "fsdp"), M replicated.

  Built from the full host value with make_array_from_callback, so it also works when the
  mesh spans processes (every process holds the same rollout batch)."""
  x = np.asarray(x)
  if x.shape[1] % batch_shards(mesh):
    raise ValueError(f"micro-batches of {x.shape[1]} rows do not split over data x fsdp = "
                     f"{mesh.shape['data']} x {mesh.shape['fsdp']} = {batch_shards(mesh)}")
  sharding = NamedSharding(mesh, PartitionSpec(None, BATCH_AXES, *([None] * (x.ndim - 2))))
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
