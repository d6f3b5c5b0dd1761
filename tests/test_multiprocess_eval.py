"""Held-out evaluation on 2 processes joined by jax.distributed: each process reads its half of
every batch (not the whole set on both), and the sampled answers and scores are those of one
process, row for row."""

import subprocess
import sys
import textwrap

import pytest

from test_parallel import REPO, _clean_env, _collect, _free_port

EVAL_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax
    from configs import toy_cpu
    from memagent_jax.experiment.assembly import Evaluator, build_experiment
    cfg = toy_cpu.get_config("tiny")
    batch = int(os.environ.get("BATCH", "4"))
    cfg.eval.update(every=1, size=8, batch_size=batch, temperature=1.0, top_p=0.9)
    cfg.mesh.update(data=int(os.environ["DATA"]), fsdp=1, tensor=1)
    cfg.distributed.update(num_processes=int(os.environ["NPROC"]), process_id=int(os.environ["PID"]),
                           coordinator_address=os.environ["COORD"])
    exp = build_experiment(cfg, workdir=os.path.join(os.environ["OUT"], os.environ["TAG"]))
    reader, calls = exp.evaluator.reader, []
    answer_batch = reader.answer_batch
    def recording(questions, documents, **kw):  # what this process read, and what it sampled
      results = answer_batch(questions, documents, **kw)
      calls.append([[r.answer, r.memories] for r in results])
      return results
    reader.answer_batch = recording
    summary = exp.trainer.evaluate()
    try:  # 5 held-out documents do not split over 2 processes
      Evaluator(reader, exp.evaluator.task, exp.evaluator.samples[:5], cfg.eval)
      refused = ""
    except ValueError as e:
      refused = str(e)
    summary.pop("seconds")
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(), "calls": calls,
                      "summary": summary, "refused": refused}))
""")


def _run(tag, out, nproc, data, **env):
  coord = f"localhost:{_free_port()}" if nproc > 1 else ""
  procs = [subprocess.Popen(
      [sys.executable, "-c", EVAL_SCRIPT], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=_clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=1", OUT=str(out), TAG=tag,
                     NPROC=str(nproc), PID=str(i), COORD=coord, DATA=str(data), **env))
           for i in range(nproc)]
  return _collect(procs, timeout=600)


@pytest.mark.slow
def test_two_processes_split_the_held_out_set_and_score_as_one(tmp_path):
  [one] = _run("one", tmp_path, nproc=1, data=1)
  first, second = _run("two", tmp_path, nproc=2, data=2)
  assert second["processes"] == 2 and one["processes"] == 1
  # one process: 2 batches of 4 documents; two: each process reads 2 of each batch's 4
  assert [len(c) for c in one["calls"]] == [4, 4]
  assert [len(c) for c in first["calls"]] == [len(c) for c in second["calls"]] == [2, 2]
  # the first half of each batch on process 0, the second on process 1, each row sampled as in one process
  # (its answer and its memories)
  assert [a + b for a, b in zip(first["calls"], second["calls"])] == one["calls"]
  assert len({a for c in one["calls"] for a, _ in c}) > 1  # sampled text, not one constant answer
  assert first["summary"] == second["summary"] == one["summary"]
  assert first["summary"]["mean_document_tokens"] > 0
  assert one["refused"] == ""  # one process takes any size
  assert "eval.size=5 and eval.batch_size=4 must be multiples of the 2 processes" in first["refused"]
