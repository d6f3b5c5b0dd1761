"""Template fidelity, batching, scan blocks and row layout of the memory recurrence (its conversations against a
Python loop around transformers' greedy generate: test_parity)."""

import hashlib
import json

import numpy as np
import pytest

import memagent_jax as mj
from memagent_jax.agent import ConversationBatch, DirectReader, MemAgent
from memagent_jax.agent import memagent as memagent_module
from memagent_jax.text import templates
from memagent_jax.agent.recurrence import _strip_stop, pack_left
from memagent_jax.text.templates import FINAL_TEMPLATE_BOXED, FINAL_TEMPLATE_EVAL, MEMORY_TEMPLATE
from memagent_jax.policy.sampling import Generation
from conftest import SQUAD_SAMPLE



def squad_paragraphs(n: int) -> list[str]:
  data = json.load(open(SQUAD_SAMPLE))["data"]
  return [p["context"] for art in data for p in art["paragraphs"]][:n]


def test_templates_are_the_released_text():
  """sha256 of each template with its placeholders, checked byte for byte against
  MEMAGENT_FACTS.md section 1 when written; guards against accidental edits."""
  raw = lambda t: t.format(prompt="{prompt}", memory="{memory}", chunk="{chunk}")
  digest = lambda t: hashlib.sha256(raw(t).encode()).hexdigest()
  assert digest(MEMORY_TEMPLATE) == "49fa58187bb7d23e58b08ed1a15732c71008196a1f633be2b4a3be507ee366b3"
  assert digest(FINAL_TEMPLATE_BOXED) == "64632c4a5ae63b70e018366632a44d6a4ac7cb62cef4f977bf8afa30eb0a6622"
  assert digest(FINAL_TEMPLATE_EVAL) == "76c0395b111bb18000345701c14ceaafc8a9776fb76577676df0c15274d1235e"
  assert "<problem> \n{prompt}\n</problem>" in raw(MEMORY_TEMPLATE)
  assert raw(MEMORY_TEMPLATE).endswith("</section>\n\nUpdated memory:\n")
  assert raw(FINAL_TEMPLATE_BOXED).endswith("</memory>\n\nYour answer:\n")


def test_prediction_follows_the_final_template():
  assert templates.answer_text_to_prediction("so \\boxed{Paris}.", "boxed") == "Paris"
  assert templates.answer_text_to_prediction("It is Paris.", "boxed") is None
  assert templates.answer_text_to_prediction("Therefore, the answer is Paris.", "eval") == "Paris"
  assert templates.answer_text_to_prediction("\\boxed{Paris}", "eval") is None


def test_eval_template_variant(tiny_agent_policy):
  agent = MemAgent(tiny_agent_policy, **TINY_AGENT, final_template="eval")
  tok = tiny_agent_policy.tokenizer
  res = agent.answer_batch(["Who?"] * 2, ["Some words here. " * 10] * 2)[0]  # two rows: TINY_AGENT's programs
  text = tok.decode(res.conversations[-1].prompt_ids, skip_special_tokens=False)
  assert text == tok.chat_text(FINAL_TEMPLATE_EVAL.format(prompt="Who?", memory=res.memories[-1]))
  assert 'format your response as follows "Therefore, the answer is (insert answer here)".' in text


def test_strip_stop_removes_only_an_emitted_stop_token():
  """Rows: stopped after 2 tokens + stop; capped (no stop); inactive (nothing generated)."""
  tokens = np.array([[5, 6, 2, 0], [7, 8, 9, 10], [0, 0, 0, 0]], np.int32)
  gen = Generation(tokens, np.zeros((3, 4)), np.zeros((3, 4)), np.array([3, 4, 0]),
                   np.array([True, False, False]), 4)
  ids, length = _strip_stop(gen, 6, pad_id=0)
  assert np.asarray(length).tolist() == [2, 4, 0]
  assert np.asarray(ids).tolist() == [[5, 6, 0, 0, 0, 0], [7, 8, 9, 10, 0, 0], [0] * 6]


@pytest.fixture(scope="module")
def tiny_agent_policy():
  """Random tiny body with SmolLM2's vocabulary and tokenizer: fast, never stops early."""
  return mj.load_policy("random:tiny-smollm2", seed=1)


# One reader shape for the tiny policy's tests, run on batches of two rows: they share its compiled
# memory and answer blocks (greedy, and sampled) instead of each compiling its own.
TINY_AGENT = dict(chunk_tokens=32, memory_tokens=8, answer_tokens=4, block_chunks=2)


