"""The toy world's teachers and supervised steps through the RL trainer (issue 5's warm start)."""

import random

import numpy as np
import pytest

import memagent_jax as mj
from configs import toy_memagent
from memagent_jax.agent import ConversationBatch
from memagent_jax.data import tasks, toy
from memagent_jax.rl.toy_teacher import TEACHERS, asked_key, facts_in, memory_text
from memagent_jax.rl import rewards
from reference_rows import language_model_rows, rows_from_conversations
from memagent_jax.experiment.assembly import build_trainer


@pytest.fixture(scope="module")
def agent():
  policy = mj.load_policy("random:toy-tiny", seed=0)
  return mj.MemAgent(policy, chunk_tokens=toy.CHUNK_TOKENS, memory_tokens=toy.MEMORY_TOKENS,
                     answer_tokens=toy.ANSWER_TOKENS, question_tokens=16, block_chunks=4)


def _teacher(agent, sample, q, seed=0):
  return TEACHERS.get("toy_memory")(agent, sample["question"], sample["context"], rng=random.Random(seed),
                                    overwrite_prob=q)


def _survives(sample) -> bool:
  """Independent of the teacher: True when no chunk holding only other keys' facts comes after
  the chunk of the last fact about the asked key (what a teacher that always overwrites needs)."""
  c = toy.CHUNK_TOKENS
  chunk_of = [s // c for s in sample["fact_starts"]]
  asked = [ch for ch, (k, _) in zip(chunk_of, sample["facts"]) if k == sample["key"]]
  later = {ch for ch, (k, _) in zip(chunk_of, sample["facts"]) if ch > asked[-1]}
  return not later  # every later fact-bearing chunk holds no asked fact (asked[-1] is the last)


def test_teacher_prompts_are_the_agents_own(agent):
  s = toy.generate(1, 3 * toy.CHUNK_TOKENS, seed=4)[0]
  ran = agent.answer(s["question"], s["context"], temperature=1.0, seed=0)
  taught = _teacher(agent, s, 0.5)
  assert len(taught.conversations) == len(ran.conversations) == 4
  np.testing.assert_array_equal(taught.conversations[0].prompt_ids, ran.conversations[0].prompt_ids)
  # Later prompts differ only in the memory field: same template pieces and chunk around it.
  tok = agent.tokenizer
  for k in (1, 2):
    text = tok.decode(taught.conversations[k].prompt_ids, skip_special_tokens=False)
    assert f"<memory> {taught.memories[k - 1]} </memory>" in text
    assert tok.decode(ran.conversations[k].prompt_ids, skip_special_tokens=False).split("</memory>")[1] == \
        text.split("</memory>")[1]


def test_teacher_without_overwrites_is_always_right(agent):
  for s in toy.generate(40, 4 * toy.TRAIN_TOKENS, seed=1):
    r = _teacher(agent, s, 0.0)
    assert rewards.exact_match(r.prediction, s["answers"]) == 1.0
    assert r.memories[-1] == toy.fact(s["key"], s["answers"][0])
    for conv in r.conversations:
      assert conv.response_ids[-1] == agent.tokenizer.eos_token_id
      assert len(conv.response_ids) <= (toy.ANSWER_TOKENS if conv.is_final else toy.MEMORY_TOKENS)


def test_teacher_that_always_overwrites_fails_exactly_when_a_distractor_chunk_follows(agent):
  samples = toy.generate(60, 4 * toy.TRAIN_TOKENS, seed=2)
  right = [rewards.exact_match(_teacher(agent, s, 1.0).prediction, s["answers"]) == 1.0 for s in samples]
  assert right == [_survives(s) for s in samples]
  assert 0 < sum(right) < len(right)  # both cases occur


def test_teacher_overwrites_at_its_rate(agent):
  samples = toy.generate(300, 2 * toy.TRAIN_TOKENS, seed=3)
  events = kept = 0
  for i, s in enumerate(samples):
    r = _teacher(agent, s, 0.3, seed=i)
    key = s["key"]
    for k in range(1, len(r.memories)):
      chunk = agent.tokenizer.decode(r.conversations[k].prompt_ids).split("<section>")[1]
      found = facts_in(chunk)
      before = r.memories[k - 1]
      if found and not any(kk == key for kk, _ in found) and before != memory_text(found[-2:]):
        events += 1
        kept += r.memories[k] == before
  assert events > 100
  assert abs(1 - kept / events - 0.3) < 0.1, (kept, events)


def test_askable_overwrite_prob_sets_the_rate_on_chunks_naming_other_askable_keys(agent):
  """overwrite_prob 1 with askable_overwrite_prob 0: every chunk of only non-askable keys' facts
  replaces the memory, every chunk with another askable key's fact leaves it (counted from the texts)."""
  samples = toy.generate(200, 4 * toy.TRAIN_TOKENS, seed=7)
  counts = {True: [0, 0], False: [0, 0]}  # has another askable key -> [replaced, chunks]
  for i, s in enumerate(samples):
    r = TEACHERS.get("toy_memory")(agent, s["question"], s["context"], rng=random.Random(i), overwrite_prob=1.0,
                                   askable_overwrite_prob=0.0)
    for k in range(1, len(r.memories)):
      found = facts_in(agent.tokenizer.decode(r.conversations[k].prompt_ids).split("<section>")[1])
      if found and not any(kk == s["key"] for kk, _ in found):
        askable = any(kk in toy.ASKED_KEYS for kk, _ in found)
        counts[askable][1] += 1
        counts[askable][0] += r.memories[k] == memory_text(found[-2:]) != r.memories[k - 1]
  assert counts[True][1] > 50 and counts[False][1] > 50, counts
  assert counts[True][0] == 0 and counts[False][0] == counts[False][1], counts
  with pytest.raises(ValueError, match="askable_overwrite_prob=1.5 must lie in"):
    TEACHERS.get("toy_memory")(agent, samples[0]["question"], samples[0]["context"], rng=random.Random(0),
                               overwrite_prob=0.5, askable_overwrite_prob=1.5)


def test_direct_teacher_answers_from_the_whole_document():
  policy = mj.load_policy("random:toy-tiny", seed=0)
  reader = mj.DirectReader(policy, answer_tokens=8, question_tokens=16, context_tokens=600)
  s = toy.generate(1, toy.TRAIN_TOKENS, seed=5)[0]
  r = TEACHERS.get("toy_direct")(reader, s["question"], s["context"], rng=random.Random(0))
  assert r.prediction == s["answers"][0] and asked_key(s["question"]) == s["key"]
  np.testing.assert_array_equal(r.conversations[0].prompt_ids, reader.prompt_ids(s["question"], s["context"])[0])


def test_teacher_rows_carry_unit_advantages_and_the_whole_response(agent):
  samples = toy.generate(3, toy.TRAIN_TOKENS, seed=6)
  results = [_teacher(agent, s, 0.5) for s in samples]
  conv = ConversationBatch.from_results(results, agent.pad_id, prompt_width=200, response_width=16)
  rows = rows_from_conversations(conv, row_advantages=np.ones(len(conv.trajectory)),
                                 row_question=conv.trajectory, mask_truncated=False)
  assert rows.loss_mask.sum() == sum(len(c.response_ids) for r in results for c in r.conversations)
  assert np.all(rows.advantages == 1)


def test_recall_teacher_writes_plain_text_rows():
  policy = mj.load_policy("random:toy-tiny", seed=0)
  reader = mj.DirectReader(policy, answer_tokens=8, question_tokens=16, context_tokens=600)
  s = toy.generate(1, 48, seed=8)[0]
  r = TEACHERS.get("toy_recall")(reader, s["question"], s["context"], rng=random.Random(0))
  tok = reader.tokenizer
  assert tok.decode(r.conversations[0].prompt_ids) == f"{s['context']} {s['question']}"  # no template
  assert tok.decode_response(r.conversations[0].response_ids) == f"\\boxed{{ {s['answers'][0]} }}"


def test_prompt_loss_makes_every_real_token_a_target(agent):
  results = [_teacher(agent, s, 0.5) for s in toy.generate(2, toy.TRAIN_TOKENS, seed=6)]
  conv = ConversationBatch.from_results(results, agent.pad_id, prompt_width=200, response_width=16)
  rows = language_model_rows(rows_from_conversations(conv, row_advantages=np.ones(len(conv.trajectory)),
                                                     row_question=conv.trajectory, mask_truncated=False))
  assert rows.prompt_width == 1 and rows.loss_mask.shape == (len(conv.trajectory), 215)
  real = conv.prompt_lengths + conv.response_mask.sum(1)
  np.testing.assert_array_equal(rows.loss_mask.sum(1), real - 1)  # all but the first real token


def _sft_config(stage, tmp_path, steps):
  c = toy_memagent.get_config(f"{stage},demo")
  c.model.source = "random:toy-tiny"
  c.data.update(train_size=64)
  c.rl.update(questions_per_step=8, ppo_mini_batch=8, rollout_batch=8)
  c.optim.update(lr=1e-2, warmup_steps=1)
  c.train.update(steps=steps, workdir=str(tmp_path / stage), progress=False, save_every=steps)
  return c


@pytest.mark.parametrize("stage", ["pretrain", "warm_start", "full_attention"])
def test_supervised_steps_run_through_the_trainer_and_lower_the_loss(tmp_path, stage):
  out = build_trainer(_sft_config(stage, tmp_path, 8)).train()
  losses = [h.update.loss for h in out.history]
  assert out.step == 8 and np.isfinite(losses).all()
  assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:2]), losses
  assert out.history[0].rollout.teacher_accuracy > 0.5


