"""Rollout batching: rewards, overlong shaping, dynamic sampling, advantages on every row, and
the alignment of training rows with the sampler's own log-probs."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.agent.results import AgentResult, Conversation, slots_from_results
from memagent_jax.data.tasks import QuestionBatch
from memagent_jax.rl import rollout
from memagent_jax.rl.device_rows import bucket_rows
from reference_rows import host_rows, mini_batches


def test_overlong_penalty_by_hand():
  # Lmax 8, Lcache 4: free up to 4, then (4 - L) / 4 down to -1 at 8, -1 beyond.
  got = rollout.overlong_penalty([0, 3, 4, 5, 6, 7, 8, 9], max_tokens=8, cache_tokens=4)
  np.testing.assert_allclose(got, [0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0])
  with pytest.raises(ValueError, match="cache_tokens"):
    rollout.overlong_penalty([1], max_tokens=4, cache_tokens=5)


def test_bucket_rows():
  assert [bucket_rows(r, 4) for r in (1, 4, 5, 8, 9, 13, 17, 25, 33)] == [4, 4, 8, 8, 12, 16, 24, 32, 48]


class FakeAgent:
  """Answers from a script: question "q<i>:<a,b,..>" -> trajectory j answers the j-th word.
  Memory conversations: 1 + i % 2 per trajectory; response length = len(answer word)."""
  stop_tokens, pad_id = (0,), 0

  def __init__(self):
    self.calls = []

  def answer_batch(self, questions, documents, *, temperature, top_p, seed, row_ids):
    self.calls.append((seed, list(row_ids)))
    out = []
    for q, row in zip(questions, row_ids):
      i, words = q[1:].split(":")
      words = words.split(",")
      answer = words[row % len(words)]  # row id = question * G + trajectory
      n_mem = 1 + int(i) % 2
      convs = [Conversation(prompt_ids=np.arange(1, 4 + t, dtype=np.int32),
                            response_ids=np.asarray([5, 6, 0], np.int32),
                            response_logprobs=np.full(3, -1.0, np.float32),
                            sample_logprobs=np.zeros(3, np.float32), truncated=False, is_final=False)
               for t in range(n_mem)]
      final_len = len(answer)
      convs.append(Conversation(prompt_ids=np.arange(1, 6, dtype=np.int32),
                                response_ids=np.full(final_len, 7, np.int32),
                                response_logprobs=np.full(final_len, -2.0, np.float32),
                                sample_logprobs=np.zeros(final_len, np.float32), truncated=final_len >= 6,
                                is_final=True))
      out.append(AgentResult(question=q, answer=answer, boxed=None, prediction=answer, memories=["m"] * n_mem,
                             conversations=convs, num_chunks=n_mem, document_tokens=10,
                             decoded_tokens=sum(len(c.response_ids) for c in convs), seconds=0.0))
    return out

  def rollout_slots(self, questions, documents, *, decode, prompt_width, response_width, **kw):
    results = self.answer_batch(questions, documents, temperature=decode.temperature, top_p=decode.top_p, **kw)
    return slots_from_results(results, self.pad_id, prompt_width=prompt_width, response_width=response_width)


def _cfg(**kw):
  return rollout.RolloutSpec(**{**dict(group_size=2, questions_per_step=2, rollout_batch=4, reward="exact_match",
                                       advantage="grpo"), **kw})


def _batches(specs):
  """Iterator of question batches; specs: list of lists of "i:word,word"."""
  for batch in specs:
    yield QuestionBatch(question=tuple(f"q{s}" for s in batch), context=("doc",) * len(batch),
                        answers=(("yes",),) * len(batch))


def _collect(cfg, specs):
  agent = FakeAgent()
  col = rollout.RolloutCollector(agent, cfg, prompt_width=8, response_width=8)
  out = col.collect(_batches(specs), lambda gen, sub: 1000 * gen + sub)
  return out, agent


def _host(out):
  """The step's rows as host arrays (gathered on device, as the trainer gathers them)."""
  return host_rows(out.rows)


