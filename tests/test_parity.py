"""Parity with transformers (PyTorch): logits for tiny random checkpoints and the real SmolLM2, and the
agent's greedy conversations on SmolLM2 against a Python loop around transformers' `generate`."""

import json
import os

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

import memagent_jax as mj
from conftest import SQUAD_SAMPLE, make_tiny_hf_dir, torch_logits
from memagent_jax.models.attention import AttentionSpec
from memagent_jax.text.templates import FINAL_TEMPLATE_BOXED, MEMORY_TEMPLATE, NO_MEMORY


def test_tiny_checkpoint_logits_match_transformers(tiny_hf_dir):
  arch, path = tiny_hf_dir
  policy = mj.load_policy(path, dtype="float32")
  assert policy.config.arch == arch
  assert policy.config.attention_bias == (arch == "qwen2")
  ids = np.random.default_rng(0).integers(0, 128, size=(3, 40))
  diff = np.abs(np.asarray(policy.logits(ids)) - torch_logits(path, ids)).max()
  assert diff <= 1e-4, f"{arch}: max |logits diff| = {diff}"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_bfloat16_logits_err_no_more_than_transformers_bfloat16(arch, tmp_path_factory):
  """bf16 compute (model.dtype="bfloat16", the pod configs' setting): every weight is bf16, and our
  logits' distance from transformers' fp32 ones is within 2x of transformers' own bf16 model's distance
  (about 0.013-0.021 here for logits up to about 2; the largest ratio seen 1.3)."""
  path = make_tiny_hf_dir(tmp_path_factory, arch, seed=3)
  policy = mj.load_policy(path, dtype="bfloat16")
  assert {x.dtype for x in jax.tree.leaves(nnx.state(policy.model, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}
  ids = np.random.default_rng(0).integers(0, 128, size=(3, 40))
  reference = torch_logits(path, ids)  # fp32
  theirs_bf16 = torch_logits(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval(), ids)
  ours = np.abs(np.asarray(policy.logits(ids)) - reference).max()
  theirs = np.abs(theirs_bf16 - reference).max()
  print(f"{arch} bf16 max |logits - fp32 transformers|: ours {ours:.2e}, transformers bf16 {theirs:.2e}")
  assert theirs > 1e-3 and ours > 1e-4  # both really computed in bf16 (fp32 agrees to 1e-5)
  assert ours <= 2 * theirs


def test_qwen2_biases_are_nonzero_and_used(tmp_path_factory):
  """The parity above would also pass if biases were ignored and zero; make sure they are not."""
  policy = mj.load_policy(make_tiny_hf_dir(tmp_path_factory, "qwen2", seed=5))
  bias = np.asarray(policy.model.layers[0].attn.q_bias[...])
  assert np.abs(bias).max() > 0.01
  ids = np.arange(20)[None] % 128
  with_bias = np.asarray(policy.logits(ids))
  policy.model.layers[0].attn.q_bias[...] = 0 * policy.model.layers[0].attn.q_bias[...]
  zeroed = mj.Policy(policy.model)
  assert np.abs(np.asarray(zeroed.logits(ids)) - with_bias).max() > 1e-4


def test_blocked_prefill_attention_matches_transformers(tiny_hf_dir):
  """Prefill attention runs in causal query blocks; shrink the block so a short input uses it."""
  _, path = tiny_hf_dir
  policy = mj.load_policy(path, attention=AttentionSpec(query_block=16))
  ids = np.random.default_rng(2).integers(0, 128, size=(2, 53))  # 53: a shape traced only here
  diff = np.abs(np.asarray(policy.logits(ids)) - torch_logits(path, ids)).max()
  assert diff <= 1e-4


def test_long_prefill_loop_matches_transformers(tiny_hf_dir):
  """Long prefills run one query block at a time in `lax.map` (bounded memory); shrink the
  thresholds so a short input takes that path, including a partial last block and left padding."""
  _, path = tiny_hf_dir
  policy = mj.load_policy(path, attention=AttentionSpec(query_block=16, scan_from=32))
  ids = np.random.default_rng(3).integers(0, 128, size=(2, 59))  # 59: traced only here
  assert np.abs(np.asarray(policy.logits(ids)) - torch_logits(path, ids)).max() <= 1e-4
  mask = np.ones_like(ids)
  mask[1, :7] = 0
  ours = np.asarray(policy.logits(ids, attention_mask=mask))
  assert np.abs(ours[1, 7:] - torch_logits(path, ids[1:, 7:])[0]).max() <= 1e-4


def test_left_padded_logits_match_transformers(tiny_hf_dir):
  _, path = tiny_hf_dir
  policy = mj.load_policy(path)
  ids = np.random.default_rng(1).integers(0, 128, size=(2, 16))
  mask = np.ones_like(ids)
  mask[0, :5] = 0  # row 0 is left-padded by 5
  ours = np.asarray(policy.logits(ids, attention_mask=mask))
  # transformers derives positions from the mask only in generate; compare each row unpadded.
  alone = torch_logits(path, ids[:1, 5:])
  assert np.abs(ours[0, 5:] - alone[0]).max() <= 1e-4


@pytest.mark.slow
def test_smollm2_gguf_logits_match_transformers(smollm, smollm_reference):
  """The embedded GGUF model's logits over a prompt longer than one prefill query block. (Its greedy
  decoding against transformers' `generate`, cache on and off: the agent test below.)"""
  doc = open("experiments/data/demo_document.txt").read()[:3000]
  prompt = smollm.tokenizer.apply_chat_template(f"{doc}\n\nSummarise the text above in one sentence.")
  assert len(prompt) > 600  # longer than one prefill query block: the blocked causal path is used
  ids = np.array([prompt])
  ours = np.asarray(smollm.logits(ids))
  theirs = torch_logits(smollm_reference, ids)
  diff = np.abs(ours - theirs).max()
  print(f"SmolLM2 GGUF max |logits diff| vs transformers: {diff:.2e}")
  assert diff <= 2e-3


def test_gguf_rotary_unpermute_inverts_llama_cpp_permute():
  """llama.cpp's convert script permutes q/k rows; our inverse must undo it exactly."""
  from memagent_jax.models.gguf_weights import unpermute_rotary
  n_heads, d, e = 3, 8, 5
  w = np.random.default_rng(0).normal(size=(n_heads * d, e))
  # llama.cpp convert_hf_to_gguf.py LlamaModel.permute, re-derived
  permuted = w.reshape(n_heads, 2, d // 2, e).swapaxes(1, 2).reshape(w.shape)
  np.testing.assert_array_equal(unpermute_rotary(permuted, n_heads), w)
  assert not np.array_equal(permuted, w)


def _transformers_loop(policy, agent, question: str, document: str, greedy):
  """The reference we did not compile: the whole document tokenised, then per chunk a prompt assembled
  from the template's pieces, the question, the chunk's ids and the previous reference memory, and
  transformers' greedy `generate` writing the next memory (its stop token dropped), then the answer."""
  stops, tokenizer = set(policy.default_stop_tokens()), policy.tokenizer
  q, doc = tokenizer.encode(question), tokenizer.encode(document)
  memory, convs = tokenizer.encode(NO_MEMORY), []
  for start in range(0, len(doc), agent.chunk_tokens):
    prompt = agent.memory_segments.assemble(prompt=q, memory=memory, chunk=doc[start:start + agent.chunk_tokens])
    ids, logp = greedy(np.asarray(prompt), agent.memory_tokens)
    convs.append((prompt, ids, logp))
    memory = ids[:-1].tolist() if len(ids) and ids[-1] in stops else ids.tolist()
  prompt = agent.final_segments.assemble(prompt=q, memory=memory)
  convs.append((prompt, *greedy(np.asarray(prompt), agent.answer_tokens)))
  return convs


@pytest.mark.slow
def test_agent_greedy_conversations_are_transformers_greedy_generate(smollm, smollm_reference):
  """The compiled recurrence against a plain Python loop around transformers' greedy `generate`, for the
  embedded model on real SQuAD text and questions: one batch of three documents of 1, 2 and 3 chunks (rows
  end in different scan blocks; blocks of several chunks carry as these: test_agent), with the template
  prefix cache on ("auto" takes it here, asserted) and off. Every prompt is the loop's, every response id
  transformers', every log-prob transformers' within 2e-3 (ids alone can survive a wrong cache: one such
  error moved logits by 3 without changing the argmax). A one-row batch with the cache on (once wrong: its opening was placed as if shared):
  test_prefix_cache."""
  from memagent_jax.agent import MemAgent
  paragraphs = [p for a in json.load(open(SQUAD_SAMPLE))["data"] for p in a["paragraphs"]]
  picked = [paragraphs[i] for i in (7, 10, 9)]  # 113, 220 and 312 tokens: 1, 2 and 3 chunks of 128
  documents, questions = [p["context"] for p in picked], [p["qas"][0]["question"] for p in picked]
  budgets = dict(chunk_tokens=128, memory_tokens=16, answer_tokens=8, block_chunks=1)
  assert MemAgent(smollm, **budgets, template_prefix_cache="auto").reuse_prefix  # the default takes this path
  stops = list(smollm.default_stop_tokens())

  def transformers_greedy(prompt, n):
    with torch.no_grad():  # generate's own raw logits: each new token's distribution, no second forward
      ref = smollm_reference.generate(torch.tensor(prompt[None].astype(np.int64)), max_new_tokens=n,
                                      do_sample=False, eos_token_id=stops, pad_token_id=stops[0],
                                      output_logits=True, return_dict_in_generate=True)
    ids = ref.sequences[0, len(prompt):].numpy()
    logp = torch.log_softmax(torch.stack(ref.logits, 1)[0].float(), -1)  # [new tokens, V]
    assert logp.shape[0] == len(ids)
    return ids, logp[torch.arange(len(ids)), torch.tensor(ids)].numpy()

  reference = [_transformers_loop(smollm, MemAgent(smollm, **budgets), q, d, transformers_greedy)
               for q, d in zip(questions, documents)]
  assert [len(r) - 1 for r in reference] == [1, 2, 3]  # chunks per document: each row ends in its own block
  for prefix_cache in ("on", "off"):
    agent = MemAgent(smollm, **budgets, template_prefix_cache=prefix_cache)
    assert agent.reuse_prefix == (prefix_cache == "on")
    results = agent.answer_batch(questions, documents)
    for document, res, ref in zip(documents, results, reference, strict=True):
      assert res.document_tokens == len(smollm.tokenizer.encode(document))
      assert len(res.conversations) == len(ref) == res.num_chunks + 1
      assert [c.is_final for c in res.conversations] == [False] * res.num_chunks + [True]
      for conv, (prompt, ids, logp) in zip(res.conversations, ref):
        assert conv.prompt_ids.tolist() == prompt, prefix_cache
        assert conv.response_ids.tolist() == ids.tolist(), prefix_cache
        np.testing.assert_allclose(conv.response_logprobs, logp, atol=2e-3, err_msg=prefix_cache)
  _prompts_are_the_chat_wrapped_templates(smollm.tokenizer, agent.chunk_tokens, questions[2], documents[2], results[2])


def _prompts_are_the_chat_wrapped_templates(tok, chunk_tokens: int, question: str, document: str, res):
  """Decoded prompts are the chat template applied to the released template text with the question, the
  previous memory (first: 'No previous memory') and the chunk's text."""
  doc_ids, memory = tok.encode(document), NO_MEMORY
  for k, conv in enumerate(res.conversations[:-1]):
    chunk = tok.decode(doc_ids[k * chunk_tokens:(k + 1) * chunk_tokens], skip_special_tokens=False)
    want = tok.chat_text(MEMORY_TEMPLATE.format(prompt=question, memory=memory, chunk=chunk))
    assert tok.decode(conv.prompt_ids, skip_special_tokens=False) == want
    memory = res.memories[k]
  want = tok.chat_text(FINAL_TEMPLATE_BOXED.format(prompt=question, memory=memory))
  assert tok.decode(res.conversations[-1].prompt_ids, skip_special_tokens=False) == want
  assert "<problem> \n" in want and want.endswith("Your answer:\n<|im_end|>\n<|im_start|>assistant\n")
  assert "put the answer in \\boxed{}." in want
