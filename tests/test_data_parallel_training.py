"""Data-parallel RL on a mesh: two training steps of configs/toy_cpu.py:tiny give the same params
on 1 device, on 4 devices (rows over `data`), and on 2 processes x 2 devices joined by
jax.distributed (each process generating only its half of the rollout rows)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from test_parallel import REPO, _clean_env, _collect, _free_port

TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from configs import toy_cpu
    from memagent_jax.rl.metrics import read_jsonl
    from memagent_jax.rl.rollout import REWARD_FNS
    from memagent_jax.experiment.assembly import build_trainer
    # a from-scratch toy model scores 0 everywhere; a reward on the sampled text itself gives
    # every group a signal, so the updates move the params
    REWARD_FNS.register("answer_parity", lambda answer, pred, gold: float(sum(map(ord, answer)) % 2))
    cfg = toy_cpu.get_config("tiny")
    cfg.rl.reward = "answer_parity"
    cfg.train.steps = 2
    cfg.mesh.update(data=int(os.environ["DATA"]), fsdp=int(os.environ["FSDP"]), tensor=1)
    cfg.distributed.update(num_processes=int(os.environ["NPROC"]), process_id=int(os.environ["PID"]),
                           coordinator_address=os.environ["COORD"])
    workdir = os.path.join(os.environ["OUT"], os.environ["TAG"])
    trainer = build_trainer(cfg, workdir=workdir)
    start = multihost_utils.process_allgather(trainer.state.params, tiled=True)
    trainer.train()
    full = multihost_utils.process_allgather(trainer.state.params, tiled=True)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(full)))
    if jax.process_index() == 0:
      np.savez(os.path.join(os.environ["OUT"], os.environ["TAG"] + ".npz"),
               *[np.asarray(x) for x in jax.tree.leaves(full)])
    logged = read_jsonl(os.path.join(workdir, "logs", "metrics.jsonl")) if jax.process_index() == 0 else []
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                      "devices": jax.device_count(), "step": trainer.state.step, "moved": moved,
                      "rows_per_process": [m.get("train/perf/rollout_rows_per_process") for m in logged],
                      "reward": [m.get("train/reward_mean") for m in logged]}))
""")


def _run(tag, out, devices, nproc=1, data=1, fsdp=1):
  coord = f"localhost:{_free_port()}" if nproc > 1 else ""
  procs = [subprocess.Popen(
      [sys.executable, "-c", TRAIN_SCRIPT], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=_clean_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                                OUT=str(out), TAG=tag, NPROC=str(nproc), PID=str(i), COORD=coord,
                                DATA=str(data), FSDP=str(fsdp)))
           for i in range(nproc)]
  outs = _collect(procs, timeout=600)
  params = np.load(os.path.join(out, tag + ".npz"))
  return outs, [params[k] for k in sorted(params.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.slow
def test_two_steps_equal_on_1x1_1x4_and_2_processes(tmp_path):
  single, p1 = _run("1x1", tmp_path, devices=1)
  four, p4 = _run("1x4", tmp_path, devices=4, data=4)
  two, p22 = _run("2x2", tmp_path, devices=2, nproc=2, data=4)
  assert single[0]["step"] == four[0]["step"] == two[0]["step"] == 2
  assert four[0]["devices"] == 4 and two[0]["processes"] == 2 and two[0]["devices"] == 4
  # each process generated half of the step's 8 trajectories (4 questions x G = 2)
  assert single[0]["rows_per_process"] == [8, 8] and two[0]["rows_per_process"] == [4, 4]
  assert single[0]["reward"] == four[0]["reward"] == two[0]["reward"]  # the same samples
  for a, b, c in zip(p1, p4, p22):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)  # reduction order differs
    np.testing.assert_allclose(c, a, rtol=0, atol=1e-4)
  assert single[0]["moved"] > 1e-4  # the two steps changed the params
  assert len(set(single[0]["reward"])) > 0 and 0 < max(single[0]["reward"]) < 1  # a real signal
