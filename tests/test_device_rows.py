"""Rows gathered on device from conversation slots equal the host-built rows, mini-batch by
mini-batch (rl/device_rows.py against the host reference, reference_rows.py + rl/update.split_micro)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from memagent_jax.agent.results import AgentResult, Conversation, ConversationBatch, ConversationSlots
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.rl import device_rows
from memagent_jax.rl import update as upd
from conftest import TEST_XLA_FLAGS
from reference_rows import language_model_rows, mini_batches, prefix_fits, rows_from_conversations

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
                           num_chunks=turns, document_tokens=0,
                           decoded_tokens=sum(len(c.response_ids) for c in convs), seconds=0.0))
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
    got, fits = device_rows.gather_update_batch(slots, plan, micro_batches=micro_batches,
                                                mask_truncated=mask_truncated, pad_id=PAD)
    assert not bool(fits)  # no prefix given
    ref = upd.split_micro(part.arrays(), micro_batches)
    for name in ("tokens", "valid", "loss_mask", "old_logp", "ref_logp", "advantages"):
      np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(ref, name), err_msg=name)


def test_prefix_check_and_prompt_loss_on_device_match_the_host():
  """The gather's shared-prefix check agrees with the host `prefix_fits` (rows that start with the
  prefix, rows padded past it, a row that breaks it), and loss_on_prompt gives the host
  `language_model_rows`."""
  results = _results(5, trajectories=4)
  prefix = np.asarray([3, 4, 5], np.int32)
  for r in results:
    for c in r.conversations:
      if len(c.prompt_ids) >= 5:
        c.prompt_ids[:3] = prefix  # padded prompts (< 5 tokens here) keep >= 5 padding slots first
  batch = ConversationBatch.from_results(results, PAD, prompt_width=P, response_width=N)
  q = np.arange(len(batch), dtype=np.int32)
  host = rows_from_conversations(batch, row_advantages=np.ones(len(batch)), row_question=q, mask_truncated=False)
  plan = device_rows.MiniBatchPlan(slot=np.arange(len(batch), dtype=np.int32), advantages=np.ones(len(batch)), question=q)
  for pref in (prefix, prefix[:2], np.asarray([3, 9], np.int32)):
    _, fits = device_rows.gather_update_batch(_slots(batch), plan, micro_batches=1, mask_truncated=False, pad_id=PAD,
                                              prefix=pref)
    assert bool(fits) == prefix_fits(host.tokens, host.valid, pref, P), pref
  assert prefix_fits(host.tokens, host.valid, prefix, P)  # the case that matters is covered
  got, _ = device_rows.gather_update_batch(_slots(batch), plan, micro_batches=1, mask_truncated=False, pad_id=PAD,
                                           loss_on_prompt=True)
  want = language_model_rows(host)
  for name in ("tokens", "valid", "loss_mask", "old_logp", "ref_logp"):
    np.testing.assert_array_equal(np.asarray(getattr(got, name))[0], getattr(want, name), err_msg=name)


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
from reference_rows import mini_batches, rows_from_conversations
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
got, _ = device_rows.gather_update_batch(t._slots(batch), plan, micro_batches=2, mask_truncated=True, pad_id=t.PAD,
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
  env = dict(os.environ, XLA_FLAGS=f"{TEST_XLA_FLAGS} --xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.getcwd(), os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_reader_slots_hold_the_conversations_answer_batch_returns():
  """MemAgent.rollout_slots keeps on device exactly the conversations answer_batch builds on the host
  (same seeds and row ids): tokens, lengths, log-probs, truncation, answers, chunk counts."""
  import memagent_jax as mj
  from memagent_jax.data import toy
  from memagent_jax.experiment.assembly import row_widths
  policy = mj.load_policy("random:toy-tiny", seed=5)
  agent = mj.MemAgent(policy, chunk_tokens=32, memory_tokens=8, answer_tokens=6, question_tokens=16, block_chunks=2)
  samples = toy.generate(3, 40 + 50 * 2, seed=4)  # 4-6 chunks: two blocks, rows ending at different chunks
  questions, docs = [s["question"] for s in samples], [s["context"][:200 + 90 * i] for i, s in enumerate(samples)]
  p, n = row_widths(agent, 16)
  kw = dict(temperature=1.0, top_p=0.9, seed=11, row_ids=[4, 9, 2])
  results = agent.answer_batch(questions, docs, **kw)
  got = agent.rollout_slots(questions, docs, decode=DecodeSpec(temperature=1.0, top_p=0.9), seed=11, row_ids=[4, 9, 2],
                            prompt_width=p, response_width=n)
  want = ConversationBatch.from_results(results, agent.pad_id, prompt_width=p, response_width=n)
  assert got.answers == [r.answer for r in results] and got.predictions == [r.prediction for r in results]
  assert got.num_chunks.tolist() == [r.num_chunks for r in results] and len(set(got.num_chunks.tolist())) > 1
  row, turn = np.nonzero(got.active)
  turn = np.where(got.is_final[row, turn], [len(results[r].conversations) - 1 for r in row], turn)
  order = np.lexsort((turn, row))  # conversation order: row by row, turns in order (final last)
  slot = (row * got.turns + np.nonzero(got.active)[1])[order]
  np.testing.assert_array_equal(row[order], want.trajectory)
  np.testing.assert_array_equal(turn[order], want.turn)
  s = got.slots
  np.testing.assert_array_equal(np.asarray(s.prompt)[slot], want.prompt_ids)
  np.testing.assert_array_equal(np.asarray(s.prompt_len)[slot], want.prompt_lengths)
  np.testing.assert_array_equal(np.asarray(s.response)[slot], want.response_ids)
  np.testing.assert_array_equal(np.asarray(s.response_len)[slot], want.response_mask.sum(1))
  np.testing.assert_array_equal(np.asarray(s.logprobs)[slot], want.response_logprobs)
  np.testing.assert_array_equal(np.asarray(s.truncated)[slot], want.truncated)


def test_width_groups_keep_every_row_and_cut_padding():
  """Final-answer-like short prompts go to a narrow group: every kept row appears once, with the
  same tokens (left padding cut), and the groups hold fewer slots than one full-width batch."""
  results = _results(7, trajectories=12)
  batch = ConversationBatch.from_results(results, PAD, prompt_width=32, response_width=N)
  prompt_len = batch.prompt_lengths.copy()
  rows = device_rows.SlotRows(slots=ConversationSlots(
      prompt=batch.prompt_ids, prompt_len=batch.prompt_lengths, response=batch.response_ids,
      response_len=batch.response_mask.sum(1).astype(np.int32), logprobs=batch.response_logprobs,
      truncated=batch.truncated), slot=np.arange(len(batch), dtype=np.int32),
      question=(batch.trajectory // 2).astype(np.int32), advantages=np.linspace(-1, 1, len(batch)).astype(np.float32),
      tokens=prompt_len + batch.response_mask.sum(1), prompt_len=prompt_len, pad_id=PAD)
  [full] = rows.mini_batches(num_questions=6, questions_per_mini_batch=6, multiple=2, max_groups=0)
  [groups] = rows.mini_batches(num_questions=6, questions_per_mini_batch=6, multiple=2)
  assert len(full) == 1 and len(groups) == 2
  widths = [g.prompt_width for g in groups]
  assert widths[0] < widths[1] <= 32 and all(w % 8 == 0 for w in widths)
  slots = lambda plans: sum(len(g.slot) * ((g.prompt_width or 32) + N) for g in plans)
  assert slots(groups) < 0.85 * slots(full)
  assert sum(g.real_tokens for g in groups) - sum((g.slot < 0).sum() for g in groups) == rows.tokens.sum()
  want = {}  # slot -> (row tokens without padding, loss tokens, advantage)
  ref, _ = device_rows.gather_update_batch(rows.slots, full[0], micro_batches=1, mask_truncated=False, pad_id=PAD)
  for i, s in enumerate(full[0].slot):
    if s >= 0:
      want[int(s)] = (np.asarray(ref.tokens[0, i])[np.asarray(ref.valid[0, i])].tolist(),
                      np.asarray(ref.old_logp[0, i]).tolist(), float(ref.advantages[0, i]))
  got = {}
  for g in groups:
    b, _ = device_rows.gather_update_batch(rows.slots, g, micro_batches=2, mask_truncated=False, pad_id=PAD)
    assert b.tokens.shape[-1] == g.prompt_width + N
    flat = lambda x: np.asarray(x).reshape((-1,) + x.shape[2:])
    for i, s in enumerate(g.slot):
      if s >= 0:
        got[int(s)] = (flat(b.tokens)[i][flat(b.valid)[i]].tolist(), flat(b.old_logp)[i].tolist(),
                       float(flat(b.advantages)[i]))
  assert got == want


def test_group_width_is_the_smallest_eighth_that_holds_the_rows():
  full = 176  # eighths rounded up to 8 columns: 24, 48, 72, 88, 112, 136, 160, 176
  assert [device_rows.group_width(n, full) for n in (1, 24, 25, 50, 88, 89, 161, 176)] == [24, 24, 48, 72, 88, 112,
                                                                                            176, 176]
