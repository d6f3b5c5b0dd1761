"""RL on a mesh of processes: two training steps of configs/toy_cpu.py:tiny give the same params on 1
device and on 2 processes x 2 devices joined by jax.distributed, the mesh data 2 x tensor 2 (rows over
`data`, one process's half each: each process generates only its half of the rollout rows; weights split
over `tensor` across the devices of a process; one process over several devices alone: test_parallel,
test_rollout_sharding, test_device_rows). The same processes first evaluate the starting policy on the
held-out set: on 2 processes each reads its half of every batch (not the whole set on both), and the sampled
answers and scores are those of one process, row for row. (One set of processes for all of it: each start,
model build and compile is paid once.)"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from test_parallel import REPO, _clean_env, _collect, _free_port

TRAIN_SCRIPT = textwrap.dedent("""
    import dataclasses, json, os, sys
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from configs import toy_cpu
    from memagent_jax.rl.metrics import read_jsonl
    from memagent_jax.rl.rollout import REWARD_FNS
    from memagent_jax.experiment.assembly import Evaluator, build_experiment
    # a from-scratch toy model scores 0 everywhere; a reward on the sampled text itself gives
    # every group a signal, so the updates move the params
    REWARD_FNS.register("answer_parity", lambda answer, pred, gold: float(sum(map(ord, answer)) % 2))
    cfg = toy_cpu.get_config("tiny")
    cfg.rl.reward = "answer_parity"
    cfg.train.steps = 2
    # a held-out set of 2 batches of 4 documents, sampled
    cfg.eval.update(every=1, size=8, batch_size=4, temperature=1.0, top_p=0.9)
    cfg.mesh.update(data=int(os.environ["DATA"]), fsdp=1, tensor=int(os.environ["TENSOR"]))
    cfg.distributed.update(num_processes=int(os.environ["NPROC"]), process_id=int(os.environ["PID"]),
                           coordinator_address=os.environ["COORD"])
    workdir = os.path.join(os.environ["OUT"], os.environ["TAG"])
    exp = build_experiment(cfg, workdir=workdir)
    from memagent_jax.runtime import parallel
    assert parallel.initialize_distributed(cfg.distributed) == (jax.process_count() > 1)  # again: a no-op
    trainer, calls = exp.trainer, []
    # the starting policy, once, before training (which then evaluates no more)
    reader = exp.evaluator.reader
    answer_batch = reader.answer_batch
    def recording(questions, documents, **kw):  # what this process read, and what it sampled
      results = answer_batch(questions, documents, **kw)
      calls.append([[r.answer, r.memories] for r in results])
      return results
    reader.answer_batch = recording
    summary = trainer.evaluate()
    summary.pop("seconds")
    reader.answer_batch = answer_batch
    try:  # 5 held-out documents do not split over 2 processes
      Evaluator(reader, exp.evaluator.task, exp.evaluator.samples[:5], cfg.eval)
      refused = ""
    except ValueError as e:
      refused = str(e)
    trainer.spec = dataclasses.replace(trainer.spec, eval_every=0)
    start = multihost_utils.process_allgather(trainer.state.params, tiled=True)
    trainer.train()
    full = multihost_utils.process_allgather(trainer.state.params, tiled=True)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(full)))
    if jax.process_index() == 0:
      np.savez(os.path.join(os.environ["OUT"], os.environ["TAG"] + ".npz"),
               *[np.asarray(x) for x in jax.tree.leaves(full)])
    logged = read_jsonl(os.path.join(workdir, "logs", "metrics.jsonl")) if jax.process_index() == 0 else []
    logged = [m for m in logged if "train/reward_mean" in m]
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                      "devices": jax.device_count(), "mesh": dict(trainer.mesh.shape) if trainer.mesh else None,
                      "step": trainer.state.step, "moved": moved,
                      "rows_per_process": [m.get("train/perf/rollout_rows_per_process") for m in logged],
                      "reward": [m.get("train/reward_mean") for m in logged],
                      "calls": calls, "summary": summary, "refused": refused}))
""")


def _run(tag, out, devices, nproc=1, data=1, tensor=1):
  coord = f"localhost:{_free_port()}" if nproc > 1 else ""
  procs = [subprocess.Popen(
      [sys.executable, "-c", TRAIN_SCRIPT], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=_clean_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                                OUT=str(out), TAG=tag, NPROC=str(nproc), PID=str(i), COORD=coord,
                                DATA=str(data), TENSOR=str(tensor)))
           for i in range(nproc)]
  outs = _collect(procs, timeout=600)
  params = np.load(os.path.join(out, tag + ".npz"))
  return outs, [params[k] for k in sorted(params.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Both layouts, each trained 2 steps after evaluating the starting policy."""
  out = tmp_path_factory.mktemp("dp")
  return {"1x1": _run("1x1", out, devices=1), "2x2": _run("2x2", out, devices=2, nproc=2, data=2, tensor=2)}


@pytest.mark.slow
def test_two_steps_equal_on_1x1_and_2_processes(runs):
  (single, p1), (two, p22) = runs["1x1"], runs["2x2"]
  assert single[0]["step"] == two[0]["step"] == 2
  assert two[0]["processes"] == 2 and two[0]["devices"] == 4
  assert [o["mesh"] for o in two] == [{"data": 2, "fsdp": 1, "tensor": 2}] * 2
  # each process generated half of the step's 8 trajectories (4 questions x G = 2)
  assert single[0]["rows_per_process"] == [8, 8] and two[0]["rows_per_process"] == [4, 4]
  assert single[0]["reward"] == two[0]["reward"]  # the same samples
  for a, c in zip(p1, p22):
    np.testing.assert_allclose(c, a, rtol=0, atol=1e-4)  # reduction order differs
  assert single[0]["moved"] > 1e-4  # the two steps changed the params
  assert len(set(single[0]["reward"])) > 0 and 0 < max(single[0]["reward"]) < 1  # a real signal


@pytest.mark.slow
def test_two_processes_split_the_held_out_set_and_score_as_one(runs):
  [one], (first, second) = runs["1x1"][0], runs["2x2"][0]
  assert second["processes"] == 2 and one["processes"] == 1
  # one process: 2 batches of 4 documents; two: each process reads 2 of each batch's 4
  assert [len(c) for c in one["calls"]] == [4, 4]
  assert [len(c) for c in first["calls"]] == [len(c) for c in second["calls"]] == [2, 2]
  # the first half of each batch on process 0, the second on process 1, each row sampled as in one process
  # (its answer and its memories)
  assert [a + b for a, b in zip(first["calls"], second["calls"])] == one["calls"]
  assert len({a for c in one["calls"] for a, _ in c}) > 1  # sampled text, not one constant answer
  timeless = lambda summary: {k: v for k, v in summary.items() if k != "seconds_per_doc"}  # wall time differs
  assert timeless(first["summary"]) == timeless(second["summary"]) == timeless(one["summary"])
  assert one["summary"]["seconds_per_doc"] > 0
  assert first["summary"]["mean_document_tokens"] > 0
  assert one["refused"] == ""  # one process takes any size
  assert "eval.size=5 and eval.batch_size=4 must be multiples of the 2 processes" in first["refused"]
