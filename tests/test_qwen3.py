"""Qwen3 dense models: logits, greedy decoding and export against transformers' Qwen3ForCausalLM on a tiny
random checkpoint, the presets against the published sizes, and the chat template with thinking off."""

import json
import os

import numpy as np
import pytest
import torch

import memagent_jax as mj
from conftest import make_tiny_hf_dir, torch_logits
from memagent_jax.models.config import PRESETS, ModelConfig
from memagent_jax.policy.decode_spec import GREEDY
from memagent_jax.text import chat_templates, templates
from memagent_jax.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
  """transformers' own tiny Qwen3 (head_dim 32 != hidden / heads, tied embeddings, q/k norm scales
  away from 1)."""
  return make_tiny_hf_dir(tmp_path_factory, "qwen3", seed=3)


@pytest.fixture(scope="module")
def qwen3_policy(qwen3_dir):
  return mj.load_policy(qwen3_dir, dtype="float32")


def test_qwen3_logits_match_transformers(qwen3_dir, qwen3_policy):
  cfg = qwen3_policy.config
  assert (cfg.arch, cfg.qk_norm, cfg.attention_bias, cfg.head_dim, cfg.tie_word_embeddings) == (
      "qwen3", True, False, 32, True)
  assert cfg.rope_theta == 1e6
  ids = np.random.default_rng(0).integers(0, 128, size=(3, 40))
  diff = np.abs(np.asarray(qwen3_policy.logits(ids)) - torch_logits(qwen3_dir, ids)).max()
  print(f"tiny Qwen3 fp32 max |logits diff| vs transformers: {diff:.2e}")
  assert diff <= 1e-4
  mask = np.ones_like(ids)
  mask[1, :6] = 0  # row 1 left-padded by 6: positions restart at its first real token
  ours = np.asarray(qwen3_policy.logits(ids, attention_mask=mask))
  assert np.abs(ours[1, 6:] - torch_logits(qwen3_dir, ids[1:2, 6:])[0]).max() <= 1e-4


def test_untied_qwen3_logits_match_transformers(tmp_path_factory):
  """Qwen3-8B and 14B untie the output projection from the embedding: the tiny checkpoint's lm_head is
  loaded as its own weight and the logits are transformers'."""
  untied = make_tiny_hf_dir(tmp_path_factory, "qwen3", seed=6, tie=False)
  policy = mj.load_policy(untied, dtype="float32")
  assert not policy.config.tie_word_embeddings and policy.model.lm_head is not None
  ids = np.random.default_rng(1).integers(0, 128, size=(2, 24))
  diff = np.abs(np.asarray(policy.logits(ids)) - torch_logits(untied, ids)).max()
  print(f"tiny untied Qwen3 fp32 max |logits diff| vs transformers: {diff:.2e}")
  assert diff <= 1e-4


def test_qwen3_qk_norms_are_loaded_and_used(qwen3_dir, qwen3_policy):
  """The parity above would not see q/k norms loaded as ones (scale 1 keeps the normalisation); check the
  scales are transformers' and that they move the logits."""
  from transformers import AutoModelForCausalLM
  ref = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32)
  attn = qwen3_policy.model.layers[1].attn
  np.testing.assert_array_equal(np.asarray(attn.k_norm.scale[...]),
                                ref.model.layers[1].self_attn.k_norm.weight.detach().numpy())
  ids = np.arange(24)[None] % 128
  before = np.asarray(qwen3_policy.logits(ids))
  model = mj.load_policy(qwen3_dir).model
  model.layers[0].attn.q_norm.scale[...] = np.ones(32, np.float32)
  assert np.abs(np.asarray(mj.Policy(model).logits(ids)) - before).max() > 1e-3


def test_qwen3_greedy_decode_is_transformers_generate(qwen3_dir, qwen3_policy):
  from transformers import AutoModelForCausalLM
  ref = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
  prompt = np.random.default_rng(4).integers(0, 128, size=11).tolist()
  with torch.no_grad():
    theirs = ref.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                          pad_token_id=0)[0, len(prompt):].tolist()
  out = qwen3_policy.sample([prompt], 32, params=GREEDY, stop_tokens=[])
  assert int(out.lengths[0]) == 32
  assert out.tokens[0].tolist() == theirs
  assert len(set(theirs)) > 1  # not one repeated token: the comparison sees 32 decode steps


