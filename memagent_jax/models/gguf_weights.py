"""Convert a llama.cpp GGUF file (Llama or Qwen2) into an HF-style directory, cached on disk.

The cached directory (config.json, fp32 model.safetensors, tokenizer files) is what
`load_policy` then reads, so a second load skips dequantisation and tokenizer conversion.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

from tqdm.auto import tqdm

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.hf_layout import hf_layout
from memagent_jax.models.safetensors_io import WeightsError, check_finite, save_tensors

CONVERTER_VERSION = 2
_LAYER_NAMES = {  # GGUF blk.{i}.X -> HF model.layers.{i}.Y
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def cache_root() -> str:
  return os.environ.get("MEMAGENT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "memagent_jax"))


def unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's q/k row permutation (interleaved -> HF rotate-half layout). w [H*D, E]."""
  d = w.shape[0] // n_heads
  return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _open(path: str):
  import gguf  # local import: only needed for GGUF sources
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # the reader raises assorted errors on corrupt files
    raise WeightsError(f"{path}: corrupt or unreadable GGUF file ({type(e).__name__}: {e})") from None


def _field(reader, key, path, default=None):
  f = reader.fields.get(key)
  if f is None:
    if default is not None:
      return default
    raise WeightsError(f"{path}: GGUF metadata key {key!r} is missing")
  return f.contents()


def _f32_to_decimal(x) -> float:
  """GGUF stores float32 (1e-5 reads as 9.9999997e-06); recover the published decimal."""
  return float(f"{float(x):.7g}")


