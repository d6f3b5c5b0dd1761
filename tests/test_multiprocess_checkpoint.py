"""Two processes (jax.distributed via cfg.distributed, one CPU device each) train the tiny config,
save every step, and resume after both restart: the step counter and PRNG key, host-local until
the fix, are saved as global arrays replicated over the mesh."""

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from test_parallel import REPO, _clean_env, _collect, _free_port
from memagent_jax.runtime import checkpointing

TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from configs import toy_cpu
    from memagent_jax.experiment import assembly
    c = toy_cpu.get_config("tiny")
    c.distributed.update(num_processes=2, process_id=int(os.environ["PID"]), coordinator_address=os.environ["COORD"])
    c.train.update(steps=int(os.environ["STEPS"]), save_every=1, async_checkpoint=True)
    c.rl.entropy_coef = 0.05  # a gradient even when every reward is 0, so params move each step
    t = assembly.build_trainer(c, workdir=os.environ["WORKDIR"])
    import jax
    from jax.experimental import multihost_utils

    def checksum(tree):
      full = multihost_utils.process_allgather(tree, tiled=True)
      return float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(full)))
    start, start_sum, rng = t.state.step, checksum(t.state.params), np.asarray(t.state.rng).tolist()
    out = t.train()
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(), "start": start,
                      "start_checksum": start_sum, "rng": rng, "step": out["step"],
                      "checksum": checksum(t.state.params)}))
""")


def _run_both(workdir, steps: int) -> list[dict]:
  coord = f"localhost:{_free_port()}"
  procs = []
  for pid in range(2):
    env = _clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=1", PID=str(pid), COORD=coord,
                     STEPS=str(steps), WORKDIR=str(workdir / "run"))  # the run's compile cache: _clean_env
    procs.append(subprocess.Popen([sys.executable, "-c", TRAIN_SCRIPT], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return _collect(procs, timeout=400)


@pytest.mark.slow
def test_two_processes_save_and_resume(tmp_path):
  first = _run_both(tmp_path, steps=1)  # was: "Cannot serialize host local jax.Array (name=rng ...)"
  assert [o["process"] for o in first] == [0, 1] and all(o["processes"] == 2 for o in first)
  assert all(o["start"] == 0 and o["step"] == 1 for o in first)
  assert first[0]["checksum"] == first[1]["checksum"] != first[0]["start_checksum"]  # params moved
  ckpt = checkpointing.Checkpointer(str(tmp_path / "run" / "checkpoints"))
  assert ckpt.all_steps() == [1]
  saved, meta = ckpt.restore()  # one process reads what two wrote
  assert meta["step"] == 1 and int(saved["step"]) == 1
  assert np.array_equal(np.asarray(saved["rng"]), np.asarray(jax.random.PRNGKey(0)))
  saved_sum = float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(saved["params"])))
  assert abs(saved_sum - first[0]["checksum"]) <= 1e-6 * saved_sum

  second = _run_both(tmp_path, steps=2)  # both processes restart and resume from step 1
  for out in second:
    assert out["start"] == 1 and out["step"] == 2 and out["rng"] == [0, 0]
    assert out["start_checksum"] == first[0]["checksum"]  # exactly the saved params
  assert second[0]["checksum"] == second[1]["checksum"] != second[0]["start_checksum"]
  assert checkpointing.Checkpointer(str(tmp_path / "run" / "checkpoints")).all_steps() == [1, 2]
