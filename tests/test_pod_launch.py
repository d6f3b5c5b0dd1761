"""Launching on a pod: the Slurm variables jax reads join two local CPU processes into one run
(distributed.cluster="auto"), a process outside any cluster stays alone, the commands in the
README and docs/pods.md are exactly what experiments/launch_commands.py prints, and the slice and
node counts they name hold exactly the config's mesh."""

import contextlib
import io
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import TEST_XLA_FLAGS
from test_parallel import REPO, _clean_env, _collect, _free_port
from experiments import launch_commands
from memagent_jax.runtime import parallel, tpu_targets

JOIN_SCRIPT = textwrap.dedent("""
    import json, os
    import numpy as np
    from configs import toy_cpu
    from memagent_jax.experiment import assembly
    c = toy_cpu.get_config("tiny")  # no process count, no address: distributed.cluster="auto"
    mesh, _ = assembly.start_runtime(c)
    import jax
    from jax.experimental import multihost_utils
    pids = multihost_utils.process_allgather(np.int32(os.getpid()))
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                      "devices": mesh.devices.size, "pids": sorted(int(p) for p in pids)}))
""")
CLUSTER_VARS = ("SLURM_", "TPU_", "KUBERNETES_", "OMPI_", "MEGASCALE_")
CONFIG_7B = "configs/memagent_qwen2_5_7b.py"


def _outside_any_cluster(**extra) -> dict:
  """The test's environment less every variable a cluster engine sets, plus `extra`."""
  env = {k: v for k, v in _clean_env().items() if not k.startswith(CLUSTER_VARS)}
  return {**env, **extra}


def _printed() -> list[str]:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    launch_commands.print_commands(config=CONFIG_7B, workdir="/mnt/shared/runs/qwen7b")
  return out.getvalue().strip().splitlines()


def _sh_blocks(text: str) -> list[str]:
  return [line for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S) for line in block.strip().splitlines()]


def test_docs_show_exactly_the_printed_commands():
  printed = _printed()
  assert len([line for line in printed if not line.startswith("#")]) == len(launch_commands.ENGINES)
  readme = open(os.path.join(REPO, "README.md")).read()
  section = readme.split("## Running on a pod", 1)[1].split("\n## ", 1)[0]
  assert _sh_blocks(section) == printed
  assert _sh_blocks(open(os.path.join(REPO, "docs", "pods.md")).read()) == printed
  assert "--worker=all" in printed[1] and printed[3].startswith("xpk workload create")
  assert printed[5].startswith("srun ") and "--gpus-per-node=8" in printed[5]


def _flag(line: str, name: str) -> str:
  return re.search(rf"--{name}=(\S+)", line).group(1)


def test_default_slice_and_nodes_hold_exactly_the_7b_mesh():
  """fsdp 8 x tensor 4 = 32 devices: v5p-64 (32 chips, one jax device each), 4 nodes x 8 GPUs."""
  mesh = launch_commands.config_mesh(CONFIG_7B)
  assert parallel.mesh_shape(mesh, 32) == (1, 8, 4)
  printed = _printed()
  tpu_type = _flag(printed[3], "tpu-type")
  assert tpu_type == "v5p-64" and tpu_targets.parse_topology(tpu_type).chips == 32
  assert _flag(printed[3], "num-slices") == "1"
  nodes, tasks, gpus = (int(_flag(printed[5], k)) for k in ("nodes", "ntasks-per-node", "gpus-per-node"))
  assert nodes * gpus == 32 and tasks == gpus == 8


@pytest.mark.parametrize("tpu, expected", [("v4", "v4-64"), ("v5e", "v5litepod-32"), ("v6e", "v6e-32"),
                                           ("tpu7x", "tpu7x-32")])
def test_other_generations_count_their_own_way(tpu, expected):
  """v4 names count TensorCores (2 per megacore chip), v5e / v6e count chips; xpk calls v5e v5litepod;
  a TPU7x chip is two devices, so 32 devices are 16 chips, named by their 32 TensorCores."""
  mesh = launch_commands.config_mesh(CONFIG_7B)
  assert launch_commands.tpu_slice(mesh, tpu=tpu) == expected
  assert launch_commands.tpu_slice(mesh, tpu_type=expected) == expected


def test_too_small_tpu_type_is_refused_with_both_sizes():
  cluster = launch_commands.Cluster(tpu_type="v5p-32")
  with pytest.raises(ValueError, match=r"--tpu_type=v5p-32 has 16 devices, .* tensor=4 needs 32 devices"):
    launch_commands.launch_command("xpk", config=CONFIG_7B, workdir="w", cluster=cluster)


def test_a_fixed_mesh_refuses_a_larger_slice_and_a_free_one_fills_it():
  """Every device jax lists joins the mesh: with no -1 axis a larger slice fails at start."""
  fixed = parallel.MeshSpec(data=1, fsdp=8, tensor=4)
  with pytest.raises(ValueError, match=r"v5p-128 has 64 devices, .* needs 32 devices$"):
    launch_commands.tpu_slice(fixed, tpu_type="v5p-128")
  assert launch_commands.tpu_slice(launch_commands.config_mesh(CONFIG_7B), tpu_type="v5p-128") == "v5p-128"


def test_slurm_nodes_times_gpus_are_the_mesh_devices():
  mesh = launch_commands.config_mesh(CONFIG_7B)
  for gpus in (1, 2, 4, 8):
    assert launch_commands.slurm_nodes(mesh, gpus_per_node=gpus) * gpus == 32
  cluster = launch_commands.Cluster(nodes=2)
  with pytest.raises(ValueError, match=r"--nodes=2 x --gpus_per_node=8 has 16 devices, .* needs 32"):
    launch_commands.launch_command("slurm", config=CONFIG_7B, workdir="w", cluster=cluster)


def test_launch_command_names_the_unknown_engine():
  with pytest.raises(ValueError, match=r"engine 'mpirun': choose one of \('tpu-vm', 'xpk', 'slurm'\)"):
    launch_commands.launch_command("mpirun", config="c.py", workdir="w")


def test_outside_a_cluster_one_process_and_no_distributed_runtime():
  code = ("from memagent_jax.runtime import parallel; import jax; "
          "print(parallel.initialize_distributed(), jax.process_count())")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_outside_any_cluster(), capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["False", "1"]


def test_unknown_cluster_mode_is_refused():
  with pytest.raises(ValueError, match=r"distributed.cluster='slurmx'; choose one of \('auto', 'none'\)"):
    parallel.DistributedSpec(cluster="slurmx")


@pytest.mark.slow
def test_slurm_variables_join_two_cpu_processes(tmp_path):
  """What `srun --ntasks=2` sets on one node (jax's Slurm cluster detection reads these);
  JAX_COORDINATOR_PORT replaces the port derived from the job id by a free one."""
  port, procs = _free_port(), []
  for rank in range(2):
    env = _outside_any_cluster(
        XLA_FLAGS=f"{TEST_XLA_FLAGS} --xla_force_host_platform_device_count=1", JAX_COORDINATOR_PORT=str(port),
        SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2", SLURM_STEP_NUM_NODES="1",
        SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank))
    procs.append(subprocess.Popen([sys.executable, "-c", JOIN_SCRIPT], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outs = _collect(procs, timeout=300)
  assert [o["process"] for o in outs] == [0, 1]
  assert all(o["processes"] == 2 and o["devices"] == 2 for o in outs)  # one mesh over both processes
  assert outs[0]["pids"] == outs[1]["pids"] == sorted(p.pid for p in procs)