def test_blocks_carry_memory_and_key(tiny_agent_policy):
  """Sampled (T=1) runs are identical whatever the scan block size: memory and PRNG key are
  carried across blocks exactly as across steps. Blocks of 1 (every step a new block) against blocks of
  2 (steps inside a block, a partial last block); a third size would run the same two paths again."""
  doc = " ".join(f"word{i}" for i in range(50))  # 5 chunks: 5 x 1, and 2 x 2 + a partial block
  runs = []
  for block in (1, 2):
    agent = MemAgent(tiny_agent_policy, **dict(TINY_AGENT, block_chunks=block))
    runs.append(agent.answer_batch(["Which word?", "What?"], [doc, doc[:150]], temperature=1.0, seed=5))
  for other in runs[1:]:
    for a, b in zip(runs[0], other):
      assert a.memories == b.memories and a.answer == b.answer
      for ca, cb in zip(a.conversations, b.conversations):
        assert ca.prompt_ids.tolist() == cb.prompt_ids.tolist()
        assert ca.response_ids.tolist() == cb.response_ids.tolist()
  long, short = runs[0]
  assert long.num_chunks > short.num_chunks >= 2
  assert all(c.truncated for c in long.conversations)  # random weights never emit a stop token
  assert all(len(c.response_ids) == 8 for c in long.conversations[:-1])  # memory capped


