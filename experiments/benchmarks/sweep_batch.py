"""make reproduce's length-sweep batch as one call, shared by the sweep benchmarks and the thunk profile."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
from flax import nnx

from configs import toy_memagent
from memagent_jax.data import tasks
from memagent_jax.experiment.assembly import load_reader


def set_sample_group_bytes(reader, group_bytes: int):
  """The reader model's `AttentionSpec.cpu_sample_group_bytes` (0: all rows at once). A static field of the
  model, so the policy's graphdef is split again (and its programs compile anew)."""
  policy = reader.policy
  policy.model.set_attention(dataclasses.replace(policy.model.attention, cpu_sample_group_bytes=group_bytes))
  policy.graphdef, policy.state = nnx.split(policy.model)


def sweep_reader(multiple: int, n: int, source: str, mesh=None):
  """(config, the reader at `source`, questions, documents): make reproduce's sweep documents of
  `multiple` x 128 tokens, n of them, documents seed 1000 + length; mesh: the devices its rows split over."""
  cfg = toy_memagent.get_config("rl,full,lookup")
  reader = load_reader(cfg, source, training=False, mesh=mesh)
  length = 128 * multiple
  samples = tasks.make_samples(cfg.data.task, length, n, 1000 + length, reader.tokenizer,
                               chunk_tokens=cfg.agent.chunk_tokens)
  return cfg, reader, [s["question"] for s in samples], [s["context"] for s in samples]


def sweep_batch(multiple: int, n: int, source: str, sample_group_bytes: int | None = None):
  """A no-argument call reading the `sweep_reader` documents (sampling seed 1000, the evaluation's
  temperature and top-p); returns its AgentResults. sample_group_bytes: see `set_sample_group_bytes`
  (None: the model's default)."""
  cfg, reader, questions, docs = sweep_reader(multiple, n, source)
  if sample_group_bytes is not None:
    set_sample_group_bytes(reader, sample_group_bytes)
  return lambda: reader.answer_batch(questions, docs, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                                     seed=1000)


def digests(results) -> tuple[str, str]:
  """Digests of every answer and memory, and of every log-prob of them (every float the sampler computed
  for them), so two runs are shown to read the documents identically."""
  text = hashlib.sha256(repr([(r.answer, r.memories) for r in results]).encode()).hexdigest()[:12]
  logprobs = np.concatenate([c.response_logprobs for r in results for c in r.conversations]).astype(np.float32)
  return text, hashlib.sha256(logprobs.tobytes()).hexdigest()[:12]
