"""Gated memory: the forms' parse (text and token ids), their spellings, the recurrence's keep / stop
(tiny models whose every reply is one chosen token), the toy teacher's keep form, the toy vocabulary."""

import json
import os
import random

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import memagent_jax as mj
from memagent_jax.agent import gates
from memagent_jax.data import toy
from memagent_jax.data import toy_tokenizer
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.policy.policy import Policy
from memagent_jax.rl import gate_signals
from memagent_jax.rl.toy_teacher import TEACHERS
from memagent_jax.text import templates
from memagent_jax.text.tokenizer import Tokenizer

TOY = dict(chunk_tokens=toy.CHUNK_TOKENS, memory_tokens=toy.MEMORY_TOKENS, answer_tokens=toy.ANSWER_TOKENS,
           question_tokens=16, block_chunks=2)
GATED = dict(TOY, memory="gated", gate_forms="keep_stop")  # one gate spec for the compiled tests: one compilation
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_parse_is_strict():
  forms = (gates.KEEP_FORM, gates.STOP_FORM)
  assert gates.parse_reply("<keep>", forms) == "keep"
  assert gates.parse_reply("  \n<keep> \n", forms) == "keep"
  assert gates.parse_reply("<stop>", forms) == "stop"
  assert gates.parse_reply("<stop>", (gates.KEEP_FORM,)) == "memory"  # no stop form: plain text
  assert gates.parse_reply("<keep> and more", forms) == "invalid"
  assert gates.parse_reply("facts <stop>", forms) == "invalid"
  assert gates.parse_reply("<keep><keep>", forms) == "invalid"
  assert gates.parse_reply("the code of oslo is tiger .", forms) == "memory"
  assert gates.parse_reply("keep", forms) == "memory"


def test_templates_overwrite_released_gated_adds_sentences():
  assert templates.memory_template("overwrite") is templates.MEMORY_TEMPLATE
  keep, both = templates.memory_template("gated", "keep"), templates.memory_template("gated", "keep_stop")
  assert keep == templates.MEMORY_TEMPLATE.replace(
      "useful information.", "useful information." + templates.KEEP_SENTENCE)
  assert both == keep.replace(templates.KEEP_SENTENCE, templates.KEEP_SENTENCE + templates.STOP_SENTENCE)
  assert "<keep>" in keep and "<stop>" not in keep and "<stop>" in both
  with pytest.raises(ValueError, match="gate_forms"):
    templates.memory_template("gated", "stop")


def _saved_vocab() -> dict[str, int]:
  """The word -> id table of the committed toy base checkpoint's tokenizer."""
  with open(os.path.join(REPO, "experiments/data/toy_base_lookup/tokenizer.json")) as f:
    return json.load(f)["model"]["vocab"]


def test_toy_vocabulary_appends_gate_words_inside_the_padded_rows():
  """The words before the gated ones are the vocabulary of the committed toy checkpoints, id for id."""
  words = toy_tokenizer.vocabulary()
  saved = _saved_vocab()
  assert [w for w, _ in sorted(saved.items(), key=lambda kv: kv[1])] == words[:len(saved)] == \
      toy_tokenizer.base_vocabulary()
  assert {"<keep>", "<stop>"} <= set(words[len(saved):])
  assert len(words) <= mj.get_preset("toy-1m-shift2").vocab_size


def test_toy_spellings():
  tok = toy_tokenizer.toy_tokenizer()
  keep_id, stop_id = tok.encode("<keep>"), tok.encode("<stop>")
  assert len(keep_id) == len(stop_id) == 1
  assert gates.form_spellings(tok, "<keep>") == (tuple(keep_id),)
  assert gates.blank_token_ids(tok) == ()  # the word tokenizer drops whitespace
  spec = gates.GateSpec.build(tok, forms="keep_stop", invalid_gate="as_memory", eos=tuple(tok.stop_token_ids))
  assert spec.end_tokens == tuple(sorted(keep_id + stop_id))


