"""Model hyper-parameters for the Llama / Qwen2 / Qwen3 decoder family, with named presets."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
               "num_kv_heads", "head_dim", "max_position_embeddings")


class UnknownModelError(KeyError, ValueError):
  """An unknown preset or model source: a KeyError for lookups, a ValueError for bad input."""

  def __str__(self):  # KeyError would print the message quoted, as a repr
    return str(self.args[0]) if self.args else ""


def _positive_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1


def _positive_float(v) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and constants of a decoder-only LM; hashable so it can be a static jit argument."""

  arch: str  # "llama", "qwen2" or "qwen3"
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  max_position_embeddings: int = 8192
  tie_word_embeddings: bool = True
  attention_bias: bool = False  # q/k/v projection biases (Qwen2: True)
  # RMSNorm over each head's D values of q and k, after the projection and before RoPE (Qwen3; its
  # transformers config has no key for it: model_type qwen3 always has q_norm and k_norm).
  qk_norm: bool = False
  # Token shift: learnt embeddings of the previous N tokens added to each token's input embedding,
  # so one attention layer can match a key a few tokens back. Not in transformers (its config key
  # is memagent_token_shift); toy models use it to learn content lookup in minutes
  # (docs/results/probe_recall.md).
  token_shift: int = 0

  def __post_init__(self):
    if self.arch not in ARCHITECTURES:
      raise ValueError(f"ModelConfig.arch={self.arch!r}; supported: {sorted(ARCHITECTURES)}")
    for name in _INT_FIELDS:
      if not _positive_int(getattr(self, name)):
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be a positive integer")
    for name in ("rope_theta", "rms_norm_eps"):
      if not _positive_float(getattr(self, name)):
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be a positive finite number")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig: num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if not (isinstance(self.token_shift, int) and self.token_shift >= 0):
      raise ValueError(f"ModelConfig.token_shift={self.token_shift!r} must be an integer >= 0")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig: head_dim={self.head_dim} must be even for RoPE")

  @property
  def num_params(self) -> int:
    e, f, d = self.hidden_size, self.intermediate_size, self.head_dim
    attn = e * d * (2 * self.num_heads + 2 * self.num_kv_heads)
    if self.attention_bias:
      attn += d * (self.num_heads + 2 * self.num_kv_heads)
    layer = attn + 3 * e * f + 2 * e + (2 * d if self.qk_norm else 0)
    embed = self.vocab_size * e * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * layer + embed + e + self.token_shift * self.vocab_size * e

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  # --- HF config.json interchange -------------------------------------------------
  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> "ModelConfig":
    """Builds a config from a transformers `config.json` dict (Llama, Qwen2, Qwen3); errors name the key."""
    if not isinstance(hf, dict):
      raise ValueError(f"{source}: expected a JSON object, got a JSON {type(hf).__name__}")
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
      raise ValueError(f"{source}: model_type={model_type!r} is not supported; "
                       f"supported: {sorted(ARCHITECTURES)}")
    for key in ("rope_scaling", "rope_parameters"):  # transformers <5 / >=5 names
      scaling = hf.get(key)
      if scaling and (not isinstance(scaling, dict)
                      or scaling.get("rope_type", scaling.get("type")) not in (None, "default")):
        raise ValueError(f"{source}: {key}={scaling} is not supported (only default RoPE)")
    if hf.get("use_sliding_window"):
      raise ValueError(f"{source}: use_sliding_window=true is not supported")

    def get(key, check, what, default=None):
      v = hf.get(key)
      if v is None:
        if default is None:
          raise ValueError(f"{source}: missing required key {key!r}")
        return default
      if not check(v):
        raise ValueError(f"{source}: {key}={v!r} must be {what}")
      return v

    def num(key, default=None):
      return get(key, _positive_int, "a positive integer", default)

    heads, hidden = num("num_attention_heads"), num("hidden_size")
    if hf.get("head_dim") is None and hidden % heads:
      raise ValueError(f"{source}: hidden_size={hidden} is not a multiple of num_attention_heads={heads} "
                       "(and no head_dim is given)")
    theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    if not _positive_float(theta):
      raise ValueError(f"{source}: rope_theta={theta!r} must be a positive finite number")
    kw = dict(
        arch=model_type, vocab_size=num("vocab_size"), hidden_size=hidden,
        intermediate_size=num("intermediate_size"), num_layers=num("num_hidden_layers"),
        num_heads=heads, num_kv_heads=num("num_key_value_heads", heads),
        head_dim=num("head_dim", hidden // heads),
        rope_theta=float(theta),
        rms_norm_eps=float(get("rms_norm_eps", _positive_float, "a positive finite number", 1e-6)),
        max_position_embeddings=num("max_position_embeddings", 8192),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type == "qwen3",
        token_shift=get("memagent_token_shift", lambda x: type(x) is int and x >= 0, "an integer >= 0", 0))
    try:
      return cls(**kw)
    except ValueError as e:  # a cross-field check of __post_init__
      raise ValueError(f"{source}: {e}") from None

  def to_hf_dict(self, dtype: str = "float32") -> dict[str, Any]:
    """The transformers `config.json` that reloads these weights with equal logits."""
    d = {
        "architectures": [ARCHITECTURES[self.arch]],
        "model_type": self.arch,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "rope_theta": self.rope_theta,
        "rms_norm_eps": self.rms_norm_eps,
        "max_position_embeddings": self.max_position_embeddings,
        "tie_word_embeddings": self.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": dtype,
    }
    if self.qk_norm != (self.arch == "qwen3"):
      raise ValueError(f"{self.arch} in transformers {'always' if self.arch == 'qwen3' else 'never'} has q/k "
                       f"norms; qk_norm={self.qk_norm} has no transformers config")
    if self.arch == "llama":
      d.update(attention_bias=self.attention_bias, mlp_bias=False)
    elif self.arch == "qwen3":
      d.update(attention_bias=self.attention_bias, use_sliding_window=False)
    elif not self.attention_bias:
      raise ValueError("qwen2 in transformers always has q/k/v biases; set attention_bias=True")
    if self.token_shift:  # ours only: transformers ignores the key, so such weights run only here
      d["memagent_token_shift"] = self.token_shift
    return d


# The toy word tokenizer's vocabulary size rounded up to a multiple of 64 (tests/test_toy.py
# checks it against memagent_jax.data.toy_tokenizer.vocabulary()).
TOY_VOCAB_SIZE = 192

# Values from the models' published config.json files.
def _qwen3(*, hidden: int, ffn: int, layers: int, heads: int, tied: bool) -> ModelConfig:
  """A Qwen3 dense size: what differs by size is given, the rest is shared by the whole family."""
  return ModelConfig(arch="qwen3", vocab_size=151936, hidden_size=hidden, intermediate_size=ffn, num_layers=layers,
                     num_heads=heads, num_kv_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                     max_position_embeddings=40960, tie_word_embeddings=tied, attention_bias=False, qk_norm=True)


PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m-instruct": ModelConfig(
        arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=True, attention_bias=False),
    "qwen2.5-0.5b-instruct": ModelConfig(
        arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
        num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=True, attention_bias=True),
    "qwen2.5-1.5b-instruct": ModelConfig(
        arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
        num_heads=12, num_kv_heads=2, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=True, attention_bias=True),
    "qwen2.5-3b-instruct": ModelConfig(
        arch="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
        num_heads=16, num_kv_heads=2, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=True, attention_bias=True),
    "qwen2.5-7b-instruct": ModelConfig(
        arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
        num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=True),
    "qwen2.5-14b-instruct": ModelConfig(
        arch="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_layers=48,
        num_heads=40, num_kv_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=True),
    # Qwen3 dense models (hybrid thinking; MemAgent's prompts run with thinking off). Every number is
    # from the model's published config.json (huggingface.co/Qwen/Qwen3-<size>): 4B, 8B and 14B as
    # copied verbatim in github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md; 0.6B from a printout of
    # AutoConfig.from_pretrained("Qwen/Qwen3-0.6B") (kiraa-blog.vercel.app/post/learning-qwen3-0.6b),
    # 1.7B from secondary copies of its config (apxml.com/models/qwen3-1-7b: hidden 2048, FFN 6144);
    # layers, heads and tying of all five agree with the Qwen3 report (arXiv 2505.09388). All: head_dim 128
    # (not hidden / heads), no q/k/v bias, q/k norms, rope_theta 1e6, rms_norm_eps 1e-6, vocab 151936,
    # max_position_embeddings 40960; embeddings tied up to 4B, untied from 8B.
    "qwen3-0.6b": _qwen3(hidden=1024, ffn=3072, layers=28, heads=16, tied=True),
    "qwen3-1.7b": _qwen3(hidden=2048, ffn=6144, layers=28, heads=16, tied=True),
    "qwen3-4b": _qwen3(hidden=2560, ffn=9728, layers=36, heads=32, tied=True),
    "qwen3-8b": _qwen3(hidden=4096, ffn=12288, layers=36, heads=32, tied=False),
    "qwen3-14b": _qwen3(hidden=5120, ffn=17408, layers=40, heads=40, tied=False),
    # Tiny configs for tests and toy experiments.
    "tiny-llama": ModelConfig(
        arch="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=512, tie_word_embeddings=True, attention_bias=False),
    "tiny-qwen2": ModelConfig(
        arch="qwen2", vocab_size=256, hidden_size=64, intermediate_size=160, num_layers=2,
        num_heads=4, num_kv_heads=1, head_dim=16, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=512, tie_word_embeddings=False, attention_bias=True),
    # Qwen3's layout in miniature: head_dim 32 is not hidden / heads = 16, as in the real models.
    "tiny-qwen3": ModelConfig(
        arch="qwen3", vocab_size=256, hidden_size=64, intermediate_size=160, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=512, tie_word_embeddings=True, attention_bias=False, qk_norm=True),
    # SmolLM2's vocabulary (so the embedded tokenizer works) on a tiny body: agent tests, scaling bench.
    "tiny-smollm2": ModelConfig(
        arch="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=100000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=True, attention_bias=False),
    # The toy world's word-level vocabulary (memagent_jax.data.toy_tokenizer), CPU-scale RL.
    "toy-1m": ModelConfig(
        arch="llama", vocab_size=TOY_VOCAB_SIZE, hidden_size=128, intermediate_size=512, num_layers=4,
        num_heads=4, num_kv_heads=4, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=4096, tie_word_embeddings=True, attention_bias=False),
    # toy-1m with a token shift of 2: learns to look a fact up by a random key (the value sits 2
    # tokens after its key) in a few hundred steps, where toy-1m stays at chance.
    "toy-1m-shift2": ModelConfig(
        arch="llama", vocab_size=TOY_VOCAB_SIZE, hidden_size=128, intermediate_size=512, num_layers=4,
        num_heads=4, num_kv_heads=4, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=4096, tie_word_embeddings=True, attention_bias=False, token_shift=2),
    "toy-tiny": ModelConfig(
        arch="llama", vocab_size=TOY_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=4096, tie_word_embeddings=True, attention_bias=False),
}


def get_preset(name: str) -> ModelConfig:
  """Looks up a preset by (case-insensitive) name, with a clear error listing valid names."""
  key = name.lower()
  if key not in PRESETS:
    raise UnknownModelError(f"unknown model preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
  return PRESETS[key]