def gguf_config(reader, path: str) -> ModelConfig:
  arch = _field(reader, "general.architecture", path)
  if arch not in ("llama", "qwen2"):
    raise WeightsError(f"{path}: GGUF architecture {arch!r} is not supported (llama, qwen2)")
  names = {t.name for t in reader.tensors}
  scaling = _field(reader, f"{arch}.rope.scaling.type", path, default="none")
  if scaling != "none" or "rope_freqs.weight" in names:
    raise WeightsError(f"{path}: RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs'}) is not "
                       "supported (only default RoPE)")
  heads = int(_field(reader, f"{arch}.attention.head_count", path))
  hidden = int(_field(reader, f"{arch}.embedding_length", path))
  vocab = _field(reader, f"{arch}.vocab_size", path, default=-1)
  if vocab == -1:
    vocab = len(_field(reader, "tokenizer.ggml.tokens", path))
  return ModelConfig(
      arch=arch, vocab_size=int(vocab), hidden_size=hidden,
      intermediate_size=int(_field(reader, f"{arch}.feed_forward_length", path)),
      num_layers=int(_field(reader, f"{arch}.block_count", path)),
      num_heads=heads,
      num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", path, default=heads)),
      head_dim=int(_field(reader, f"{arch}.rope.dimension_count", path, default=hidden // heads)),
      rope_theta=_f32_to_decimal(_field(reader, f"{arch}.rope.freq_base", path, default=10000.0)),
      rms_norm_eps=_f32_to_decimal(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", path)),
      max_position_embeddings=int(_field(reader, f"{arch}.context_length", path)),
      tie_word_embeddings="output.weight" not in names,
      attention_bias="blk.0.attn_q.bias" in names)


def gguf_tensors(reader, cfg: ModelConfig, path: str) -> dict[str, np.ndarray]:
  """Dequantised float32 tensors under their HF names and HF layout."""
  from gguf.quants import dequantize  # lazy: only GGUF sources need gguf
  out = {}
  for t in tqdm(reader.tensors, desc=f"dequantising {os.path.basename(path)}", unit="tensor"):
    if t.name in _TOP_NAMES:
      name = _TOP_NAMES[t.name]
    else:
      parts = t.name.split(".", 2)
      if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit() or parts[2] not in _LAYER_NAMES:
        raise WeightsError(f"{path}: tensor {t.name!r} is not a parameter of a {cfg.arch} model "
                           "(unknown GGUF tensor name)")
      name = f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}"
    try:
      a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    except Exception as e:
      raise WeightsError(f"{path}: tensor {t.name!r} could not be dequantised ({e})") from None
    expected = tuple(int(x) for x in reversed(t.shape.tolist()))
    if a.size != int(np.prod(expected)):
      raise WeightsError(f"{path}: tensor {t.name!r} holds {a.size} values, not the {expected} its header "
                         "declares (truncated or corrupt file)")
    a = a.reshape(expected)
    check_finite(a, path, t.name)
    if cfg.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
      heads = cfg.num_heads if "q_proj" in name else cfg.num_kv_heads
      a = unpermute_rotary(a, heads)
    out[name] = a
  return out


def check_gguf_tensors(cfg: ModelConfig, tensors: dict[str, np.ndarray], path: str):
  """The converted tensors are exactly those the metadata's config needs, with its shapes."""
  specs = {s.hf_name: s.hf_shape for s in hf_layout(cfg)}
  missing = [n for n in specs if n not in tensors]
  extra = sorted(n for n in tensors if n not in specs)
  if missing or extra:
    which, names = ("is missing", missing) if missing else ("is not used by the model", extra)
    raise WeightsError(f"{path}: tensor {names[0]!r} (HF name) {which} that the GGUF metadata describes "
                       f"({cfg.num_layers} layers; {len(missing)} missing, {len(extra)} unused tensors)")
  for name, shape in specs.items():
    if tensors[name].shape != shape:
      raise WeightsError(f"{path}: tensor {name!r} (HF name) has shape {tensors[name].shape} but the "
                         f"GGUF metadata implies {shape}")


def _cache_key(path: str) -> str:
  """The file's name, its content's sha256 and the converter's version: the same file in another
  install (another venv, a clean clone's) reuses one conversion instead of adding 0.5 GB per place."""
  h = hashlib.sha256(f"v{CONVERTER_VERSION}:".encode())
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  stem = os.path.splitext(os.path.basename(path))[0]
  return f"{stem}-{h.hexdigest()[:12]}"


def conversion_dir(path: str, cache_dir: str | None = None) -> str:
  """Where `convert_gguf` keeps the conversion of the GGUF file as it is now (content, converter)."""
  return os.path.join(cache_dir or os.path.join(cache_root(), "gguf"), _cache_key(path))


def convert_gguf(path: str, cache_dir: str | None = None) -> str:
  """Returns an HF-style directory for the GGUF file, converting it once (atomic rename)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file not found: {path}")
  out_dir = conversion_dir(path, cache_dir)
  if os.path.isfile(os.path.join(out_dir, "COMPLETE")):
    return out_dir
  reader = _open(path)
  try:
    cfg = gguf_config(reader, path)
    tensors = gguf_tensors(reader, cfg, path)
    check_gguf_tensors(cfg, tensors, path)
  except WeightsError:
    raise
  except Exception as e:  # the gguf package raises assorted errors on malformed metadata
    raise WeightsError(f"{path}: corrupt or unsupported GGUF file ({type(e).__name__}: {e})") from None
  os.makedirs(os.path.dirname(out_dir), exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(out_dir))
  try:
    save_tensors(os.path.join(tmp, "model.safetensors"), tensors, {"format": "pt"})
    hf = cfg.to_hf_dict()
    hf.update(bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id", path, default=-1)),
              eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id", path, default=-1)))
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2)
    # lazy: transformers takes ~1-3 s to import; only converting a GGUF's tokenizer needs it here
    from transformers import AutoTokenizer
    try:
      tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                          gguf_file=os.path.basename(path))
    except Exception as e:  # transformers' GGUF tokenizer reader fails deep inside on bad metadata
      raise WeightsError(f"{path}: the GGUF tokenizer could not be read ({type(e).__name__}: {e})") from None
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "COMPLETE"), "w") as f:
      f.write(os.path.abspath(path) + "\n")
    if os.path.isdir(out_dir):  # a stale, incomplete earlier attempt
      shutil.rmtree(out_dir, ignore_errors=True)
    try:
      os.rename(tmp, out_dir)
    except OSError:  # another process finished the same conversion first
      if not os.path.isfile(os.path.join(out_dir, "COMPLETE")):
        raise
      shutil.rmtree(tmp, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out_dir
