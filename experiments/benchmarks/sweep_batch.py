"""make reproduce's length-sweep batch as one call, shared by the sweep benchmark and the thunk profile."""

from __future__ import annotations

from configs import toy_memagent
from memagent_jax.data import tasks
from memagent_jax.experiment.assembly import load_reader


def sweep_batch(multiple: int, n: int, source: str):
  """A no-argument call reading make reproduce's sweep documents of `multiple` x 128 tokens (n of them,
  documents seed 1000 + length, sampling seed 1000, the evaluation's temperature and top-p) with the
  reader at `source`; returns its AgentResults."""
  cfg = toy_memagent.get_config("rl,full,lookup")
  reader = load_reader(cfg, source, training=False)
  length = 128 * multiple
  samples = tasks.make_samples(cfg.data.task, length, n, 1000 + length, reader.tokenizer,
                               chunk_tokens=cfg.agent.chunk_tokens)
  questions, docs = [s["question"] for s in samples], [s["context"] for s in samples]
  return lambda: reader.answer_batch(questions, docs, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                                     seed=1000)