def test_smollm_spellings(smollm):
  """SmolLM2 has no single token for "<keep>": its spellings are its own encodings without blank tokens,
  and the device parse agrees with the text parse on replies around them."""
  tok = smollm.tokenizer
  blank = set(gates.blank_token_ids(tok))
  assert tok.encode(" ")[0] in blank and tok.encode("\n")[0] in blank
  spellings = gates.form_spellings(tok, "<keep>")
  assert spellings and all(tok.decode(list(s)).strip() == "<keep>" for s in spellings)
  assert all(not blank & set(s) for s in spellings)
  spec = gates.GateSpec.build(tok, forms="keep_stop", invalid_gate="as_memory", eos=tuple(tok.stop_token_ids))
  eos = tok.stop_token_ids[0]
  replies = ["<keep>", " <keep>", "\n<keep>\n", "<stop>", "<keep> and more", "The memory <stop>", "plain memory",
             "keep", "<kee"]
  ids = [tok.encode(r) + [eos] for r in replies]
  width = max(map(len, ids))
  tokens = np.asarray([i + [0] * (width - len(i)) for i in ids], np.int32)
  codes = gates.gate_codes(jnp.asarray(tokens), jnp.asarray([len(i) for i in ids], jnp.int32), spec)
  want = [gates.parse_reply(r, spec.forms) for r in replies]
  assert [gates.GATE_NAMES[int(c)] for c in codes] == want
  assert want == ["keep", "keep", "keep", "stop", "invalid", "invalid", "memory", "memory", "memory"]


def test_gate_codes_by_hand():
  """Ids: 5 keep, 6 stop, 9 a blank, 2 EOS; 7 and 8 other words; [7, 8] also spells stop."""
  spec = gates.GateSpec(keep=((5,),), stop=((6,), (7, 8)), blank=(9,), eos=(2,), invalid_keeps=False)
  rows = [([5, 2], "keep"), ([9, 5, 9, 2], "keep"), ([6], "stop"), ([7, 8, 2], "stop"), ([7, 2], "memory"),
          ([5, 7, 2], "invalid"), ([3, 7, 8], "invalid"), ([9, 9], "memory"), ([2], "memory"), ([5, 5], "invalid")]
  tokens = np.zeros((len(rows), 4), np.int32)
  for i, (ids, _) in enumerate(rows):
    tokens[i, :len(ids)] = ids
  codes = gates.gate_codes(jnp.asarray(tokens), jnp.asarray([len(r) for r, _ in rows], jnp.int32), spec)
  assert [gates.GATE_NAMES[int(c)] for c in codes] == [name for _, name in rows]
  # a stop token ends the reply: what follows its length is not read
  assert int(gates.gate_codes(jnp.asarray([[5, 2, 7, 7]]), jnp.asarray([2]), spec)[0]) == gates.KEEP


def forced_policy(token: int) -> Policy:
  """toy-tiny whose every next token is `token`: blocks add nothing (zero output projections) and every
  embedding row is a positive multiple of one vector, largest for `token`, so the tied head ranks it first."""
  base = mj.load_policy("random:toy-tiny", seed=0)
  model = nnx.merge(base.graphdef, base.state)
  v = np.random.default_rng(0).standard_normal(model.embed.value.shape[1])
  scale = np.full(model.embed.value.shape[0], 0.5)
  scale[token] = 1.0
  model.embed.value = jnp.asarray(4.0 * scale[:, None] * v[None, :], model.embed.value.dtype)
  for layer in model.layers:
    layer.attn.o.value = jnp.zeros_like(layer.attn.o.value)
    layer.mlp.down.value = jnp.zeros_like(layer.mlp.down.value)
  return Policy(model, base.tokenizer, name=f"forced:{token}")


@pytest.fixture(scope="module")
def docs():
  return toy.generate(3, 4 * toy.CHUNK_TOKENS, seed=3)  # 4 chunks each


