"""TFDS builders for RULER-style tasks and long-document QA, written as array_record.

No TensorFlow is needed: tfds serializes examples with its own vendored
`tf.train.Example` protos and numpy feature encoders, array_record writes the shards,
and `as_data_source()` / `tfds.data_source` decode records with numpy. The file
format must be array_record (tfds' default tfrecord writer needs TensorFlow); these
builders default to it, and passing it explicitly does no harm:

  b = Ruler(config="niah_single_1_8k", data_dir=d, file_format="array_record")
  b.download_and_prepare(file_format="array_record")
  source = b.as_data_source()["test"]
  source = tfds.data_source("memagent_ruler/niah_single_1_8k", data_dir=d)["test"]  # same

Token counting (RULER lengths) uses the embedded SmolLM2 tokenizer by default; the
config field `tokenizer` takes any model source `load_tokenizer` accepts, or
"whitespace" for a model-free count.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core import utils as tfds_utils

from memagent_jax.data import longqa, ruler, toy
from memagent_jax.data.tokens import WHITESPACE, as_counter, whitespace_count
from memagent_jax.policy.loading import EMBEDDED_DEFAULT, load_tokenizer

ARRAY_RECORD = "array_record"
RULER_LENGTHS_K = (4, 8, 16, 32, 64, 128, 256, 512)  # RULER / MemAgent test lengths (x1024)
LONGQA_NUM_DOCS = (50, 100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600)


class _LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Builder base that works without TensorFlow out of the box.

  - array_record is the default file format (tfds defaults to tfrecord, whose writer
    is `tf.io.TFRecordWriter`), so `tfds.data_source(name)` can prepare data itself.
  - tfds 4.9.10 resolves `code_path` of a builder inside an installed package through
    `importlib_resources`, which it only declares for Python < 3.9: use this file.
  """

  def __init__(self, *, file_format: str | None = None, **kwargs):
    super().__init__(file_format=file_format or ARRAY_RECORD, **kwargs)

  @tfds_utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)


def _sample_features(**extra) -> tfds.features.FeaturesDict:
  """Every task's question / context / answers, plus its own metadata fields."""
  return tfds.features.FeaturesDict({
      "question": tfds.features.Text(),
      "context": tfds.features.Text(),
      "answers": tfds.features.Sequence(tfds.features.Text()),
      **extra,
  })


def counter_from_name(name: str):
  """'whitespace' or a model source that `load_tokenizer` accepts -> a `str -> int` counter."""
  return whitespace_count if name == WHITESPACE else as_counter(load_tokenizer(name))


@dataclasses.dataclass(eq=False)
class RulerConfig(tfds.core.BuilderConfig):
  """One (task, length) set; name it e.g. `niah_single_1_8k`."""
  task: str = "niah_single_1"
  length: int = 8192  # context token budget
  num_samples: int = 128
  seed: int = 0
  tokenizer: str = EMBEDDED_DEFAULT  # model source for load_tokenizer, or "whitespace"


