"""The commands that start a training run on a pod, printed for one cluster engine or all of them.

  python -m experiments.launch_commands                      # all three, with placeholder names
  python -m experiments.launch_commands --engine=xpk --tpu=v6e --config=configs/memagent_qwen2_5_7b.py
  python -m experiments.launch_commands --engine=slurm --gpus_per_node=4

The slice type and the node count come from the config's mesh, so the run starts on what it is given:
the smallest slice of --tpu (or the fewest nodes of --gpus_per_node) whose devices the mesh uses whole.
An explicit --tpu_type or --nodes the mesh cannot use whole is refused here, not on the pod.

No launcher of ours: each engine starts one process per host (per GPU under Slurm) and
`jax.distributed.initialize()` finds the others from what the engine sets (distributed.cluster="auto",
memagent_jax/runtime/parallel.py). docs/pods.md and the README print exactly this output
(tests/test_pod_launch.py compares them with `print_commands()`, the defaults).
"""

import dataclasses
import math
import os
import shlex
import sys

from absl import app, flags

from memagent_jax.experiment import config_overrides, specs
from memagent_jax.runtime import parallel, tpu_targets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINES = ("tpu-vm", "xpk", "slurm")
# What jax reads on each engine to find the processes (its cluster detection: Slurm, TPU VM / GKE).
DETECTS = {
    "tpu-vm": "the TPU VM metadata server (worker number and worker hostnames)",
    "xpk": "TPU_WORKER_HOSTNAMES and TPU_WORKER_ID, set by the JobSet that xpk creates",
    "slurm": "SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID",
}
XPK_PREFIX = {"v5e": "v5litepod"}  # xpk's name of a v5e slice; the other generations keep theirs


def train_command(config: str, workdir: str) -> str:
  """The same training command on every host (the repository checked out at the same path)."""
  return f"python -m experiments.train --config={config} --workdir={workdir}"


def config_mesh(config: str) -> parallel.MeshSpec:
  """The mesh of a config file[:variant], read as experiments/train.py reads it (a relative path from
  the repository root, where the training command runs)."""
  return specs.mesh_spec(config_overrides.load_config_file(os.path.join(REPO, config)))


def fixed_devices(mesh: parallel.MeshSpec) -> int:
  """The devices of the mesh's fixed axes: all it needs, or the step of its -1 axis."""
  return math.prod(s for s in mesh.sizes() if s != -1)


def uses_whole(mesh: parallel.MeshSpec, devices: int) -> bool:
  """Whether a run of `mesh` starts on `devices` devices. It puts every device jax lists into its mesh
  (parallel.make_mesh), so the fixed axes must multiply to exactly that many, or divide it when one axis
  is -1 (the rest); a larger slice the mesh would leave partly idle fails at start (parallel.mesh_shape)."""
  try:
    parallel.mesh_shape(mesh, devices)
  except ValueError:
    return False
  return True


def refusal(mesh: parallel.MeshSpec, given: str) -> ValueError:
  """The error naming both sizes: `given` says the devices offered, the rest the devices the mesh needs."""
  sizes = mesh.sizes()
  desc = " x ".join(f"{n}={s}" for n, s in zip(parallel.MESH_AXES, sizes))
  fixed = fixed_devices(mesh)
  need = f"{fixed} devices" + (" or a multiple (its -1 axis takes the rest)" if -1 in sizes else "")
  return ValueError(f"{given}, but the config's mesh {desc} needs {need}")


# jax lists one device per chip on v4/v5p/v5e/v6e: a v4 or v5p chip is one megacore device (its two
# TensorCores together), a v5e or v6e chip has a single TensorCore. A TPU7x chip is two dies, each its own
# device. Slice names count TensorCores on v4/v5p/TPU7x and chips on v5e/v6e, so v5p-32 is 16 chips and
# 16 jax devices, v6e-16 is 16, tpu7x-16 is 8 chips and 16 devices.
DEVICES_PER_CHIP = {"tpu7x": 2}


def slice_devices(topology: tpu_targets.Topology) -> int:
  """The jax devices of a slice."""
  return topology.chips * DEVICES_PER_CHIP.get(topology.chip.name, 1)


def slice_name(chip: tpu_targets.Chip, chips: int) -> str:
  """xpk's --tpu-type of a slice of `chips` chips of `chip`."""
  count = chips * (2 if chip.name_counts == "cores" else 1)
  return f"{XPK_PREFIX.get(chip.name, chip.name)}-{count}"


def tpu_slice(mesh: parallel.MeshSpec, *, tpu: str = "v5p", tpu_type: str | None = None) -> str:
  """`tpu_type` if the mesh uses it whole (an error otherwise), else the smallest such slice of `tpu`."""
  if tpu_type:
    topology = tpu_targets.parse_topology(tpu_type.replace("v5litepod", "v5e"))  # xpk's v5e name
    if not uses_whole(mesh, slice_devices(topology)):
      raise refusal(mesh, f"--tpu_type={tpu_type} has {slice_devices(topology)} devices")
    return slice_name(topology.chip, topology.chips)
  chip = tpu_targets.CHIPS[tpu]
  shapes = tpu_targets.SHAPES_3D if chip.dims == 3 else tpu_targets.SHAPES_2D
  per = DEVICES_PER_CHIP.get(chip.name, 1)
  for chips in sorted(shapes):
    if uses_whole(mesh, chips * per):
      return slice_name(chip, chips)
  largest = max(shapes)
  raise refusal(mesh, f"no {tpu} slice fits: the largest, {slice_name(chip, largest)}, has {largest * per} devices")


