"""Gate reward terms, turn-level advantages and their mix, each against numbers worked out by hand,
and through the rollout collector (rows of a scripted gated reader)."""

import dataclasses
import types

import numpy as np
import pytest

from memagent_jax.agent import gates
from memagent_jax.agent.results import AgentResult, Conversation, slots_from_results
from memagent_jax.data import toy
from memagent_jax.data.tasks import QuestionBatch
from memagent_jax.evaluation import Sampling, run_eval
from memagent_jax.rl import gate_signals, rollout
from reference_rows import host_rows

K, M, S, I = gates.KEEP, gates.MEMORY, gates.STOP, gates.INVALID


def outcome():
  """Two trajectories of one group. 0: right (score 1), turns keep, memory, stop, then the answer at
  turn 3; 5 chunks, 3 read. 1: wrong (score 0), turns keep, invalid, the answer at turn 2; 2 chunks."""
  return gate_signals.GateOutcome(score=np.asarray([1.0, 0.0]),
                                  gate=np.asarray([[K, M, S, 0], [K, I, 0, 0]]),
                                  memory_turn=np.asarray([[1, 1, 1, 0], [1, 1, 0, 0]], bool),
                                  doc_chunks=np.asarray([5, 2]))


def test_each_term_by_hand():
  o = outcome()
  # update: sign (+1, -1) x keep share (1/3, 1/2); per turn: sign on the keep turn
  traj, turn = gate_signals.GATE_TERMS.get("keep")(o)
  np.testing.assert_allclose(traj, [1 / 3, -1 / 2])
  np.testing.assert_allclose(turn, [[1, 0, 0, 0], [-1, 0, 0, 0]])
  # exit: trajectory 0 stopped after 3 of 5 chunks: +1 x 2/5, on its stop turn; 1 never stopped
  traj, turn = gate_signals.GATE_TERMS.get("exit")(o)
  np.testing.assert_allclose(traj, [0.4, 0.0])
  np.testing.assert_allclose(turn, [[0, 0, 0.4, 0], [0, 0, 0, 0]])
  # format: minus the invalid share: 0 and 1/2; per turn -1 on the invalid one
  traj, turn = gate_signals.GATE_TERMS.get("format")(o)
  np.testing.assert_allclose(traj, [0.0, -0.5])
  np.testing.assert_allclose(turn, [[0, 0, 0, 0], [0, -1, 0, 0]])


def test_evidence_term_by_hand():
  """Evidence (the chunk holds a gold answer) at trajectory 0's turn 1 and trajectory 1's turn 0."""
  o = outcome()
  evidence = np.asarray([[0, 1, 1, 0], [1, 0, 0, 0]], bool)
  traj, turn = gate_signals.GATE_TERMS.get("evidence")(dataclasses.replace(o, evidence=evidence))
  # 0: kept past no evidence +1, wrote from evidence +1, stopped 0: 2 over 3 memory turns
  # 1: kept past evidence -1, invalid 0: -1 over 2 memory turns
  np.testing.assert_allclose(turn, [[1, 1, 0, 0], [-1, 0, 0, 0]])
  np.testing.assert_allclose(traj, [2 / 3, -1 / 2])
  # a write from a chunk without evidence (a distractor's chunk) costs: trajectory 0 writing at turn 0
  wrote = dataclasses.replace(o, evidence=evidence, gate=np.asarray([[M, M, S, 0], [K, I, 0, 0]]))
  np.testing.assert_allclose(gate_signals.GATE_TERMS.get("evidence")(wrote)[1][0], [-1, 1, 0, 0])
  with pytest.raises(ValueError, match="evidence"):
    gate_signals.GATE_TERMS.get("evidence")(o)


def test_answer_in_chunks_reads_whole_normalised_words():
  chunks = [["the code of oslo is tiger .", "The Tigers sleep", "x"], ["an otter", "Otter!"]]
  got = gate_signals.answer_in_chunks(chunks, [["tiger"], ["The otter", "seal"]], turns=4)
  # row 0: "tiger" whole word in chunk 0 only ("Tigers" is another word); past its 3 chunks: False
  # row 1: both chunks hold "otter" once articles, case and punctuation are dropped
  np.testing.assert_array_equal(got, [[1, 0, 0, 0], [1, 1, 0, 0]])
  assert not gate_signals.answer_in_chunks([["a b"]], [[""]], turns=1).any()  # an empty answer matches nothing


