"""Rows gathered on device from conversation slots equal the host-built rows, mini-batch by
mini-batch (rl/device_rows.py against rl/batching.py + rl/update.split_micro)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from memagent_jax.agent.results import AgentResult, Conversation, ConversationBatch, ConversationSlots
from memagent_jax.rl import device_rows
from memagent_jax.rl import update as upd
from memagent_jax.rl.batching import mini_batches, rows_from_conversations

P, N, PAD = 10, 6, 0


def _results(seed: int, trajectories: int):
  """Trajectories of 1..3 memory updates and a final answer, ragged lengths, some truncated."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(trajectories):
    convs = []
    turns = int(rng.integers(1, 4))
    for t in range(turns + 1):
      lp, ln = int(rng.integers(2, P + 1)), int(rng.integers(1, N + 1))
      convs.append(Conversation(prompt_ids=rng.integers(1, 50, lp).astype(np.int32),
                                response_ids=rng.integers(1, 50, ln).astype(np.int32),
                                response_logprobs=rng.standard_normal(ln).astype(np.float32),
                                sample_logprobs=np.zeros(ln, np.float32), truncated=bool(rng.random() < 0.3),
                                is_final=t == turns))
    out.append(AgentResult(question="q", answer="a", boxed=None, prediction=None, memories=[], conversations=convs,
                           num_chunks=turns, document_tokens=0))
  return out


def _slots(batch: ConversationBatch) -> ConversationSlots:
  return ConversationSlots(prompt=batch.prompt_ids, prompt_len=batch.prompt_lengths, response=batch.response_ids,
                           response_len=batch.response_mask.sum(1).astype(np.int32),
                           logprobs=batch.response_logprobs, truncated=batch.truncated)


@pytest.mark.parametrize("mask_truncated", [False, True])
@pytest.mark.parametrize("micro_batches,multiple", [(1, 1), (2, 4)])
def test_device_rows_equal_host_rows(mask_truncated, micro_batches, multiple):
  group = 2
  results = _results(0, trajectories=10)  # 5 questions x 2 trajectories
  batch = ConversationBatch.from_results(results, PAD, prompt_width=P, response_width=N)
  adv = np.random.default_rng(1).standard_normal(len(results)).astype(np.float32)
  row_adv, row_q = adv[batch.trajectory], (batch.trajectory // group).astype(np.int32)
  host = rows_from_conversations(batch, row_advantages=row_adv, row_question=row_q, mask_truncated=mask_truncated)
  want = mini_batches(host, num_questions=5, questions_per_mini_batch=2, multiple=multiple * micro_batches,
                      pad_id=PAD)
  plans = device_rows.plan_mini_batches(np.arange(len(batch)), row_q, row_adv, questions_per_mini_batch=2,
                                        multiple=multiple * micro_batches, num_questions=5)
  assert len(plans) == len(want) == 3
  slots = _slots(batch)
  for plan, part in zip(plans, want):
    np.testing.assert_array_equal(plan.question, part.question)
    got = device_rows.gather_update_batch(slots, plan, micro_batches=micro_batches, mask_truncated=mask_truncated,
                                          pad_id=PAD)
    ref = upd.split_micro(part.arrays(), micro_batches)
    for name in ("tokens", "valid", "loss_mask", "old_logp", "ref_logp", "advantages"):
      np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(ref, name), err_msg=name)


def test_rows_must_split_into_micro_batches():
  batch = ConversationBatch.from_results(_results(2, 2), PAD, prompt_width=P, response_width=N)
  plan = device_rows.MiniBatchPlan(slot=np.arange(3, dtype=np.int32), advantages=np.zeros(3, np.float32),
                                   question=np.zeros(3, np.int32))
  with pytest.raises(ValueError, match="3 rows do not split into 2 micro-batches"):
    device_rows.gather_update_batch(_slots(batch), plan, micro_batches=2, mask_truncated=False, pad_id=PAD)


_SHARDED = r"""
import numpy as np, jax
from memagent_jax.runtime import parallel
from memagent_jax.rl import device_rows
import test_device_rows as t
from memagent_jax.agent.results import ConversationBatch
from memagent_jax.rl.batching import mini_batches, rows_from_conversations
from memagent_jax.rl import update as upd
mesh = parallel.make_mesh(parallel.MeshSpec(data=2, fsdp=2, tensor=1))
results = t._results(3, trajectories=8)
batch = ConversationBatch.from_results(results, t.PAD, prompt_width=t.P, response_width=t.N)
row_q = (batch.trajectory // 2).astype(np.int32)
row_adv = np.linspace(-1, 1, len(batch)).astype(np.float32)
host = rows_from_conversations(batch, row_advantages=row_adv, row_question=row_q, mask_truncated=True)
[part] = mini_batches(host, num_questions=4, questions_per_mini_batch=4, multiple=8, pad_id=t.PAD)
[plan] = device_rows.plan_mini_batches(np.arange(len(batch)), row_q, row_adv, questions_per_mini_batch=4,
                                       multiple=8, num_questions=4)
got = device_rows.gather_update_batch(t._slots(batch), plan, micro_batches=2, mask_truncated=True, pad_id=t.PAD,
                                      mesh=mesh)
ref = upd.split_micro(part.arrays(), 2)
for name in ("tokens", "valid", "loss_mask", "old_logp", "advantages"):
  x = getattr(got, name)
  np.testing.assert_array_equal(np.asarray(x), getattr(ref, name), err_msg=name)
  want = parallel.shard_micro_batches(getattr(ref, name), mesh).sharding
  assert x.sharding.is_equivalent_to(want, x.ndim), (name, x.sharding, want)
  assert x.addressable_shards[0].data.shape[1] == x.shape[1] // 4  # rows split over data x fsdp
print("OK")
"""


def test_device_rows_are_split_over_the_mesh_like_host_rows(tmp_path):
  """On 4 CPU devices (data 2 x fsdp 2) the gathered rows equal the host rows and carry the sharding
  `parallel.shard_micro_batches` gives them."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.getcwd(), os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]