def slurm_nodes(mesh: parallel.MeshSpec, *, gpus_per_node: int = 8, nodes: int | None = None) -> int:
  """`nodes` if the mesh uses their GPUs whole (an error otherwise), else the fewest nodes it does."""
  if nodes:
    if not uses_whole(mesh, nodes * gpus_per_node):
      raise refusal(mesh, f"--nodes={nodes} x --gpus_per_node={gpus_per_node} has {nodes * gpus_per_node} "
                          "devices")
    return nodes
  fixed = fixed_devices(mesh)
  for n in range(1, fixed + 1):  # n = fixed always holds a -1 mesh; a fixed one needs n * gpus == fixed
    if uses_whole(mesh, n * gpus_per_node):
      return n
  raise refusal(mesh, f"no number of nodes fits: --gpus_per_node={gpus_per_node} gives multiples of "
                      f"{gpus_per_node} devices")


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The cluster a launch line addresses: each engine's command reads only its own fields; the
  defaults are the placeholders the README and docs/pods.md show."""
  name: str = "NAME"  # tpu-vm, xpk: TPU VM or GKE cluster name
  zone: str = "ZONE"  # tpu-vm, xpk: its zone
  tpu: str = "v5p"  # xpk: the TPU generation the slice is chosen from
  tpu_type: str | None = None  # xpk: the slice type; None: the smallest of `tpu` the mesh uses whole
  nodes: int | None = None  # slurm: nodes; None: the fewest the mesh uses whole
  gpus_per_node: int = 8  # slurm: GPUs per node (one task each)
  image: str = "IMAGE"  # xpk: container image holding the repository


def launch_command(engine: str, *, config: str, workdir: str, cluster: Cluster = Cluster()) -> str:
  """One shell line starting `config` on every host of `cluster`, run by the engine `engine` names."""
  train = train_command(config, workdir)
  c = cluster
  if engine == "tpu-vm":
    return (f"gcloud compute tpus tpu-vm ssh {c.name} --zone={c.zone} --worker=all "
            f"--command={shlex.quote('cd memagent_jax && .venv/bin/' + train)}")
  if engine == "xpk":  # one slice: the config has no multi-slice setting (data spans slices if given several)
    tpu_type = tpu_slice(config_mesh(config), tpu=c.tpu, tpu_type=c.tpu_type)
    return (f"xpk workload create --cluster={c.name} --zone={c.zone} --workload=memagent "
            f"--tpu-type={tpu_type} --num-slices=1 --docker-image={c.image} --command={shlex.quote(train)}")
  if engine == "slurm":  # one task per GPU: jax gives task SLURM_LOCALID that GPU of its node
    nodes = slurm_nodes(config_mesh(config), gpus_per_node=c.gpus_per_node, nodes=c.nodes)
    return (f"srun --nodes={nodes} --ntasks-per-node={c.gpus_per_node} --gpus-per-node={c.gpus_per_node} "
            f".venv/bin/{train}")
  raise ValueError(f"engine {engine!r}: choose one of {ENGINES}")


def print_commands(engine: str = "all", **kw):
  """Prints, for each engine, what jax reads there (a comment) and the launch line."""
  for name in ENGINES if engine == "all" else (engine,):
    line = launch_command(name, **kw)  # may refuse the cluster: nothing printed for this engine then
    print(f"# {name}: jax reads {DETECTS[name]}")
    print(line)


def define_flags() -> None:
  """The command line's flags, defined when run as a script only: tests import this module beside
  scripts whose flags share names (--workdir, --config)."""
  flags.DEFINE_enum("engine", "all", ENGINES + ("all",), "which engine's command to print")
  flags.DEFINE_string("config", "configs/memagent_qwen2_5_7b.py", "training config file[:variant]")
  flags.DEFINE_string("workdir", "/mnt/shared/runs/qwen7b", "a path every host mounts")
  flags.DEFINE_string("name", "NAME", "TPU VM or GKE cluster name")
  flags.DEFINE_string("zone", "ZONE", "its zone")
  flags.DEFINE_enum("tpu", "v5p", list(tpu_targets.CHIPS), "xpk: the TPU generation of the slice")
  flags.DEFINE_string("tpu_type", None, "xpk: the slice type (e.g. v5p-64; default: from the mesh and --tpu)")
  flags.DEFINE_integer("nodes", None, "slurm: nodes (default: from the mesh and --gpus_per_node)")
  flags.DEFINE_integer("gpus_per_node", 8, "slurm: GPUs per node (one task each)")
  flags.DEFINE_string("image", "IMAGE", "xpk: container image holding the repository")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  cluster = Cluster(name=f.name, zone=f.zone, tpu=f.tpu, tpu_type=f.tpu_type, nodes=f.nodes,
                    gpus_per_node=f.gpus_per_node, image=f.image)
  try:
    print_commands(f.engine, config=f.config, workdir=f.workdir, cluster=cluster)
  except (ValueError, FileNotFoundError) as e:  # a slice or node count the mesh cannot use, a bad name
    sys.exit(f"launch_commands: {e}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