def test_weighted_terms_by_hand():
  # update 1, exit 2, format 0.5: 1/3 + 0.8 = 1.1333..; -1/2 - 0.25 = -0.75
  traj, turn = gate_signals.weighted_terms(outcome(), {"keep": 1.0, "exit": 2.0, "format": 0.5})
  np.testing.assert_allclose(traj, [1 / 3 + 0.8, -0.75])
  np.testing.assert_allclose(turn, [[1, 0, 0.8, 0], [-1, -0.5, 0, 0]])
  zero_traj, zero_turn = gate_signals.weighted_terms(outcome(), {"keep": 0.0, "exit": 0.0, "format": 0.0})
  assert not zero_traj.any() and not zero_turn.any()


def test_turn_advantages_and_mix_by_hand():
  # turn rewards = final reward (1, 0) + the weighted turn terms above:
  #   0: [2, 1, 1.8, 1 (answer)]   1: [-1, -0.5, 0 (answer), off]
  rewards = np.asarray([[2.0, 1.0, 1.8, 1.0], [-1.0, -0.5, 0.0, 0.0]])
  valid = np.asarray([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
  final = np.asarray([[0, 0, 0, 1], [0, 0, 1, 0]], bool)
  turn = gate_signals.turn_advantages(rewards, valid, final, group_ids=np.asarray([7, 7]))
  # turn 0: mean 0.5 -> +-1.5; turn 1: mean 0.25 -> +-0.75; turn 2 of 0 alone -> 0; answers (turns 3 and 2):
  # mean 0.5 -> +-0.5; 1's turn 3 is off -> 0
  np.testing.assert_allclose(turn, [[1.5, 0.75, 0.0, 0.5], [-1.5, -0.75, -0.5, 0.0]])
  # two groups never mix: the same rows in groups of one centre on themselves
  np.testing.assert_allclose(gate_signals.turn_advantages(rewards, valid, final, np.asarray([0, 1])), 0.0)
  # trajectory rewards 1 + 1.1333.. and 0 - 0.75, mean-centred: +-1.441666..
  traj = np.asarray([1.4416667, -1.4416667])
  mixed = gate_signals.ADVANTAGE_MODES.get("turn_mix")(traj, turn, weight=0.25)
  np.testing.assert_allclose(mixed, [[1.45625, 1.26875, 1.08125, 1.20625],
                                     [-1.45625, -1.26875, -1.20625, -1.08125]], rtol=1e-6)
  same = gate_signals.ADVANTAGE_MODES.get("trajectory")(traj, turn, weight=0.25)
  np.testing.assert_allclose(same, [[1.4416667] * 4, [-1.4416667] * 4])
  np.testing.assert_allclose(gate_signals.ADVANTAGE_MODES.get("turn_mix")(traj, turn, weight=0.0), same)


class GatedAgent:
  """A scripted gated reader, one question "q:<a>,<b>" -> trajectory j answers word j. Trajectory 0:
  turns keep, memory, stop (5 chunks); trajectory 1: keep, invalid (2 chunks). As in `outcome()`."""
  stop_tokens, pad_id = (0,), 0

  def rollout_slots(self, questions, documents, *, decode, prompt_width, response_width, seed, row_ids):
    results, docs = [], []
    for q, row in zip(questions, row_ids):
      answer = q[2:].split(",")[row % 2]
      names = [["keep", "memory", "stop"], ["keep", "invalid"]][row % 2]
      convs = [Conversation(prompt_ids=np.arange(1, 4, dtype=np.int32), response_ids=np.asarray([5, 0], np.int32),
                            response_logprobs=np.zeros(2, np.float32), sample_logprobs=np.zeros(2, np.float32),
                            truncated=False, is_final=t == len(names)) for t in range(len(names) + 1)]
      results.append(AgentResult(question=q, answer=answer, boxed=None, prediction=answer, memories=["m"] * len(names),
                                 conversations=convs, num_chunks=len(names), document_tokens=10,
                                 decoded_tokens=2 * len(convs), seconds=0.0, gates=names))
      docs.append([5, 2][row % 2])
    slots = slots_from_results(results, self.pad_id, prompt_width=prompt_width, response_width=response_width)
    slots.doc_chunks = np.asarray(docs, np.int32)
    return slots

  def chunk_texts(self, documents):
    """The document's 5 chunks: the answer "yes" in chunks 1 and 2."""
    return [["a", "yes b", "yes", "d", "e"] for _ in documents]


def _rows(question="q:yes,no", **kw):
  spec = rollout.RolloutSpec(group_size=2, questions_per_step=1, rollout_batch=2, reward="exact_match",
                             advantage="mean_centred", **kw)
  col = rollout.RolloutCollector(GatedAgent(), spec, prompt_width=8, response_width=8)
  batches = iter([QuestionBatch(question=(question,), context=("doc",), answers=(("yes",),))] * 2)
  out = col.collect(batches, lambda gen, sub: 0)
  return out, host_rows(out.rows) if out.rows is not None else None


def test_collector_rewards_and_turn_mix_by_hand():
  weights = (("exit", 2.0), ("format", 0.5), ("keep", 1.0))
  out, rows = _rows(gate_weights=weights, advantage_mode="turn_mix", turn_advantage_weight=0.25)
  # the rewards of test_turn_advantages_and_mix_by_hand: 2.1333.. and -0.75
  assert out.metrics.reward_mean == pytest.approx((1 + 1 / 3 + 0.8 - 0.75) / 2)
  # rows: trajectory 0's four turns, then trajectory 1's three
  np.testing.assert_allclose(rows.advantages, [1.45625, 1.26875, 1.08125, 1.20625, -1.45625, -1.26875, -1.20625],
                             rtol=1e-5)
  # the gate shares over the 5 memory turns: keep 2, stop 1, invalid 1
  m = out.metrics
  assert (m.keep_frac, m.stop_frac, m.invalid_frac) == (0.4, 0.2, 0.2)
  assert m.decoded_tokens_per_doc == 7.0 and m.chunks_per_doc == 2.5  # 8 + 6 tokens; 3 + 2 chunks read


def test_collector_evidence_term_reads_each_turns_chunk():
  """Through the collector: the evidence comes from the reader's chunks and the row's gold answers."""
  out, rows = _rows(gate_weights=(("evidence", 1.0),), advantage_mode="turn_mix", turn_advantage_weight=1.0)
  # rewards: 1 + 2/3 (keep past "a" +1, write from "yes b" +1, stop 0) and 0 + 1/2 (keep past "a" +1, invalid 0)
  assert out.metrics.reward_mean == pytest.approx((1 + 2 / 3 + 1 / 2) / 2)
  # turn-level only (weight 1): turn rewards [2, 2, 1, 1 (answer)] and [1, 0, 0 (answer)], centred per position
  np.testing.assert_allclose(rows.advantages, [0.5, 1.0, 0.0, 0.5, -0.5, -1.0, -0.5], rtol=1e-6)
  assert out.metrics.evidence_agree_frac == 0.6  # 3 of the 5 memory turns (stop and invalid agree with nothing)
  assert _rows()[0].metrics.evidence_agree_frac is None  # logged only where the term is weighed


def test_dynamic_sampling_keeps_a_group_for_its_gate_terms():
  """Both trajectories answer "yes" (scores agree): DAPO's filter drops the group; with "score_or_gates" weighed
  gate terms that differ between the trajectories are an advantage of their own, and keep it."""
  sampling = dict(dynamic_sampling=True, max_extra_gen_batches=1, on_insufficient="proceed",
                  dynamic_sampling_filter="score_or_gates")
  dropped, _ = _rows("q:yes,yes", **sampling)
  assert dropped.rows is None and dropped.metrics.kept_group_frac == 0.0 and dropped.metrics.gen_batches == 2
  assert dropped.metrics.gate_signal_groups is None  # no gate term weighed
  dapo, _ = _rows("q:yes,yes", gate_weights=(("evidence", 1.0),), **dict(sampling, dynamic_sampling_filter="score"))
  assert dapo.rows is None and dapo.metrics.gate_signal_groups is None  # DAPO's filter: the scores alone
  for mode, weight in (("trajectory", 0.0), ("turn_mix", 1.0)):
    out, rows = _rows("q:yes,yes", gate_weights=(("evidence", 1.0),), advantage_mode=mode, turn_advantage_weight=weight,
                      **sampling)
    assert out.metrics.gate_signal_groups == 1 and out.metrics.kept_group_frac == 1.0 and out.metrics.gen_batches == 1
    if mode == "trajectory":  # rewards 1 + 2/3 and 1 + 1/2, mean-centred on every turn
      np.testing.assert_allclose(rows.advantages, [1 / 12] * 4 + [-1 / 12] * 3, rtol=1e-5)
    else:  # turn rewards [2, 2, 1, 1 (answer)] and [2, 1, 1 (answer)], centred per position
      np.testing.assert_allclose(rows.advantages, [0.0, 0.5, 0.0, 0.0, 0.0, -0.5, 0.0], atol=1e-6)
  out, _ = _rows("q:yes,yes", gate_weights=(("evidence", 0.0),), advantage_mode="turn_mix", turn_advantage_weight=1.0,
                 **sampling)
  assert out.rows is None and out.metrics.gate_signal_groups is None  # a weight of 0 is no term


def test_collector_defaults_are_the_final_reward_broadcast():
  out, rows = _rows()
  # rewards 1 and 0, mean-centred: +-0.5 on every turn; no gate term
  assert out.metrics.reward_mean == 0.5
  np.testing.assert_allclose(rows.advantages, [0.5] * 4 + [-0.5] * 3)


def test_spec_checks_names_and_weight():
  with pytest.raises(KeyError, match="gate term"):
    rollout.RolloutSpec(group_size=2, questions_per_step=1, rollout_batch=2, gate_weights=(("speed", 1.0),))
  with pytest.raises(KeyError, match="advantage mode"):
    rollout.RolloutSpec(group_size=2, questions_per_step=1, rollout_batch=2, advantage_mode="turn")
  with pytest.raises(ValueError, match="turn_advantage_weight"):
    rollout.RolloutSpec(group_size=2, questions_per_step=1, rollout_batch=2, turn_advantage_weight=1.5)


class StubReader:
  """Every document: 3 chunks read, 10 tokens decoded, 0.5 s; gated: gates keep, keep, stop."""

  def __init__(self, gated: bool):
    self.gated = gated

  def answer_batch(self, questions, documents, **kw):
    return [types.SimpleNamespace(prediction="tiger", answer="\\boxed{ tiger }", boxed=" tiger ", num_chunks=3,
                                  document_tokens=64, memories=["m"] * 3, decoded_tokens=10, seconds=0.5,
                                  gates=["keep", "keep", "stop"] if self.gated else None) for _ in questions]


@pytest.mark.parametrize("gated", [False, True])
def test_evaluation_reports_cost_per_document(gated, tmp_path):
  samples = [{"question": f"q{i}", "context": "doc", "answers": ["tiger"], "index": i} for i in range(4)]
  summary = run_eval(StubReader(gated), toy.TASK, samples, str(tmp_path / "out.jsonl"), batch_size=3,
                     sampling=Sampling(), progress=False)
  assert (summary["decoded_tokens_per_doc"], summary["chunks_per_doc"], summary["seconds_per_doc"]) == (10, 3, 0.5)
  fracs = {k: summary.get(k) for k in ("keep_frac", "stop_frac", "invalid_frac")}
  assert fracs == ({"keep_frac": 2 / 3, "stop_frac": 1 / 3, "invalid_frac": 0.0} if gated else dict.fromkeys(fracs))
