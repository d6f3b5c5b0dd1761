"""The toy memory world: its word-level tokenizer, its task generator and the agent on both."""

import hashlib
import json

import numpy as np
import pytest

import memagent_jax as mj
from memagent_jax.agent import ConversationBatch, chunking
from memagent_jax.text.templates import (DIRECT_TEMPLATE, FINAL_TEMPLATES, MEMORY_TEMPLATE,
                                          NO_MEMORY, TemplateSegments)
from memagent_jax.data import tasks, toy
from memagent_jax.models.config import PRESETS, TOY_VOCAB_SIZE
from memagent_jax.policy.loading import TOY_TOKENIZER, load_tokenizer
from memagent_jax.rl import rewards
from memagent_jax.text.tokenizer import Tokenizer
from memagent_jax.data.toy_tokenizer import IM_END, UnknownWordError, base_vocabulary, toy_tokenizer, vocabulary


FIELDS = dict(prompt="what is the latest code of oslo ?", memory=NO_MEMORY,
              chunk="the code of oslo is tiger .", context="rain .")


@pytest.fixture(scope="module")
def tok():
  return toy_tokenizer()


# ----- tokenizer ---------------------------------------------------------------------------------
def test_vocabulary_is_small_sorted_and_matches_the_presets(tok):
  words, base = vocabulary(), base_vocabulary()
  assert words[:5] == ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
  # sorted, then the gated memory's words sorted after them (so that no earlier id moves)
  assert words[:len(base)] == base and base[5:] == sorted(base[5:]) and len(set(words)) == len(words)
  gated = words[len(base):]
  assert gated == sorted(gated) and {"<keep>", "<stop>"} <= set(gated)
  assert tok.vocab_size == len(words) < 400
  assert TOY_VOCAB_SIZE == -(-len(words) // 64) * 64
  for name in ("toy-1m", "toy-tiny"):
    assert PRESETS[name].vocab_size == TOY_VOCAB_SIZE
  assert 0.8e6 <= PRESETS["toy-1m"].num_params <= 1.2e6
  print(f"vocab {len(words)} (model rows {TOY_VOCAB_SIZE}); toy-1m {PRESETS['toy-1m'].num_params} params")


def test_round_trip_of_generated_texts(tok):
  for s in toy.generate(4, 300, seed=3, makeup=toy.Makeup(override_prob=0.7)):
    for text in (s["context"], s["question"]):
      ids = tok.encode(text)
      assert tok.unk_token_id not in ids
      assert tok.decode(ids) == text
    assert len(tok.encode(s["context"])) == 300


def test_unknown_word_is_an_error_naming_it(tok):
  with pytest.raises(ValueError, match="xylophone"):
    tok.encode("the code of xylophone is tiger .")
  with pytest.raises(UnknownWordError, match="Zebra"):  # case-sensitive: no silent lowercasing
    tok.encode("the code of oslo is Zebra .")
  assert tok.hf.encode("xylophone", add_special_tokens=False) == [tok.unk_token_id]  # the raw one


def test_templates_encode_without_unknown_tokens(tok):
  for t in (MEMORY_TEMPLATE, DIRECT_TEMPLATE, *FINAL_TEMPLATES.values(), NO_MEMORY):
    ids = tok.apply_chat_template(t.format(**FIELDS))
    assert tok.unk_token_id not in ids and len(ids) > 2
  assert tok.decode(tok.encode("\\boxed{ tiger }")) == "\\boxed{ tiger }"
  assert rewards.extract_boxed(tok.decode(tok.encode("so \\boxed{tiger}"))).strip() == "tiger"


def test_chat_template_and_stop_token(tok):
  text = tok.chat_text("what is the latest code of oslo ?")
  assert text == "<|im_start|>user\nwhat is the latest code of oslo ?<|im_end|>\n<|im_start|>assistant\n"
  ids = tok.apply_chat_template("what is the latest code of oslo ?")
  im_end = tok.hf.convert_tokens_to_ids(IM_END)
  assert tok.eos_token_id == im_end and im_end in tok.stop_token_ids
  assert ids.count(im_end) == 1  # newlines are dropped: no token for them
  assert tok.decode_response([tok.encode("tiger")[0], im_end]) == "tiger"
  assert tok.pad_token_id == 0


def test_save_pretrained_reloads_identically(tok, tmp_path):
  from transformers import AutoTokenizer
  tok.save_pretrained(str(tmp_path))
  assert (tmp_path / "tokenizer.json").is_file()
  hf2 = AutoTokenizer.from_pretrained(str(tmp_path))
  s = toy.generate(1, 200, seed=5)[0]
  for text in (s["context"], tok.chat_text(MEMORY_TEMPLATE.format(**FIELDS))):
    assert hf2.encode(text, add_special_tokens=False) == tok.encode(text)
  assert hf2.get_vocab() == tok.hf.get_vocab()
  reloaded = Tokenizer(hf2)
  assert reloaded.stop_token_ids == tok.stop_token_ids
  assert reloaded.chat_text("hi") == tok.chat_text("hi")


def test_template_segments_and_loading(tok):
  seg = TemplateSegments.build(tok, MEMORY_TEMPLATE)
  assert seg.fields == ("prompt", "memory", "chunk")
  print(f"memory template: {seg.fixed_tokens} fixed tokens")
  assert 50 <= seg.fixed_tokens <= 120
  assert load_tokenizer(TOY_TOKENIZER) is tok


def test_streaming_chunks_of_a_long_document_equal_whole_encoding(tok):
  """Documents over chunking.PIECE_CHARS are cut mid-text; cut checks see word fragments."""
  doc = toy.generate(1, 20000, seed=0)[0]["context"]
  assert len(doc) > chunking.PIECE_CHARS
  chunks = list(chunking.document_chunks(tok, doc, chunk_tokens=64))
  assert np.concatenate(chunks).tolist() == tok.encode(doc)
  assert len(chunks) == -(-20000 // 64)


def test_memagent_runs_end_to_end_on_the_toy_world():
  policy = mj.load_policy("random:toy-tiny")
  assert policy.tokenizer is toy_tokenizer()
  agent = mj.MemAgent(policy, chunk_tokens=64, memory_tokens=16, answer_tokens=8)
  samples = toy.generate(2, 150, seed=0)
  results = agent.answer_batch([s["question"] for s in samples], [s["context"] for s in samples],
                               temperature=1.0, top_p=1.0, seed=0)
  assert isinstance(ConversationBatch.from_results(results, agent.pad_id), ConversationBatch)
  for r in results:
    assert r.num_chunks == 3 and len(r.conversations) == 4 and r.document_tokens == 150
    assert all(len(c.response_ids) <= 16 for c in r.conversations[:-1])
    assert isinstance(r.answer, str)


# ----- generator ---------------------------------------------------------------------------------
def test_deterministic_and_independent_of_n():
  a = toy.generate(5, 256, seed=7)
  assert a == toy.generate(5, 256, seed=7)
  assert toy.generate(40, 256, seed=7)[:5] == a
  assert a != toy.generate(5, 256, seed=8)
  assert len({s["context"] for s in a}) == 5
  assert [s["index"] for s in a] == list(range(5))


@pytest.mark.parametrize("num_tokens", [70, 71, 72, 100, 257, 1000, 4096])
def test_document_length_is_exact(num_tokens):
  for s in toy.generate(3, num_tokens, seed=1, makeup=toy.Makeup(num_distractors=3, max_overrides=2)):
    assert len(s["context"].split(" ")) == num_tokens == s["num_tokens"]


def test_too_short_a_document_is_an_error():
  with pytest.raises(ValueError, match="too short"):
    toy.generate(1, 20, seed=0, makeup=toy.Makeup(num_distractors=3))


def test_answer_is_the_last_fact_about_the_key():
  for s in toy.generate(30, 400, seed=2, makeup=toy.Makeup(override_prob=0.5)):
    about_key = [v for k, v in s["facts"] if k == s["key"]]
    assert s["answers"] == [about_key[-1]]
    assert len(about_key) == 1 + s["num_overrides"]
    assert s["question"] == f"what is the latest code of {s['key']} ?"
    doc = s["context"]
    for k, v in s["facts"]:
      assert toy.fact(k, v) in doc
    # The answer value appears once: in the last fact about the key, after every other one.
    answer = s["answers"][0]
    assert doc.count(f" {answer} ") == 1
    assert doc.index(toy.fact(s["key"], answer)) == max(doc.index(toy.fact(s["key"], v))
                                                         for v in about_key)


def test_override_probability():
  always = toy.generate(20, 300, seed=0, makeup=toy.Makeup(override_prob=1.0, max_overrides=2))
  assert all(s["num_overrides"] == 2 for s in always)
  never = toy.generate(20, 300, seed=0, makeup=toy.Makeup(override_prob=0.0))
  assert all(s["num_overrides"] == 0 for s in never)
  assert all(sum(k == s["key"] for k, _ in s["facts"]) == 1 for s in never)


def test_number_of_distractors():
  for d in (0, 3, 10):
    for s in toy.generate(5, 400, seed=4, makeup=toy.Makeup(num_distractors=d, override_prob=0.0)):
      assert len(s["facts"]) == 1 + d and s["num_distractors"] == d
      assert sum(k != s["key"] for k, _ in s["facts"]) == d
  s = toy.generate(1, 4000, seed=0, makeup=toy.Makeup(distractor_density=5.0))[0]
  assert s["num_distractors"] == 20
  with pytest.raises(ValueError):
    toy.generate(1, 400, makeup=toy.Makeup(num_distractors=2, distractor_density=1.0))


def test_values_are_unambiguous_under_substring_matching():
  words = [w.lower() for w in vocabulary()]
  for v in toy.VALUES:
    assert v.isalpha() and v.islower()
    assert not [w for w in words if w != v and v in w], v
    inside = [w for w in words if w != v and w in v and any(c.isalnum() for c in w)]
    assert set(inside) <= {"a", "an", "the"}, (v, inside)  # articles: dropped by normalisation
  assert not set(toy.KEYS) & set(toy.VALUES)
  assert not set(toy.FILLER_WORDS) & (set(toy.KEYS) | set(toy.VALUES) | set(toy.FACT_WORDS))


def test_registered_in_evaluation(tok):
  assert toy.TASK in tasks.task_names()
  samples = tasks.make_samples(toy.TASK, 128, 2, 0, tok, chunk_tokens=toy.CHUNK_TOKENS)
  assert samples == toy.generate(2, 128, 0)


def test_data_options_reach_the_toy_generator_and_other_tasks_refuse_them(tok):
  """data.options (a config's toy document makeup) changes the documents as that toy.Makeup field
  would; an option a task does not take is an error naming it, never silently ignored."""
  dense = tasks.make_samples(toy.TASK, 128, 3, 0, tok, chunk_tokens=64, options={"distractor_density": 32.0})
  assert dense == toy.generate(3, 128, 0, makeup=toy.Makeup(distractor_density=32.0))
  assert {s["num_distractors"] for s in dense} == {4}  # round(32 * 128 / 1000); the default world: 1
  assert {s["num_distractors"] for s in tasks.make_samples(toy.TASK, 128, 3, 0, tok, chunk_tokens=64)} == {1}
  never = tasks.make_samples(toy.ONE_KEY_TASK, 128, 8, 0, tok, chunk_tokens=64, options={"override_prob": 0.0})
  assert {s["num_overrides"] for s in never} == {0} and {s["key"] for s in never} == {"oslo"}
  with pytest.raises(ValueError, match="takes no data option 'density'.*distractor_density"):
    tasks.make_samples(toy.TASK, 128, 1, 0, tok, chunk_tokens=64, options={"density": 1.0})
  with pytest.raises(ValueError, match="'niah_single_1' takes no data option 'distractor_density'.*none"):
    tasks.make_samples("niah_single_1", 128, 1, 0, tok, chunk_tokens=64, options={"distractor_density": 1.0})


def test_askable_distractors_defeat_the_latest_askable_fact_shortcut():
  """distractor_keys="askable": every distractor names another askable key, so "answer the latest
  askable key's fact" (what a base pretrained on the default rows learnt) is mostly wrong."""
  samples = toy.generate(400, 72, 0, makeup=toy.Makeup(num_distractors=3, distractor_keys="askable"))
  for s in samples:
    others = [k for k, _ in s["facts"] if k != s["key"]]
    assert len(others) == 3 and set(others) <= set(toy.ASKED_KEYS) - {s["key"]}
  shortcut = sum([v for k, v in s["facts"] if k in toy.ASKED_KEYS][-1] == s["answers"][0] for s in samples)
  assert shortcut / len(samples) < 0.5
  default = toy.generate(400, 72, 0, makeup=toy.Makeup(num_distractors=3))
  assert sum(k not in toy.ASKED_KEYS for s in default for k, _ in s["facts"]) > 500  # mostly unaskable keys
  with pytest.raises(ValueError, match="distractor_keys='some'"):
    toy.generate(1, 72, 0, makeup=toy.Makeup(distractor_keys="some"))
  with pytest.raises(ValueError, match="no askable key other than 'oslo'"):
    toy.generate(1, 72, 0, makeup=toy.Makeup(asked_keys=toy.ONE_KEY, distractor_keys="askable"))


def test_mixed_distractors_name_both_kinds_of_key():
  """distractor_keys="mixed": each distractor names another askable key or an unaskable one with
  even odds, so RL documents offer both overwrites the evaluation's documents offer."""
  samples = toy.generate(400, 72, 0, makeup=toy.Makeup(num_distractors=3, distractor_keys="mixed"))
  others = [k for s in samples for k, _ in s["facts"] if k != s["key"]]  # [1200] distractor keys
  assert len(others) == 1200
  askable = sum(k in toy.ASKED_KEYS for k in others)
  assert 0.45 < askable / len(others) < 0.55  # 1200 fair coins: sd 0.014
  unaskable = {k for k in others if k not in toy.ASKED_KEYS}
  assert unaskable == set(toy.KEYS) - set(toy.ASKED_KEYS)  # all 16 unaskable keys drawn
  with pytest.raises(ValueError, match="'mixed' but no askable key other than 'oslo'"):
    toy.generate(1, 72, 0, makeup=toy.Makeup(asked_keys=toy.ONE_KEY, distractor_keys="mixed"))
  with pytest.raises(ValueError, match="'mixed' but every key is askable"):
    toy.generate(1, 72, 0, makeup=toy.Makeup(asked_keys=None, distractor_keys="mixed"))


def test_mixed_distractors_follow_askable_share():
  """askable_share weights "mixed" towards one kind of key; 0.5 is the default's draw, and the share
  is refused without "mixed" or outside [0, 1]."""
  def share_of_askable(**kw):
    samples = toy.generate(400, 72, 0, makeup=toy.Makeup(num_distractors=3, distractor_keys="mixed", **kw))
    others = [k for s in samples for k, _ in s["facts"] if k != s["key"]]  # [1200]
    return sum(k in toy.ASKED_KEYS for k in others) / len(others)
  assert 0.70 < share_of_askable(askable_share=0.75) < 0.80  # sd 0.0125
  assert share_of_askable(askable_share=1.0) == 1.0 and share_of_askable(askable_share=0.0) == 0.0
  even = toy.Makeup(num_distractors=3, distractor_keys="mixed", askable_share=0.5)
  assert toy.generate(20, 72, 0, makeup=even) == \
      toy.generate(20, 72, 0, makeup=toy.Makeup(num_distractors=3, distractor_keys="mixed"))
  with pytest.raises(ValueError, match="askable_share=0.75 needs distractor_keys='mixed'"):
    toy.generate(1, 72, 0, makeup=toy.Makeup(distractor_keys="askable", askable_share=0.75))
  with pytest.raises(ValueError, match=r"askable_share=1.5 .* in \[0, 1\]"):
    toy.generate(1, 72, 0, makeup=toy.Makeup(distractor_keys="mixed", askable_share=1.5))


def test_late_fact_share_puts_facts_at_chunk_ends():
  """late_fact_share moves facts into the last two fact lengths of their chunk (where the residual
  overwrites sit), no fact crossing a boundary; 0 keeps the uniform placement."""
  def late_frac(**kw):
    makeup = toy.Makeup(num_distractors=3, chunk_tokens=64, distractor_keys="askable", **kw)
    docs = toy.generate(300, 128, 0, makeup=makeup)
    starts = [s for d in docs for s in d["fact_starts"]]
    assert all(s // 64 == (s + toy.FACT_TOKENS - 1) // 64 for s in starts)
    return sum(s % 64 >= 64 - 2 * toy.FACT_TOKENS for s in starts) / len(starts)
  assert late_frac() < 0.25 and late_frac(late_fact_share=1.0) > 0.45  # at most 2 such places per chunk
  with pytest.raises(ValueError, match="late_fact_share=1.5"):
    toy.generate(1, 128, 0, makeup=toy.Makeup(late_fact_share=1.5))
  with pytest.raises(ValueError, match="late_fact_share=0.5 needs chunks"):
    toy.generate(1, 128, 0, makeup=toy.Makeup(chunk_tokens=None, late_fact_share=0.5))


# sha256 of json.dumps(samples, sort_keys=True) for 4 samples of 128 tokens (seed 0) and 2 of 1024
# (seed 3) at chunk 64: the toy reproduction's data. The one-asked-key world of earlier results
# (asked_keys=("oslo",)) keeps its digest from before the chunk size came from the config.
TOY_DIGEST_CHUNK_64 = "e4723fb13dcfbc570f4713954537a0e11b97e55ffa0d5475b6aebcf33d1250ae"
ONE_KEY_DIGEST_CHUNK_64 = "92bf33784916f6f3b7dcd8c803fbcb581d752f2676ee10ae3eb3e382bac55e6f"


def _digest(samples) -> str:
  return hashlib.sha256(json.dumps(samples, sort_keys=True).encode()).hexdigest()


def test_chunk_size_shapes_the_documents_and_64_is_unchanged(tok):
  def digest(chunk_tokens):
    return _digest(tasks.make_samples(toy.TASK, 128, 4, 0, tok, chunk_tokens=chunk_tokens)
                   + tasks.make_samples(toy.TASK, 1024, 2, 3, tok, chunk_tokens=chunk_tokens))
  assert digest(64) == TOY_DIGEST_CHUNK_64
  # toy.ONE_KEY_TASK: the same documents as the first reproduction's; only the task name is its own.
  one_key = (tasks.make_samples(toy.ONE_KEY_TASK, 128, 4, 0, tok, chunk_tokens=64)
             + tasks.make_samples(toy.ONE_KEY_TASK, 1024, 2, 3, tok, chunk_tokens=64))
  assert {s["task"] for s in one_key} == {toy.ONE_KEY_TASK} and {s["key"] for s in one_key} == {"oslo"}
  assert _digest([{**s, "task": toy.TASK} for s in one_key]) == ONE_KEY_DIGEST_CHUNK_64
  for chunk in (16, 32):  # other chunk sizes: other documents, every fact inside one of their chunks
    samples = tasks.make_samples(toy.TASK, 1024, 8, 3, tok, chunk_tokens=chunk)
    assert [s["context"] for s in samples] != [s["context"] for s in toy.generate(8, 1024, 3)]
    assert all(st // chunk == (st + toy.FACT_TOKENS - 1) // chunk for s in samples for st in s["fact_starts"])
  assert digest(32) != TOY_DIGEST_CHUNK_64


def test_questions_ask_about_every_askable_key_and_documents_name_several():
  samples = toy.generate(400, toy.TRAIN_TOKENS * 4, seed=5)
  assert len(toy.ASKED_KEYS) >= 8
  assert {s["key"] for s in samples} == set(toy.ASKED_KEYS)  # a random key per document, all eight drawn
  askable_named = [len({k for k, _ in s["facts"]} & set(toy.ASKED_KEYS)) for s in samples]
  assert sum(n >= 2 for n in askable_named) > len(samples) // 2  # most documents state several askable keys
  # More facts than the memory holds (MEMORY_TOKENS fit two), so what it keeps must follow the question.
  assert min(len(s["facts"]) for s in samples) * toy.FACT_TOKENS > toy.MEMORY_TOKENS


def test_no_fact_crosses_a_chunk_boundary_and_distractors_scale_with_length():
  for length in (toy.TRAIN_TOKENS, 16 * toy.TRAIN_TOKENS):
    for s in toy.generate(20, length, seed=9):
      words = s["context"].split(" ")
      for start, (k, v) in zip(s["fact_starts"], s["facts"]):
        assert words[start:start + toy.FACT_TOKENS] == toy.fact(k, v).split(" ")
        assert start // toy.CHUNK_TOKENS == (start + toy.FACT_TOKENS - 1) // toy.CHUNK_TOKENS
      assert s["num_distractors"] == max(1, round(toy.DISTRACTOR_DENSITY * length / 1000))
  # Without alignment some facts do cross (the option is what prevents it).
  crossing = [st for s in toy.generate(50, 512, seed=9, makeup=toy.Makeup(chunk_tokens=None))
              for st in s["fact_starts"] if st // 64 != (st + toy.FACT_TOKENS - 1) // 64]
  assert crossing
  with pytest.raises(ValueError, match="shorter than one fact"):
    toy.generate(1, 128, seed=0, makeup=toy.Makeup(chunk_tokens=4))