def test_bad_stage_combinations_fail_up_front(tmp_path):
  c = _sft_config("warm_start", tmp_path, 2)
  c.rl.loss = "ppo_clip"
  with pytest.raises(ValueError, match="sft"):
    build_trainer(c)
  c = _sft_config("full_attention", tmp_path, 2)
  c.train.source, c.rl.loss = "rollout", "ppo_clip"
  with pytest.raises(ValueError, match="direct"):
    build_trainer(c)
  c = _sft_config("warm_start", tmp_path, 2)
  c.teacher.name = "oracle"
  with pytest.raises(ValueError, match="teacher.name"):
    build_trainer(c)
  for bad in ("rl,huge", "rl,demo,demo", "rl,lookup,one_key", "sft,lookup"):
    with pytest.raises(ValueError, match="variant"):
      toy_memagent.get_config(bad)


def test_toy_memagent_worlds_pick_task_and_policy():
  one_key, lookup = toy_memagent.get_config("pretrain,demo"), toy_memagent.get_config("pretrain,lookup,demo")
  assert (one_key.data.task, one_key.model.source) == (toy.ONE_KEY_TASK, "random:toy-1m")
  assert (lookup.data.task, lookup.model.source) == (toy.TASK, "random:toy-1m-shift2")
  assert toy_memagent.get_config("rl,lookup").data.task == toy.TASK  # every stage of the world
  assert toy_memagent.get_config("rl,lookup").to_dict() == toy_memagent.get_config("rl,full,lookup").to_dict()