def test_next_block_is_dispatched_before_the_last_is_fetched(tiny_agent_policy, monkeypatch):
  """The host keeps one block in flight: block k goes to the device before block k - 1's outputs are
  fetched, and the answers before the last block's, so tokenising and collecting overlap device work."""
  events = []
  agent = MemAgent(tiny_agent_policy, **TINY_AGENT)
  run_block = agent.memory_block

  def recorded_block(*args, block, **kwargs):
    events.append(f"block {int(block.first)}")
    return run_block(*args, block=block, **kwargs)

  run_answers, fetch = agent.answer_block, memagent_module.RowPlacement.local
  agent.memory_block = recorded_block
  agent.answer_block = lambda *a, **k: events.append("answers") or run_answers(*a, **k)  # this agent's only
  monkeypatch.setattr(memagent_module.RowPlacement, "local",
                      lambda self, tree, **k: events.append(f"fetch {tree.active.shape[0]} steps") or fetch(self, tree, **k))
  doc = " ".join(f"word{i}" for i in range(50))  # 5 chunks
  read = lambda: agent.answer_batch(["Which word?"] * 2, [doc] * 2)[0]  # two rows: TINY_AGENT's programs
  blocks = -(-read().num_chunks // 2)
  assert blocks >= 3
  events.clear()
  read()
  overlapped = [e for k in range(1, blocks) for e in (f"block {2 * k}", "fetch 2 steps")]
  assert events == ["block 0"] + overlapped + ["answers", "fetch 2 steps", "fetch 1 steps"]


def test_inactive_rows_keep_their_memory(tiny_agent_policy):
  """A short document in a batch with a long one ends with the same memory as in a batch where no row
  waits (beside itself: the same compiled block; greedy, so a row's result is its own)."""
  agent = MemAgent(tiny_agent_policy, **TINY_AGENT)
  long_doc, short_doc = "alpha beta gamma " * 40, "delta epsilon " * 20  # 4 and 2 chunks: a block of waiting
  alone = agent.answer_batch(["Q?", "Q?"], [short_doc, short_doc])[1]
  together = agent.answer_batch(["Q?", "Q?"], [long_doc, short_doc])
  assert together[1].num_chunks == alone.num_chunks < together[0].num_chunks
  assert together[1].memories == alone.memories
  assert together[1].conversations[-1].prompt_ids.tolist() == alone.conversations[-1].prompt_ids.tolist()


def test_direct_reader_prompt_budget_and_truncation(tiny_agent_policy):
  tok = tiny_agent_policy.tokenizer
  doc = " ".join(f"w{i}" for i in range(3000))
  reader = DirectReader(tiny_agent_policy, answer_tokens=8, context_tokens=1024)
  with pytest.raises(ValueError, match=r"document 0 has \d+ tokens but only \d+ fit the context window of 1024"):
    reader.answer("Q?", doc)
  short = " ".join(f"w{i}" for i in range(50))
  res = reader.answer("Q?", short)
  want = tok.chat_text(templates.DIRECT_TEMPLATE.format(prompt="Q?", context=short))
  assert tok.decode(res.conversations[0].prompt_ids, skip_special_tokens=False) == want
  assert res.memories == [] and len(res.conversations) == 1 and len(res.conversations[0].response_ids) == 8
  cut = DirectReader(tiny_agent_policy, answer_tokens=8, context_tokens=1024, truncate=True).answer("Q?", doc)
  ids = tok.encode(doc)
  budget = 1024 - 8 - len(tok.encode("Q?")) - reader.segments.fixed_tokens
  kept = np.concatenate([ids[:budget // 2], ids[len(ids) - (budget - budget // 2):]]).tolist()
  assert cut.conversations[0].prompt_ids.tolist() == reader.segments.assemble(prompt=tok.encode("Q?"), context=kept)
  assert cut.document_tokens == len(ids)


def test_conversation_batch_rows(tiny_agent_policy):
  agent = MemAgent(tiny_agent_policy, **TINY_AGENT)
  results = agent.answer_batch(["Q?", "R?"], ["one two three " * 20, "four five " * 8], temperature=1.0,
                               top_p=1.0, seed=2)
  batch = ConversationBatch.from_results(results, agent.pad_id)
  assert len(batch) == sum(len(r.conversations) for r in results)
  assert batch.is_final.sum() == 2 and batch.trajectory.tolist() == sorted(batch.trajectory.tolist())
  for row in range(len(batch)):
    conv = results[batch.trajectory[row]].conversations[batch.turn[row]]
    p = batch.prompt_lengths[row]
    assert batch.prompt_ids[row, -p:].tolist() == conv.prompt_ids.tolist()
    assert batch.response_ids[row][batch.response_mask[row]].tolist() == conv.response_ids.tolist()
    assert (batch.response_mask[row].sum() == (4 if conv.is_final else 8))
  fixed = ConversationBatch.from_results(results, agent.pad_id, prompt_width=512, response_width=16)
  assert fixed.prompt_ids.shape == (len(batch), 512) and fixed.response_ids.shape == (len(batch), 16)
  np.testing.assert_array_equal(fixed.prompt_ids[:, -batch.prompt_ids.shape[1]:], batch.prompt_ids)
  with pytest.raises(ValueError, match="need prompt width"):
    ConversationBatch.from_results(results, 0, prompt_width=8)


def test_pack_left_matches_numpy():
  rng = np.random.default_rng(0)
  b = 5
  parts, host = [], [[] for _ in range(b)]
  for w in (3, 7, 2, 5):
    ids = rng.integers(1, 100, (b, w)).astype(np.int32)
    n = rng.integers(0, w + 1, (b,)).astype(np.int32)
    parts.append((ids, n))
    for i in range(b):
      host[i] += ids[i, :n[i]].tolist()
  tokens, valid = pack_left(parts, pad_id=0)
  tokens, valid = np.asarray(tokens), np.asarray(valid)
  for i in range(b):
    assert tokens[i][valid[i]].tolist() == host[i]
    assert valid[i].tolist() == sorted(valid[i].tolist())  # left padding


def test_bad_inputs(tiny_agent_policy):
  p = tiny_agent_policy
  with pytest.raises(ValueError, match="memory_tokens=0 must be a positive integer"):
    MemAgent(p, chunk_tokens=64, memory_tokens=0, answer_tokens=8)
  spec = mj.ReaderSpec(chunk_tokens=64, memory_tokens=8, answer_tokens=8, block_chunks=3)
  assert MemAgent(p, spec).block_chunks == 3  # a spec, or its fields as keywords
  with pytest.raises(TypeError, match=r"a ReaderSpec or its fields as keywords, not both \(got \['block_chunks'\]\)"):
    MemAgent(p, spec, block_chunks=2)
  with pytest.raises(TypeError, match="chunk_token"):  # a misspelt setting is not ignored
    MemAgent(p, chunk_token=64, memory_tokens=8, answer_tokens=8)
  with pytest.raises(ValueError, match=r"memory update needs \d+ tokens .*chunk 8000.*context window is 8192"):
    MemAgent(p, chunk_tokens=8000, memory_tokens=1024, answer_tokens=1024)
  agent = MemAgent(p, chunk_tokens=64, memory_tokens=8, answer_tokens=8)
  with pytest.raises(ValueError, match="document 1 is empty"):
    agent.answer_batch(["Q?", "Q?"], ["text", " \n\n "])
  with pytest.raises(ValueError, match="document 0 is empty"):
    agent.answer("Q?", "")
  with pytest.raises(ValueError, match="question 0 has 1100 tokens, over the question budget of 1024"):
    agent.answer(" x" * 1100, "text")
  with pytest.raises(ValueError, match="question 0 is empty"):
    agent.answer("  ", "text")
  big = MemAgent(p, chunk_tokens=6000, memory_tokens=1024, answer_tokens=64)
  with pytest.raises(ValueError, match="question 900"):  # fits the budget, not the context
    big.answer(" x" * 900, "text")


def test_from_file_streams_and_reports_bad_files(tiny_agent_policy, tmp_path):
  agent = MemAgent(tiny_agent_policy, **TINY_AGENT)
  text = "\n".join(squad_paragraphs(2))
  path = tmp_path / "doc.txt"
  path.write_text(text)
  a = agent.answer_batch(["Q?"] * 2, [str(path)] * 2, from_files=True)[0]  # two rows: TINY_AGENT's programs
  b = agent.answer_batch(["Q?"] * 2, [text] * 2)[0]
  assert a.document_tokens == b.document_tokens and a.memories == b.memories
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine text \xff\xfe more")
  with pytest.raises(ValueError, match=r"bad.txt is not UTF-8 text \(invalid byte at offset 10"):
    agent.answer_batch(["Q?"], [str(bad)], from_files=True)
  with pytest.raises(FileNotFoundError, match="document not found: .*missing.txt"):
    agent.answer_batch(["Q?"], [str(tmp_path / "missing.txt")], from_files=True)
