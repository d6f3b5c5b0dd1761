"""Shared fixtures: the embedded SmolLM2 policy, tiny random HF checkpoints, torch references."""

import os
import sys

import numpy as np
import pytest

import memagent_jax as mj

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)  # the `configs` package


@pytest.fixture(scope="session")
def smollm():
  """The embedded default model (SmolLM2-135M-Instruct GGUF), float32."""
  return mj.load_policy("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm_reference():
  """transformers loading the same GGUF file: the reference we did not write."""
  import torch
  from transformers import AutoModelForCausalLM
  from memagent_jax.models.loading import embedded_gguf_path
  path = embedded_gguf_path()
  model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                               dtype=torch.float32)
  return model.eval()


def make_tiny_hf_dir(tmp_path_factory, arch: str, seed: int = 0) -> str:
  """A random tiny Llama or Qwen2 checkpoint saved by transformers itself (non-zero biases)."""
  import torch
  import transformers
  torch.manual_seed(seed)
  common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5)
  if arch == "qwen2":
    cfg = transformers.Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(cfg)
  else:
    cfg = transformers.LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))  # non-trivial norm scales
      else:
        p.copy_(0.05 * torch.randn_like(p))  # includes q/k/v biases for Qwen2
  out = tmp_path_factory.mktemp(f"tiny-{arch}")
  model.save_pretrained(str(out))
  return str(out)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_hf_dir(request, tmp_path_factory):
  return request.param, make_tiny_hf_dir(tmp_path_factory, request.param)


def torch_logits(model_dir_or_model, ids: np.ndarray, attention_mask=None) -> np.ndarray:
  import torch
  from transformers import AutoModelForCausalLM
  model = model_dir_or_model
  if isinstance(model, str):
    model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
  with torch.no_grad():
    kw = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
    return model(torch.tensor(ids), **kw).logits.float().numpy()