def test_lookup_world_trains_on_distractor_dense_documents_with_a_flawed_teacher():
  """The lookup world: warm start and RL read documents with LOOKUP_DISTRACTORS distractors,
  and the teacher overwrites on any distractor chunk, askable or not, so RL has a length-compounding
  flaw to remove; full-scale RL's distractors all name other askable keys; the one-key world keeps
  its documents."""
  for stage in ("warm_start", "rl"):
    for scale in ("", ",demo"):
      c = toy_memagent.get_config(f"{stage},lookup{scale}")
      askable = stage == "rl" and not scale  # full-scale RL: every distractor names another askable key
      expected = {"num_distractors": toy_memagent.LOOKUP_DISTRACTORS}
      # full-scale RL also carries the ablation options at their no-op values (toy.Makeup's defaults)
      ablations = {"askable_share": None, "late_fact_share": 0.0}
      assert c.data.options.to_dict() == ({**expected, "distractor_keys": "askable", **ablations} if askable
                                          else expected)
      pool = tasks.make_samples(c.data.task, c.data.length, 16, 0, None, chunk_tokens=c.agent.chunk_tokens,
                                options=c.data.options)
      assert {s["num_distractors"] for s in pool} == {toy_memagent.LOOKUP_DISTRACTORS}
      distractor_keys = {k for s in pool for k, _ in s["facts"] if k != s["key"]}  # [16 x 3] draws
      assert distractor_keys <= set(toy.ASKED_KEYS) if askable else not distractor_keys <= set(toy.ASKED_KEYS)
    assert not toy_memagent.get_config(f"{stage},one_key").data.options
  warm = toy_memagent.get_config("warm_start,lookup").teacher.options.to_dict()
  assert warm == {"overwrite_prob": 0.5}  # askable_overwrite_prob unset: the same 0.5 on askable chunks


def test_prompt_loss_trains_through_the_trainer(tmp_path):
  c = _sft_config("warm_start", tmp_path, 3)
  c.teacher.prompt_loss = True
  trainer = build_trainer(c)
  assert trainer.update_spec.prompt_width == 1
  out = trainer.train()
  assert np.isfinite([h.update.loss for h in out.history]).all()
