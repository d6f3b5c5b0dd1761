"""`memagent compile` compiles what the trainer compiles: one real tiny training step records every
heavy program it calls (the reader's memory and answer blocks, the log-prob passes, the updates) with
its argument shapes and static specs, and the compile plan of the same config asks for the same set.
Also the step's peak: a program that fits alone does not fit beside what the trainer holds."""

import jax
import numpy as np
import pytest
from flax import nnx

from configs import toy_cpu
from memagent_jax.experiment import assembly, compile_plan, compile_report, specs
from memagent_jax.rl.trainer import StepPrograms
from memagent_jax.rl import update as upd


def _config():
  """toy_cpu:tiny where the real step reaches the plan's worst case: every toy question is 8 tokens,
  every document two full chunks; the random model rarely stops, so some memory reaches its cap in
  each group; no shared template prefix (the trainer passes it only where every row of a group fits it)."""
  c = toy_cpu.get_config("tiny")
  c.agent.update(question_tokens=8, template_prefix_cache="off")
  c.data.update(length=128)
  return c


def _described(args, kwargs) -> tuple:
  """A call as jit caches it, short of shardings: every array's shape and dtype, every static by value
  (the model's graph is compared once, by value: its printed form depends on how the model was built)."""
  kwargs = {k: v for k, v in kwargs.items() if k not in ("graphdef", "tx")}
  args = tuple("graphdef" if isinstance(a, nnx.graph.GraphDef) else a for a in args)
  leaves, treedef = jax.tree.flatten((args, kwargs))
  return tuple((tuple(x.shape), str(np.dtype(x.dtype))) if hasattr(x, "shape") else x for x in leaves), str(treedef)


def _recording(fn, name, seen):
  def wrapped(*args, **kwargs):
    seen.add((name, _described(args, kwargs)))
    return fn(*args, **kwargs)
  return wrapped


def test_the_report_compiles_the_programs_a_real_step_runs(tmp_path):
  cfg = _config()
  seen = set()
  programs = StepPrograms(batch_logprobs=_recording(upd.batch_logprobs, "logprobs", seen),
                          update_step=_recording(upd.update_step, "update", seen))
  exp = assembly.build_experiment(cfg, str(tmp_path / "run"), programs=programs)
  agent = exp.agent
  agent.memory_block = _recording(agent.memory_block, "rollout", seen)
  agent.answer_block = _recording(agent.answer_block, "answer", seen)
  try:
    metrics = exp.trainer.train_step()
  finally:
    exp.trainer.close()
  assert metrics.updates == 2 and metrics.width_groups == 2  # two mini-batches, each memory rows + answer rows

  built, shapes, _ = compile_plan.build_programs(cfg, exp.mesh, specs.mesh_spec(cfg).axis_rules(), platform="cpu")
  planned = {(p.name.split("#")[0], _described(p.args, p.kwargs)) for p in built}
  assert planned == seen, (sorted(planned - seen, key=str), sorted(seen - planned, key=str))
  assert all(p.kwargs.get("graphdef", p.args[0]) == exp.policy.graphdef for p in built)
  assert len(built) == 6  # memory block, answer; updates with and without old = current; 2 log-prob widths
  assert shapes.mini_batches == 2 and len(shapes.width_groups) == 2


def test_the_step_peak_adds_what_the_trainer_holds(tmp_path, monkeypatch):
  """The same config compiled for a TPU: every program's step peak is its own peak plus the named buffers
  the trainer keeps beside it; on a chip between the largest own peak and the step's peak the program
  alone would fit, the step does not, and the error names what sits beside it."""
  cfg = _config()
  cfg.mesh.update(data=1, fsdp=4)
  topo = compile_report.tpu_targets.parse_topology("v5e:2x2")
  jax.config.update("jax_default_matmul_precision", None)  # as users compile (conftest sets "highest")
  try:
    report = compile_report.compile_step(cfg, topo, programs=("update",), progress=False)
  finally:
    jax.config.update("jax_default_matmul_precision", "highest")
  held = report["held_through_step"]
  assert {"fp32 weights", "optimizer state", "update batches (every mini-batch)"} <= set(held)
  for name, p in report["programs"].items():
    assert p["step_peak_bytes"] == p["peak_bytes"] + sum(p["co_resident"].values())
    # the update's own arguments are the weights and optimizer state: beside it, the slots and other batches
    assert "fp32 weights" not in p["co_resident"] and "optimizer state" not in p["co_resident"]
    assert p["co_resident"]["update batches (every mini-batch)"] > 0
  own = max(p["peak_bytes"] for p in report["programs"].values())
  step = max(p["step_peak_bytes"] for p in report["programs"].values())
  assert step > own
  small = dict(report, hbm_bytes_per_chip=(own + step) // 2)
  small["programs"] = {k: dict(p, fits=p["step_peak_bytes"] <= small["hbm_bytes_per_chip"])
                       for k, p in report["programs"].items()}
  assert all(p["peak_bytes"] <= small["hbm_bytes_per_chip"] for p in small["programs"].values())
  with pytest.raises(compile_report.DoesNotFitError, match=r"update.*its own \+ .*conversation slots"):
    compile_report.check_fits(small)