class Ruler(_LocalBuilder):
  """RULER-style synthetic long-context tasks (single `test` split)."""

  name = "memagent_ruler"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [
      RulerConfig(name=f"{task}_{k}k", task=task, length=k * 1024,
                  description=f"{task}, {k}K-token contexts")
      for task in ruler.TASKS for k in RULER_LENGTHS_K
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    # DatasetInfo directly: dataset_info_from_configs would read metadata files next to
    # this module, which a builder living inside a package does not have.
    return tfds.core.DatasetInfo(
        builder=self,
        description="RULER-style synthetic tasks (arXiv 2404.06654) fitted to a token length.",
        features=_sample_features(task=tfds.features.Text(), length=np.int64, num_tokens=np.int64,
                                  seed=np.int64, index=np.int64),
        homepage="https://github.com/NVIDIA/RULER",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # synthetic: nothing to download
    return {"test": self._generate_examples()}

  def _generate_examples(self):
    cfg = self.builder_config
    counter = counter_from_name(cfg.tokenizer)
    for i in range(cfg.num_samples):
      s = ruler.generate_one(cfg.task, cfg.length, cfg.seed, i, counter)
      yield i, {k: s[k] for k in ("question", "context", "answers", "task", "length",
                                  "num_tokens", "seed", "index")}


@dataclasses.dataclass(eq=False)
class LongQAConfig(tfds.core.BuilderConfig):
  """A corpus padded to `num_docs` documents per question; name it e.g. `hotpotqa_200`."""
  corpus: str = "hotpotqa"  # "hotpotqa" | "squad"
  num_docs: int = 200
  seed: int = 0
  max_examples: int = 0  # per split; 0 = all (MemAgent tests on 128 dev questions)


# corpus -> split -> file name expected in manual_dir
LONGQA_FILES = {
    "squad": {"train": "train-v1.1.json", "validation": "dev-v1.1.json"},
    "hotpotqa": {"train": "hotpot_train_v1.1.json",
                 "validation": "hotpot_dev_distractor_v1.json"},
}
_LOADERS = {"squad": longqa.load_squad, "hotpotqa": longqa.load_hotpotqa}


class LongQA(_LocalBuilder):
  """MemAgent long-document QA from SQuAD / HotpotQA JSON found in `manual_dir`."""

  name = "memagent_long_qa"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put the original JSON files in `manual_dir` (any subset of splits):
    SQuAD v1.1 (https://rajpurkar.github.io/SQuAD-explorer/): train-v1.1.json, dev-v1.1.json
    HotpotQA (https://hotpotqa.github.io/): hotpot_train_v1.1.json,
      hotpot_dev_distractor_v1.json
  and pass `download_config=tfds.download.DownloadConfig(manual_dir=...)`.
  """
  BUILDER_CONFIGS = [
      LongQAConfig(name=f"{corpus}_{n}", corpus=corpus, num_docs=n,
                   description=f"{corpus} questions padded to {n} documents")
      for corpus in LONGQA_FILES for n in LONGQA_NUM_DOCS
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="Questions hidden among many paragraphs, rendered as 'Document {i}:' blocks.",
        features=_sample_features(id=tfds.features.Text(), num_docs=np.int64, index=np.int64),
        homepage="https://arxiv.org/abs/2507.02259",
    )

  def _split_generators(self, dl_manager):
    cfg = self.builder_config
    if cfg.corpus not in LONGQA_FILES:
      raise ValueError(f"unknown corpus {cfg.corpus!r}; known: {', '.join(LONGQA_FILES)}")
    manual = os.fspath(dl_manager.manual_dir)
    splits = {split: os.path.join(manual, f) for split, f in LONGQA_FILES[cfg.corpus].items()
              if os.path.isfile(os.path.join(manual, f))}
    if not splits:
      raise FileNotFoundError(f"no {cfg.corpus} file in {manual}; expected one of "
                              f"{sorted(LONGQA_FILES[cfg.corpus].values())}."
                              f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return {split: self._generate_examples(path) for split, path in splits.items()}

  def _generate_examples(self, path: str):
    cfg = self.builder_config
    corpus = _LOADERS[cfg.corpus](path)
    examples = corpus.examples[:cfg.max_examples or None]
    for s in longqa.iter_long_qa(examples, cfg.num_docs, cfg.seed, pool=corpus.pool):
      yield s["index"], s


TOY_MULTIPLES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the toy reproduction's lengths, x TRAIN_TOKENS


@dataclasses.dataclass(eq=False)
class ToyKVConfig(tfds.core.BuilderConfig):
  """One toy-world length; name it e.g. `x16` (16 x the training length of 128 toy tokens)."""
  length: int = toy.TRAIN_TOKENS  # document length in toy (word) tokens
  num_samples: int = 200
  seed: int = 0
  chunk_tokens: int = toy.CHUNK_TOKENS  # facts never cross a chunk of this size


class ToyKV(_LocalBuilder):
  """The toy memory world (memagent_jax.data.toy): key-value facts, distractors and overrides
  in filler, lengths in toy tokens (one per space-separated item)."""

  name = "memagent_toy_kv"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [ToyKVConfig(name=f"x{m}", length=m * toy.TRAIN_TOKENS,
                                 description=f"{m * toy.TRAIN_TOKENS}-token documents") for m in TOY_MULTIPLES]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="Synthetic key-value memory task for CPU-scale MemAgent experiments.",
        features=_sample_features(key=tfds.features.Text(), num_tokens=np.int64, num_overrides=np.int64,
                                  num_distractors=np.int64, seed=np.int64, index=np.int64),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # synthetic: nothing to download
    return {"test": self._generate_examples()}

  def _generate_examples(self):
    cfg = self.builder_config
    for s in toy.generate(cfg.num_samples, cfg.length, cfg.seed,
                          makeup=toy.Makeup(chunk_tokens=cfg.chunk_tokens)):
      yield s["index"], {k: s[k] for k in ("question", "context", "answers", "key", "num_tokens",
                                           "num_overrides", "num_distractors", "seed", "index")}


BUILDERS = {b.name: b for b in (Ruler, LongQA, ToyKV)}


def prepared_source(name: str, *, split: str, data_dir: str, manual_dir: str = ""):
  """The random-access array_record source of `name` ('<builder>/<config>', e.g. 'memagent_long_qa/
  squad_200'), prepared into `data_dir` on first use (QA corpora from the JSON in `manual_dir`).

  This is the training data path for corpora too large to hold as a list: grain reads records
  lazily from it, and every host of a pod reads the same prepared files."""
  builder_name, _, config = name.partition("/")
  if builder_name not in BUILDERS or not config:
    raise ValueError(f"data.tfds={name!r}: expected '<builder>/<config>' with builder one of {sorted(BUILDERS)}")
  cls = BUILDERS[builder_name]
  if config not in cls.builder_configs:
    raise ValueError(f"data.tfds={name!r}: unknown config {config!r} of {builder_name}; known: "
                     f"{', '.join(sorted(cls.builder_configs))}")
  builder = cls(config=config, data_dir=data_dir)
  download = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
  builder.download_and_prepare(download_config=download)
  splits = builder.as_data_source()
  if split not in splits:
    raise ValueError(f"data.tfds={name!r} has no split {split!r} (prepared in {data_dir}); it has "
                     f"{sorted(splits)}")
  return splits[split]
