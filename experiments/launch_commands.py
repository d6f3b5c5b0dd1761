"""The commands that start a training run on a pod, printed for one cluster engine or all of them.

  python -m experiments.launch_commands                      # all three, with placeholder names
  python -m experiments.launch_commands --engine=slurm --nodes=4 --config=configs/memagent_qwen2_5_7b.py

No launcher of ours: each engine starts one process per host (per GPU under Slurm) and
`jax.distributed.initialize()` finds the others from what the engine sets (distributed.cluster="auto",
memagent_jax/runtime/parallel.py). docs/pods.md and the README print exactly this output
(tests/test_pod_launch.py compares them with `print_commands()`, the defaults).
"""

import dataclasses
import shlex

from absl import app, flags

ENGINES = ("tpu-vm", "xpk", "slurm")
# What jax reads on each engine to find the processes (its cluster detection: Slurm, TPU VM / GKE).
DETECTS = {
    "tpu-vm": "the TPU VM metadata server (worker number and worker hostnames)",
    "xpk": "TPU_WORKER_HOSTNAMES and TPU_WORKER_ID, set by the JobSet that xpk creates",
    "slurm": "SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID",
}


def train_command(config: str, workdir: str) -> str:
  """The same training command on every host (the repository checked out at the same path)."""
  return f"python -m experiments.train --config={config} --workdir={workdir}"


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The cluster a launch line addresses: each engine's command reads only its own fields; the
  defaults are the placeholders the README and docs/pods.md show."""
  name: str = "NAME"  # tpu-vm, xpk: TPU VM or GKE cluster name
  zone: str = "ZONE"  # tpu-vm, xpk: its zone
  tpu_type: str = "v5p-32"  # xpk: the slice type
  nodes: int = 2  # slurm: nodes
  gpus_per_node: int = 8  # slurm: GPUs per node (one task each)
  image: str = "IMAGE"  # xpk: container image holding the repository


def launch_command(engine: str, *, config: str, workdir: str, cluster: Cluster = Cluster()) -> str:
  """One shell line starting `config` on every host of `cluster`, run by the engine `engine` names."""
  train = train_command(config, workdir)
  c = cluster
  if engine == "tpu-vm":
    return (f"gcloud compute tpus tpu-vm ssh {c.name} --zone={c.zone} --worker=all "
            f"--command={shlex.quote('cd memagent_jax && .venv/bin/' + train)}")
  if engine == "xpk":
    return (f"xpk workload create --cluster={c.name} --zone={c.zone} --workload=memagent "
            f"--tpu-type={c.tpu_type} --num-slices=1 --docker-image={c.image} --command={shlex.quote(train)}")
  if engine == "slurm":  # one task per GPU: jax gives task SLURM_LOCALID that GPU of its node
    return (f"srun --nodes={c.nodes} --ntasks-per-node={c.gpus_per_node} --gpus-per-node={c.gpus_per_node} "
            f".venv/bin/{train}")
  raise ValueError(f"engine {engine!r}: choose one of {ENGINES}")


def print_commands(engine: str = "all", **kw):
  """Prints, for each engine, what jax reads there (a comment) and the launch line."""
  for name in ENGINES if engine == "all" else (engine,):
    print(f"# {name}: jax reads {DETECTS[name]}")
    print(launch_command(name, **kw))


def define_flags() -> None:
  """The command line's flags, defined when run as a script only: tests import this module beside
  scripts whose flags share names (--workdir, --config)."""
  flags.DEFINE_enum("engine", "all", ENGINES + ("all",), "which engine's command to print")
  flags.DEFINE_string("config", "configs/memagent_qwen2_5_7b.py", "training config file[:variant]")
  flags.DEFINE_string("workdir", "/mnt/shared/runs/qwen7b", "a path every host mounts")
  flags.DEFINE_string("name", "NAME", "TPU VM or GKE cluster name")
  flags.DEFINE_string("zone", "ZONE", "its zone")
  flags.DEFINE_string("tpu_type", "v5p-32", "xpk: the slice type")
  flags.DEFINE_integer("nodes", 2, "slurm: nodes")
  flags.DEFINE_integer("gpus_per_node", 8, "slurm: GPUs per node (one task each)")
  flags.DEFINE_string("image", "IMAGE", "xpk: container image holding the repository")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  print_commands(f.engine, config=f.config, workdir=f.workdir,
                 cluster=Cluster(name=f.name, zone=f.zone, tpu_type=f.tpu_type, nodes=f.nodes,
                                 gpus_per_node=f.gpus_per_node, image=f.image))


if __name__ == "__main__":
  define_flags()
  app.run(main)