def test_every_row_gets_its_trajectory_advantage():
  out, _ = _collect(_cfg(), [["0:yes,no", "1:yes,yes"]])
  rows = _host(out)
  # q0: rewards (1, 0) -> grpo (r - 0.5) / (std 0.7071 + 1e-6); q1: equal -> 0
  a = 0.5 / (np.sqrt(0.5) + 1e-6)
  # trajectory rows: q0/t0 has 1 memory + final, q0/t1 the same; q1's two have 2 memories + final
  want = [a, a, -a, -a, 0, 0, 0, 0, 0, 0]
  np.testing.assert_allclose(rows.advantages, want, rtol=1e-6)
  np.testing.assert_array_equal(rows.question, [0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
  assert rows.tokens.shape == (10, 16) and rows.prompt_width == 8
  assert out.metrics.reward_mean == 0.75 and out.metrics.kept_group_frac == 1.0
  # decoded tokens: q0's trajectories 3 + 3 and 3 + 2, q1's 2 x 3 + 3 each -> 29 / 4; no gate shares
  assert out.metrics.decoded_tokens_per_doc == 7.25 and out.metrics.chunks_per_doc == 1.5
  assert out.metrics.keep_frac is None and "keep_frac" not in out.metrics.scalars()


def test_dynamic_sampling_drops_equal_groups_and_refills():
  cfg = _cfg(dynamic_sampling=True, max_extra_gen_batches=2)
  out, agent = _collect(cfg, [["0:yes,yes", "1:no,no"], ["2:yes,no", "3:no,no"], ["4:no,yes", "5:yes,no"]])
  assert out.num_questions == 2  # q2 and q4 kept; q5 beyond the step's need is dropped
  assert out.metrics.gen_batches == 3 and out.metrics.kept_group_frac == pytest.approx(3 / 6)
  assert len(agent.calls) == 3 and len({seed for seed, _ in agent.calls}) == 3  # a fresh seed per batch
  assert all(rows == [0, 1, 2, 3] for _, rows in agent.calls)  # row id = question * G + trajectory
  without, _ = _collect(_cfg(), [["0:yes,yes", "1:no,no"]])
  assert without.num_questions == 2  # the knob off keeps zero-signal groups


def test_dynamic_sampling_fails_loudly_or_proceeds():
  specs = [["0:yes,yes", "1:no,no"], ["2:yes,no", "3:no,no"], ["4:no,no", "5:no,no"]]
  with pytest.raises(rollout.DynamicSamplingError, match="max_extra_gen_batches=1"):
    _collect(_cfg(dynamic_sampling=True, max_extra_gen_batches=1), specs)
  out, _ = _collect(_cfg(dynamic_sampling=True, max_extra_gen_batches=1, on_insufficient="proceed"), specs)
  assert out.num_questions == 1 and set(_host(out).question) == {0}
  none, _ = _collect(_cfg(dynamic_sampling=True, on_insufficient="proceed"), [["0:no,no", "1:no,no"]])
  assert none.rows is None and none.num_questions == 0


def test_overlong_shaping_uses_final_answer_tokens():
  # answers "yes" (3 tokens) and "yesyesy" (7 tokens); gold "yes" -> exact match 1 / 0
  plain, _ = _collect(_cfg(), [["0:yes,yesyesy", "1:yes,yes"]])
  shaped, _ = _collect(_cfg(overlong=rollout.OverlongSpec(max_tokens=8, cache_tokens=4)),
                       [["0:yes,yesyesy", "1:yes,yes"]])
  assert plain.metrics.reward_mean == 0.75
  assert shaped.metrics.reward_mean == pytest.approx((1 + (0 - 0.75) + 1 + 1) / 4)
  assert shaped.metrics.accuracy == plain.metrics.accuracy == 0.75


def test_mask_truncated_removes_capped_conversations_from_the_loss():
  specs = [["0:yes,yesyesy", "1:yes,no"]]  # "yesyesy" (7 tokens >= 6) is marked truncated
  keep, _ = _collect(_cfg(), specs)
  drop, _ = _collect(_cfg(mask_truncated=True), specs)
  assert _host(keep).loss_mask.sum() - _host(drop).loss_mask.sum() == 7
  assert len(keep.rows) == len(drop.rows)


def test_mini_batches_split_by_question_and_pad():
  out, _ = _collect(_cfg(questions_per_step=2), [["0:yes,no", "1:yes,no"]])
  parts = mini_batches(_host(out), num_questions=2, questions_per_mini_batch=1, multiple=4, pad_id=0)
  assert [len(p) for p in parts] == [4, 8]  # 4 rows -> 4; 6 rows -> bucket 8
  assert parts[1].loss_mask[6:].sum() == 0 and (parts[1].question[6:] == -1).all()
  assert parts[1].valid[6:].sum(1).tolist() == [1, 1]  # padding rows keep one valid token


def test_unknown_reward_and_batch_not_multiple_of_group():
  with pytest.raises(KeyError, match="unknown reward"):
    rollout.get_reward_fn("nope")
  with pytest.raises(ValueError, match="multiple of rl.group_size"):
    _cfg(rollout_batch=3)


def test_training_rows_reproduce_the_sampler_logprobs():
  """Rows from a real rollout, scored by the training forward, give the log-probs the sampler
  reported while generating: prompt/response alignment and padding are right."""
  import memagent_jax as mj
  from memagent_jax.data import toy
  from memagent_jax.rl import update as upd
  from memagent_jax.experiment.assembly import row_widths
  policy = mj.load_policy("random:toy-tiny", seed=3)
  agent = mj.MemAgent(policy, chunk_tokens=32, memory_tokens=8, answer_tokens=6, question_tokens=16)
  p, n = row_widths(agent, 16)
  col = rollout.RolloutCollector(agent, _cfg(reward="string_match_part"), prompt_width=p, response_width=n)
  samples = toy.generate(2, 80, seed=1)
  batch = QuestionBatch.of(samples)
  out = col.collect(itertools.repeat(batch), lambda g, s: 7)
  rows = _host(out)
  assert len(rows) > 4  # several memory updates per trajectory
  got = upd.batch_logprobs(policy.state, jnp.asarray(rows.tokens[None]), jnp.asarray(rows.valid[None]),
                           graphdef=policy.graphdef,
                           spec=upd.LogprobSpec(prompt_width=p, temperature=1.0, compute_dtype="float32"))[0]
  m = rows.loss_mask
  np.testing.assert_allclose(np.asarray(got)[m], rows.old_logp[m], atol=2e-4)