def _read(agent, docs, **kw):
  return agent.answer_batch([s["question"] for s in docs], [s["context"] for s in docs], **kw)


def test_keep_leaves_the_memory_and_ends_the_decode(docs):
  tok = toy_tokenizer.toy_tokenizer()
  keep = tok.encode("<keep>")[0]
  policy = forced_policy(keep)
  gated = _read(mj.MemAgent(policy, **GATED), docs)
  plain = _read(mj.MemAgent(policy, **TOY), docs)
  for g, p in zip(gated, plain):
    assert g.gates == ["keep"] * 4 and g.num_chunks == 4
    assert g.memories == [templates.NO_MEMORY] * 4  # the memory stays
    assert [len(c.response_ids) for c in g.conversations[:-1]] == [1] * 4  # the form ends the turn
    # the final prompt holds the initial memory
    assert f"<memory> {templates.NO_MEMORY} </memory>" in tok.decode(g.conversations[-1].prompt_ids,
                                                                      skip_special_tokens=False)
    assert g.decoded_tokens == 4 + toy.ANSWER_TOKENS
    assert p.gates is None and p.memories[0] == " ".join(["<keep>"] * toy.MEMORY_TOKENS)  # overwrite: just text
    assert p.decoded_tokens == 4 * toy.MEMORY_TOKENS + toy.ANSWER_TOKENS


def test_stop_halts_the_row(docs):
  tok = toy_tokenizer.toy_tokenizer()
  stop = tok.encode("<stop>")[0]
  agent = mj.MemAgent(forced_policy(stop), **GATED)
  results = _read(agent, docs)
  for r in results:
    assert r.gates == ["stop"] and r.num_chunks == 1 and len(r.conversations) == 2
    assert r.memories == [templates.NO_MEMORY]
  slots = agent.rollout_slots([s["question"] for s in docs], [s["context"] for s in docs],
                              decode=DecodeSpec(temperature=1.0), seed=0,
                              prompt_width=400, response_width=16)
  # turns after the stop are inactive (no loss rows), the answer stays; 4 chunks in each document
  np.testing.assert_array_equal(slots.active, np.asarray([[True, False, False, False, True]] * 3))
  np.testing.assert_array_equal(slots.gate[:, 0], gates.STOP)
  np.testing.assert_array_equal(slots.num_chunks, 1)
  np.testing.assert_array_equal(slots.doc_chunks, 4)


def test_invalid_reply_as_memory_or_kept(docs):
  """A random model's replies: the device gates agree with the text parse; invalid replies become the
  memory or are dropped as the agent says."""
  policy = mj.load_policy("random:toy-tiny", seed=2)
  samples = toy.generate(8, 4 * toy.CHUNK_TOKENS, seed=5)
  seen = set()
  for invalid in ("as_memory", "keep"):
    agent = mj.MemAgent(policy, **GATED, invalid_gate=invalid)
    for r in _read(agent, samples, temperature=1.0, seed=1):
      before = templates.NO_MEMORY
      for gate, conv, memory in zip(r.gates, r.conversations, r.memories):
        text = agent.tokenizer.decode_response(conv.response_ids)
        assert gates.parse_reply(text, agent.gate.forms) == gate
        seen.add(gate)
        kept = gate in ("keep", "stop") or (gate == "invalid" and invalid == "keep")
        assert memory == (before if kept else text)
        before = memory
  assert "invalid" in seen and "memory" in seen


