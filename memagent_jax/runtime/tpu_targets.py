"""TPU chips and topologies as pod users name them, and compile-only TPU devices on any host.

libtpu (the `tpu` extra of jax: `pip install "libtpu==0.0.50.*"`) can describe a TPU slice
without one: `jax.experimental.topologies.get_topology_desc` returns devices that XLA compiles
for (memory and cost analysis, collectives, Mosaic kernels) but cannot run on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys

GIB = 1024 ** 3
LIBTPU_REQUIREMENT = "libtpu==0.0.50.*"  # the build jax 0.12.0.1's `tpu` extra pins


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-device figures of one TPU generation (a device = what jax.devices() lists)."""
  name: str
  hbm_bytes: int
  peak_flops: float  # bf16 FLOP/s
  hbm_bandwidth: float  # bytes/s
  ici_bandwidth: float  # bytes/s one device sends over all its ICI links together (one direction)
  name_counts: str  # what the number in "v5p-64" counts: "cores" (2 per chip) or "chips"
  dims: int  # 2: a 2D torus (AxB), 3: a 3D torus (AxBxC)
  device_kind: str  # jax's device_kind of a compile-only device


# Sources: Cloud TPU system architecture pages (docs.cloud.google.com/tpu/docs/v4, v5e, v5p-training,
# v6e), "Key specifications" tables. v4: 275 TFLOP/s, 32 GiB and 1200 GB/s per chip; its compile-only
# devices are TensorCores (2 per chip, no megacore), so a device gets half of each. v5e: 197 TFLOP/s,
# 16 GB, 819 GB/s. v5p: 459 TFLOP/s, 95 GiB, 2765 GB/s (a device is one megacore chip). v6e: 918
# TFLOP/s, 32 GB, 1638 GB/s.
# ICI: Google's per-chip "Interchip Interconnect BW" in Gbps, one direction, all links together: v5e
# 1,600 (the v6e page's v5e/v6e table), v5p 4,800 (cloud.google.com/tpu/docs/v5p), v6e 3,584 (the v6e
# page's table; a later revision lists 3,200 Gbps and "bidirectional 800 GBps"), v4 2,400 (6 links x 400
# Gbps; the v4 page gives no ICI figure, so this one is unchecked). The pages now print "bidirectional ICI
# bandwidth per chip" instead, twice these (v5e 400, v5p 1,200 GB/s): sent plus received. hlo_stats
# counts the bytes a chip sends, so the one-direction figure is its rate; a ring over one torus axis
# uses 2 of the 4 (2D) or 6 (3D) links, so collective bytes / this figure is a lower bound on the time.
CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 16 * GIB, 137.5e12, 600e9, 2400e9 / 8 / 2, "cores", 3, "TPU v4"),  # per TensorCore
    "v5e": Chip("v5e", 16 * 10 ** 9, 197e12, 819e9, 1600e9 / 8, "chips", 2, "TPU v5 lite"),
    "v5p": Chip("v5p", 95 * GIB, 459e12, 2765e9, 4800e9 / 8, "cores", 3, "TPU v5"),
    "v6e": Chip("v6e", 32 * 10 ** 9, 918e12, 1638e9, 3584e9 / 8, "chips", 2, "TPU v6 lite"),
    # TPU7x (Ironwood), cloud.google.com/tpu/docs/tpu7x: per chip 2,307 TFLOP/s bf16, 192 GiB HBM at 7,380
    # GB/s, 1,200 GB/s bidirectional ICI (600 one way); a chip is two dies, each its own jax device (libtpu's
    # "tpu7x:2x2x1" has 8 devices for 4 chips), so a device gets half of each. The "-N" names count
    # TensorCores (devices) as v5p's do; GKE names slices by topology ("tpu7x:2x2x1" is accepted too).
    "tpu7x": Chip("tpu7x", 96 * GIB, 2307e12 / 2, 7380e9 / 2, 1200e9 / 2 / 2, "cores", 3, "TPU7x"),
}