def test_qwen3_export_round_trip_through_transformers(qwen3_policy, tmp_path):
  out = str(tmp_path / "export")
  qwen3_policy.export(out)
  hf = json.load(open(os.path.join(out, "config.json")))
  assert (hf["model_type"], hf["architectures"], hf["head_dim"], hf["attention_bias"]) == (
      "qwen3", ["Qwen3ForCausalLM"], 32, False)
  ids = np.random.default_rng(5).integers(0, 128, size=(2, 24))
  ours = np.asarray(qwen3_policy.logits(ids))
  np.testing.assert_allclose(torch_logits(out, ids), ours, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(mj.load_policy(out).logits(ids)), ours)


def test_qwen3_presets_have_the_published_sizes():
  """Non-embedding parameter counts from the Qwen3 model cards (0.44B, 1.4B, 3.6B, 6.95B, 13.2B) and the
  config.json round trip; q/k norms belong to qwen3 alone in transformers."""
  published = {"qwen3-0.6b": 0.44e9, "qwen3-1.7b": 1.4e9, "qwen3-4b": 3.6e9, "qwen3-8b": 6.95e9,
               "qwen3-14b": 13.2e9}
  for name, non_embedding in published.items():
    cfg = PRESETS[name]
    embed = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    assert abs(cfg.num_params - embed - non_embedding) < 0.01 * non_embedding, name
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    assert cfg.to_hf_dict()["model_type"] == "qwen3" and cfg.head_dim == 128
  assert [PRESETS[n].tie_word_embeddings for n in published] == [True, True, True, False, False]
  with pytest.raises(ValueError, match="llama in transformers never has q/k norms"):
    PRESETS["tiny-llama"].replace(qk_norm=True).to_hf_dict()
  with pytest.raises(ValueError, match="qwen3 in transformers always has q/k norms"):
    PRESETS["tiny-qwen3"].replace(qk_norm=False).to_hf_dict()


# ---- chat template, thinking off --------------------------------------------------------------

def _qwen3_style_tokenizer():
  """A byte-level BPE built here (no download) with Qwen's control tokens, <think>/</think> as added
  tokens as in Qwen3's vocabulary, and the shipped Qwen3 chat template."""
  from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  raw = RawTokenizer(models.BPE())
  raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  raw.decoder = decoders.ByteLevel()
  corpus = [templates.MEMORY_TEMPLATE, templates.FINAL_TEMPLATE_BOXED, "Paris is the capital of France."]
  raw.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               chat_template=chat_templates.QWEN3)
  hf.add_tokens(["<think>", "</think>"])
  return hf


def test_qwen3_template_renders_memagent_turns_with_thinking_off():
  """Both MemAgent turns: transformers' apply_chat_template(enable_thinking=False) on the shipped template
  is the hand-written Qwen3 form (user turn, assistant header, empty think block); our chat_text is the
  same text, and the agent's pre-tokenised template segments give the ids of tokenizing it whole."""
  hf = _qwen3_style_tokenizer()
  tok = Tokenizer(hf)
  fields = dict(prompt="What is the capital of France?", memory=templates.NO_MEMORY,
                chunk="Document 1:\nParis is the capital of France.")
  for template in (templates.MEMORY_TEMPLATE, templates.FINAL_TEMPLATE_BOXED):
    user = template.format(**fields)
    theirs = hf.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                    add_generation_prompt=True, enable_thinking=False)
    assert theirs == f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.chat_text(user) == theirs
    segments = templates.TemplateSegments.build(tok, template)
    ids = segments.assemble(**{f: tok.encode(fields[f]) for f in segments.fields})
    assert ids == hf.encode(theirs, add_special_tokens=False)
    assert hf.convert_tokens_to_ids("</think>") in ids
  thinking = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
  assert thinking.endswith("<|im_start|>assistant\n")  # the template's default (thinking on) differs
  assert tok.stop_token_ids == [hf.convert_tokens_to_ids("<|endoftext|>"), hf.convert_tokens_to_ids("<|im_end|>")]