def test_teacher_keeps_only_when_gated():
  policy = mj.load_policy("random:toy-tiny", seed=0)
  plain, gated = mj.MemAgent(policy, **TOY), mj.MemAgent(policy, **TOY, memory="gated")
  tok = plain.tokenizer
  teacher = TEACHERS.get("toy_memory")
  kept = 0
  for s in toy.generate(20, 4 * toy.CHUNK_TOKENS, seed=1):
    a = teacher(plain, s["question"], s["context"], rng=random.Random(0), overwrite_prob=0.3)
    b = teacher(gated, s["question"], s["context"], rng=random.Random(0), overwrite_prob=0.3)
    assert a.gates is None and a.memories == b.memories and a.answer == b.answer  # same decisions
    before = templates.NO_MEMORY
    for gate, ca, cb, memory in zip(b.gates, a.conversations, b.conversations, b.memories):
      if gate == "keep":
        kept += 1
        assert memory == before and cb.response_ids.tolist() == tok.encode("<keep>")  # the form ends the turn
      else:
        np.testing.assert_array_equal(ca.response_ids, cb.response_ids)
      before = memory
  assert kept > 10


def test_unknown_form_token_is_refused():
  """A toy tokenizer saved before the gated words joined the vocabulary spells <keep> as <unk>: refused."""
  old = toy_tokenizer.build_hf_tokenizer(toy_tokenizer.vocabulary()[:len(_saved_vocab())])
  with pytest.raises(ValueError, match="unknown token"):
    gates.GateSpec.build(Tokenizer(old), forms="keep", invalid_gate="as_memory", eos=(3,))


def test_gated_config_reads_a_committed_toy_checkpoint_with_the_gated_words():
  """A gated reader of the committed base (saved before the gated words existed) reads with the current
  toy tokenizer, whose first ids are the saved ones; an overwrite reader keeps the checkpoint's tokenizer."""
  from configs import toy_memagent
  from memagent_jax.experiment.assembly import load_policy_of
  base = os.path.join(REPO, "experiments", "data", "toy_base_lookup")
  cfg = toy_memagent.get_config("warm_start,demo,lookup")
  plain = load_policy_of(cfg, base)
  assert plain.tokenizer.hf.get_vocab() == _saved_vocab()  # unchanged: overwrite decodes as before
  cfg.agent.update(memory="gated", gate_forms="keep")
  gated = load_policy_of(cfg, base)
  assert gated.tokenizer is toy_tokenizer.toy_tokenizer()
  assert all(gated.tokenizer.hf.get_vocab()[w] == i for w, i in _saved_vocab().items())
  spec = gates.GateSpec.build(gated.tokenizer, forms="keep", invalid_gate="as_memory", eos=(3,))
  assert spec.keep == ((gated.tokenizer.hf.get_vocab()["<keep>"],),)
  other = Tokenizer(toy_tokenizer.build_hf_tokenizer(["<pad>", "<unk>", "a"]))
  assert toy_tokenizer.with_gated_words(other) is other and toy_tokenizer.with_gated_words(None) is None


def test_chunk_texts_are_the_chunks_the_reader_reads(docs):
  """The evidence gate term's view of a document: its chunks of chunk_tokens toy words in order, centre-truncated
  as training truncates; the answer (the asked key's last value) stands in exactly one of them."""
  policy = mj.load_policy("random:toy-tiny", seed=0)
  contexts = [d["context"] for d in docs]
  texts = mj.MemAgent(policy, **TOY).chunk_texts(contexts)
  step = toy.CHUNK_TOKENS
  for context, chunks in zip(contexts, texts):
    words = context.split()
    assert [c.split() for c in chunks] == [words[i:i + step] for i in range(0, len(words), step)]
  evidence = gate_signals.answer_in_chunks(texts, [d["answers"] for d in docs], turns=5)
  assert (evidence.sum(1) == 1).all() and not evidence[:, 4].any()  # 4 chunks each; the answer turn: none
  short = mj.MemAgent(policy, **TOY, max_chunks=2).chunk_texts(contexts)
  words, half = contexts[0].split(), toy.CHUNK_TOKENS  # max_chunks=2: the first and the last 64 words
  assert " ".join(short[0]).split() == words[:half] + words[-half:] and [len(c) for c in short] == [2] * len(docs)
