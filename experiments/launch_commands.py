"""The commands that start a training run on a pod, printed for one cluster engine or all of them.

  python experiments/launch_commands.py                      # all three, with placeholder names
  python experiments/launch_commands.py --engine=slurm --nodes=4 --config=configs/memagent_qwen2_5_7b.py

No launcher of ours: each engine starts one process per host (per GPU under Slurm) and
`jax.distributed.initialize()` finds the others from what the engine sets (distributed.cluster="auto",
memagent_jax/runtime/parallel.py). docs/pods.md and the README print exactly this output
(tests/test_pod_launch.py compares them).
"""

import argparse
import shlex

ENGINES = ("tpu-vm", "xpk", "slurm")
# What jax reads on each engine to find the processes (jax/_src/clusters/*.py at jax 0.10.2).
DETECTS = {
    "tpu-vm": "the TPU VM metadata server (worker number and worker hostnames)",
    "xpk": "TPU_WORKER_HOSTNAMES and TPU_WORKER_ID, set by the JobSet that xpk creates",
    "slurm": "SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID",
}


def train_command(config: str, workdir: str) -> str:
  """The same training command on every host (the repository checked out at the same path)."""
  return f"python experiments/train.py --config={config} --workdir={workdir}"


def launch_command(engine: str, *, config: str, workdir: str, name: str = "NAME", zone: str = "ZONE",
                   tpu_type: str = "v5p-32", nodes: int = 2, gpus_per_node: int = 8,
                   image: str = "IMAGE") -> str:
  """One shell line starting `config` on every host of the cluster `engine` names."""
  train = train_command(config, workdir)
  if engine == "tpu-vm":
    return (f"gcloud compute tpus tpu-vm ssh {name} --zone={zone} --worker=all "
            f"--command={shlex.quote('cd memagent_jax && .venv/bin/' + train)}")
  if engine == "xpk":
    return (f"xpk workload create --cluster={name} --zone={zone} --workload=memagent "
            f"--tpu-type={tpu_type} --num-slices=1 --docker-image={image} --command={shlex.quote(train)}")
  if engine == "slurm":  # one task per GPU: jax gives task SLURM_LOCALID that GPU of its node
    return (f"srun --nodes={nodes} --ntasks-per-node={gpus_per_node} --gpus-per-node={gpus_per_node} "
            f".venv/bin/{train}")
  raise ValueError(f"engine {engine!r}: choose one of {ENGINES}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--engine", choices=ENGINES + ("all",), default="all")
  p.add_argument("--config", default="configs/memagent_qwen2_5_7b.py")
  p.add_argument("--workdir", default="/mnt/shared/runs/qwen7b", help="a path every host mounts")
  p.add_argument("--name", default="NAME", help="TPU VM or GKE cluster name")
  p.add_argument("--zone", default="ZONE")
  p.add_argument("--tpu-type", default="v5p-32")
  p.add_argument("--nodes", type=int, default=2)
  p.add_argument("--gpus-per-node", type=int, default=8)
  p.add_argument("--image", default="IMAGE", help="container image holding the repository (xpk)")
  a = p.parse_args(argv)
  for engine in ENGINES if a.engine == "all" else (a.engine,):
    print(f"# {engine}: jax reads {DETECTS[engine]}")
    print(launch_command(engine, config=a.config, workdir=a.workdir, name=a.name, zone=a.zone,
                         tpu_type=a.tpu_type, nodes=a.nodes, gpus_per_node=a.gpus_per_node, image=a.image))


if __name__ == "__main__":
  main()
