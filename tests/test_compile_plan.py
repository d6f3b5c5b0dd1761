"""`memagent compile` compiles what the trainer compiles: one real tiny training step records every
heavy program it calls (the reader's memory and answer blocks, the log-prob passes, the updates) with
its argument shapes and static specs, and the compile plan of the same config asks for the same set.
(The step's peak, each program's own plus what the trainer holds beside it: test_tpu_compile.)"""

import jax
import numpy as np
from flax import nnx

from configs import toy_cpu
from memagent_jax.experiment import assembly, compile_plan, specs
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
