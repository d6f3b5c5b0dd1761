"""Rollout rows are the data-parallel unit: row i samples with fold_in(key, row id i) only, so a
trajectory is the same in any batch, block size or device count, and the recurrence's rows and
memories split over the mesh's ("data", "fsdp") axes."""

import json

import numpy as np
import pytest

import memagent_jax as mj
from memagent_jax.agent import MemAgent
from memagent_jax.data import toy

from test_parallel import run_on_emulated_devices

AGENT = dict(chunk_tokens=32, memory_tokens=8, answer_tokens=4)


@pytest.fixture(scope="module")
def toy_policy():
  return mj.load_policy("random:toy-tiny", seed=3)


@pytest.fixture(scope="module")
def samples():
  rows = toy.generate(4, 96, seed=0)
  return {"question": [r["question"] for r in rows], "context": [r["context"] for r in rows]}


def _trace(results) -> list:
  """Every conversation's prompt and response ids, per trajectory."""
  return [[(c.prompt_ids.tolist(), c.response_ids.tolist()) for c in r.conversations] for r in results]


def test_a_row_samples_the_same_alone_or_in_any_batch(toy_policy, samples):
  agent = MemAgent(toy_policy, **AGENT, block_chunks=2)
  qs, docs = samples["question"], samples["context"]
  together = agent.answer_batch(qs, docs, temperature=1.0, seed=11, row_ids=[10, 11, 12, 13])
  alone = agent.answer_batch(qs[3:], docs[3:], temperature=1.0, seed=11, row_ids=[13])
  other_blocks = MemAgent(toy_policy, **AGENT, block_chunks=3).answer_batch(
      qs, docs, temperature=1.0, seed=11, row_ids=[10, 11, 12, 13])
  assert _trace(together) == _trace(other_blocks)
  assert _trace(together)[3] == _trace(alone)[0]
  assert min(r.num_chunks for r in together) >= 3  # several blocks, several chunk keys


def test_row_ids_change_the_sample_and_are_checked(toy_policy, samples):
  agent = MemAgent(toy_policy, **AGENT)
  qs, docs = samples["question"][:2], samples["context"][:2]
  a = agent.answer_batch(qs, docs, temperature=1.0, seed=11, row_ids=[0, 1])
  b = agent.answer_batch(qs, docs, temperature=1.0, seed=11, row_ids=[5, 6])
  assert _trace(a) != _trace(b)  # a row's randomness is its id, not its position
  with pytest.raises(ValueError, match="row_ids must be 2 integers"):
    agent.answer_batch(qs, docs, temperature=1.0, row_ids=[0])
  with pytest.raises(ValueError, match="row_ids must be 2 integers"):
    agent.answer_batch(qs, docs, temperature=1.0, row_ids=[0, -1])


SHARDED_ROLLOUT = """
import json
import jax, numpy as np
import memagent_jax as mj
from memagent_jax.runtime import parallel
from memagent_jax.agent import MemAgent
from memagent_jax.data import toy
s = toy.generate(8, 96, seed=0)
s = {k: [r[k] for r in s] for k in ("question", "context")}
outs = {}
for data, fsdp in ((1, 1), (4, 1), (2, 2)):  # one process: the meshes share its start and its tokenizer
  policy = mj.load_policy("random:toy-tiny", seed=3)
  mesh = None
  if data * fsdp > 1:
    mesh = parallel.make_mesh(parallel.MeshSpec(data=data, fsdp=fsdp, tensor=1),
                              devices=jax.devices()[:data * fsdp])
    policy.state = parallel.shard_params(policy.state, mesh)  # params sharded as in training
  agent = MemAgent(policy, chunk_tokens=32, memory_tokens=8, answer_tokens=4, block_chunks=2, mesh=mesh)
  res = agent.answer_batch(s["question"], s["context"], temperature=1.0, seed=7, row_ids=list(range(8)))
  trace = [[(c.prompt_ids.tolist(), c.response_ids.tolist()) for c in r.conversations] for r in res]
  logp = [float(x) for r in res for c in r.conversations for x in c.response_logprobs]
  leaf = jax.tree.leaves(policy.state)[0]
  outs[f"{data},{fsdp}"] = {"trace": trace, "logp": logp, "devices": len(jax.devices()),
                           "param_sharding": str(leaf.sharding.spec) if mesh else ""}
try:  # 3 rows on the last mesh (data 2 x fsdp 2): refused, not split unevenly
  agent.answer_batch(s["question"][:3], s["context"][:3])
  outs["error"] = None
except ValueError as e:
  outs["error"] = str(e)
print(json.dumps(outs))
"""


@pytest.mark.slow
def test_rollouts_equal_on_one_and_four_devices():
  """The same trajectories (tokens and log-probs) from 1 device, 4 x data and 2 x 2 data x fsdp; a batch
  that does not divide the mesh's rows is an error naming both."""
  outs = run_on_emulated_devices(SHARDED_ROLLOUT, n=4, timeout=300)
  assert outs["error"] and "3 rows" in outs["error"] and "data x fsdp = 2 x 2 = 4" in outs["error"]
  base = outs["1,1"]["trace"]
  assert len(base) == 8 and all(len(t) >= 3 for t in base)
  for m in ("4,1", "2,2"):
    assert outs[m]["devices"] == 4
    assert outs[m]["trace"] == base, m
    np.testing.assert_allclose(outs[m]["logp"], outs["1,1"]["logp"], atol=1e-4)
  assert "fsdp" in outs["2,2"]["param_sharding"]