# Slice shapes by chip count, as the Cloud TPU docs list them.
SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
             512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice (or several): `name` as given, `desc` as libtpu names it ("v5p:2x4x4")."""
  name: str
  chip: Chip
  desc: str
  slices: int

  @property
  def chips(self) -> int:
    """Physical chips of every slice together."""
    dims = [int(x) for x in self.desc.split(":")[1].split("x")]
    n = 1
    for d in dims:
      n *= d
    return n * self.slices


def known_topologies() -> list[str]:
  """Every user-style name this module resolves, e.g. v5p-64, v5e-256."""
  out = []
  for chip in CHIPS.values():
    shapes = SHAPES_3D if chip.dims == 3 else SHAPES_2D
    per = 2 if chip.name_counts == "cores" else 1
    out += [f"{chip.name}-{n * per}" for n in shapes]
  return out


class UnknownTopologyError(ValueError):
  """A topology name this module cannot resolve; the message lists the known ones."""


def parse_topology(name: str, slices: int = 1) -> Topology:
  """"v5p-64" (the number counts cores on v4/v5p, chips on v5e/v6e) or "v5p:2x4x4" -> Topology."""
  if slices < 1:
    raise ValueError(f"--slices={slices} must be >= 1")
  text = name.strip().lower()
  known = ", ".join(known_topologies())
  m = re.fullmatch(r"(v4|v5e|v5p|v6e|tpu7x)(?:-(\d+)|:(\d+(?:x\d+){1,2}))", text)
  if not m:
    raise UnknownTopologyError(f"unknown TPU topology {name!r}; known: {known} (or <chip>:<AxB[xC]>, "
                               f"chips {', '.join(CHIPS)})")
  chip = CHIPS[m.group(1)]
  if m.group(3):
    if len(m.group(3).split("x")) != chip.dims:
      raise UnknownTopologyError(f"topology {name!r}: {chip.name} slices are {chip.dims}-D (e.g. "
                                 f"{chip.name}:{(SHAPES_3D if chip.dims == 3 else SHAPES_2D)[4]})")
    return Topology(name, chip, f"{chip.name}:{m.group(3)}", slices)
  count = int(m.group(2))
  chips = count // 2 if chip.name_counts == "cores" else count
  shapes = SHAPES_3D if chip.dims == 3 else SHAPES_2D
  if chips not in shapes or (chip.name_counts == "cores" and count % 2):
    raise UnknownTopologyError(f"unknown TPU topology {name!r}; known: {known}")
  return Topology(name, chip, f"{chip.name}:{shapes[chips]}", slices)


class LibtpuMissingError(ModuleNotFoundError):
  """No TPU compiler (libtpu) on this machine; the message says how to install it."""


# `make setup` installs libtpu here (pip --target), outside site-packages: where jax can import it, every
# jax start on a machine without a TPU would try to bring a TPU up and print errors.
LIBTPU_DIR = os.path.join(sys.prefix, "libtpu")


def libtpu_candidates() -> list[str]:
  """Where libtpu.so may be: $TPU_LIBRARY_PATH, the venv's libtpu/ folder, an installed libtpu package."""
  out = [os.environ.get("TPU_LIBRARY_PATH", ""), os.path.join(LIBTPU_DIR, "libtpu", "libtpu.so")]
  spec = importlib.util.find_spec("libtpu")
  if spec is not None and spec.submodule_search_locations:
    out.append(os.path.join(spec.submodule_search_locations[0], "libtpu.so"))
  return out


def libtpu_path(candidates=None) -> str:
  """The first existing libtpu.so of `candidates` (default `libtpu_candidates()`); an error naming the
  package and the install command when there is none."""
  candidates = libtpu_candidates() if candidates is None else candidates
  for path in candidates:
    if path and os.path.isfile(path):
      return path
  raise LibtpuMissingError(
      f"compiling for a TPU needs the package libtpu (the TPU compiler), not installed here; install it with: "
      f"pip install --target {LIBTPU_DIR} \"{LIBTPU_REQUIREMENT}\" (or run `make setup`)")


def compile_only_devices(topology: Topology) -> list:
  """The devices of `topology` for compilation only (no TPU needed), in slice-major order."""
  path = libtpu_path()
  # off a TPU VM: no metadata server to ask, and nothing to guess (libtpu would warn on stderr)
  os.environ.update(TPU_LIBRARY_PATH=path, TPU_SKIP_MDS_QUERY="1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  # compile-only devices touch no chip: several processes may compile at once (libtpu otherwise locks)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{topology.chip.name}-8")
  # libtpu loads only when a compile-only topology is asked for
  from jax.experimental import topologies
  kwargs = {"num_slices": topology.slices} if topology.slices > 1 else {}
  desc = topologies.get_topology_desc(topology_name=topology.desc, platform="tpu", **kwargs)
  return list(desc.devices)
