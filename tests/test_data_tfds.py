"""TFDS builders to array_record without TensorFlow, read back and fed through grain."""

import json
import os
import sys

import pytest
import tensorflow_datasets as tfds

from memagent_jax.data import longqa, pipeline, ruler
from memagent_jax.experiment import tfds_builders as tb
from memagent_jax.policy.loading import load_tokenizer

SQUAD_DIR = os.path.join(os.path.dirname(__file__), "data", "squad_sample")
N = 6


@pytest.fixture(scope="module")
def ruler_dir(tmp_path_factory):
  """A tiny RULER set (embedded tokenizer, the builder's default) prepared as array_record."""
  data_dir = tmp_path_factory.mktemp("tfds")
  cfg = tb.RulerConfig(name="niah_multivalue_tiny", task="niah_multivalue", length=1024,
                       num_samples=N, seed=5)
  builder = tb.Ruler(config=cfg, data_dir=str(data_dir))  # array_record is the default
  builder.download_and_prepare()
  return str(data_dir)


@pytest.fixture(scope="module")
def source(ruler_dir):
  return tfds.data_source("memagent_ruler/niah_multivalue_tiny", data_dir=ruler_dir)["test"]


def test_written_as_array_record_without_tensorflow(ruler_dir):
  # This venv has no TensorFlow at all; where it is installed, it must still not be imported.
  assert "tensorflow" not in sys.modules
  files = os.listdir(os.path.join(ruler_dir, "memagent_ruler", "niah_multivalue_tiny", "1.0.0"))
  assert any(".array_record-" in f for f in files), files
  assert not any("tfrecord" in f for f in files)


def test_records_equal_the_generator(source):
  assert len(source) == N
  records = sorted((pipeline.to_python(source[i]) for i in range(N)), key=lambda r: r["index"])
  expected = ruler.generate("niah_multivalue", 1024, n=N, seed=5, tokenizer=load_tokenizer())
  for r, e in zip(records, expected):
    assert isinstance(r["context"], str) and isinstance(r["answers"][0], str)
    for k in ("question", "context", "answers", "task", "length", "num_tokens", "seed", "index"):
      assert r[k] == e[k], k


def test_builder_configs_registered():
  names = {c.name for c in tb.Ruler.BUILDER_CONFIGS}
  assert len(names) == len(ruler.TASKS) * len(tb.RULER_LENGTHS_K)
  assert {"niah_single_1_8k", "vt_128k", "fwe_512k"} <= names
  assert tb.Ruler.builder_configs["niah_single_1_8k"].length == 8192
  assert "hotpotqa_200" in {c.name for c in tb.LongQA.BUILDER_CONFIGS}
  registered = set(tfds.list_builders(with_community_datasets=False))
  assert {"memagent_ruler", "memagent_long_qa"} <= registered


def test_grain_pipeline_epochs_and_determinism(source):
  batches = list(pipeline.make_iterator(source, batch_size=4, seed=0, num_epochs=2))
  assert [len(b["index"]) for b in batches] == [4, 2, 4, 2]  # batches never straddle epochs
  epoch1 = batches[0]["index"] + batches[1]["index"]
  epoch2 = batches[2]["index"] + batches[3]["index"]
  assert sorted(epoch1) == sorted(epoch2) == list(range(N))
  assert epoch1 != epoch2  # reshuffled each epoch
  assert all(isinstance(q, str) for b in batches for q in b["question"])
  assert all(isinstance(a, list) and isinstance(a[0], str) for b in batches for a in b["answers"])
  again = list(pipeline.make_iterator(source, batch_size=4, seed=0, num_epochs=2))
  assert again == batches
  other = [b["index"] for b in pipeline.make_iterator(source, batch_size=4, seed=1, num_epochs=2)]
  assert other != [b["index"] for b in batches]


def test_resume_from_saved_state(source):
  it = pipeline.make_iterator(source, batch_size=2, seed=3, num_epochs=3)
  for _ in range(4):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
  rest = list(it)
  resumed = pipeline.make_iterator(source, batch_size=2, seed=3, num_epochs=3)
  resumed.set_state(state)
  assert next(resumed) == rest[0]
  assert list(resumed) == rest[1:] and len(rest) == 9 - 4


def test_pipeline_over_a_list_and_sharding():
  data = [{"question": f"q{i}".encode(), "n": i} for i in range(10)]
  shard0 = [x for b in pipeline.make_iterator(data, 3, seed=0, shard_index=0, shard_count=2)
            for x in b["n"]]
  shard1 = [x for b in pipeline.make_iterator(data, 3, seed=0, shard_index=1, shard_count=2)
            for x in b["n"]]
  assert sorted(shard0 + shard1) == list(range(10)) and not set(shard0) & set(shard1)
  ordered = list(pipeline.make_iterator(data, 4, shuffle=False, drop_remainder=True))
  assert [b["n"] for b in ordered] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert ordered[0]["question"][0] == "q0"
  with pytest.raises(ValueError, match="empty"):
    pipeline.make_dataset([], 2)


def test_long_qa_from_manual_dir(tmp_path):
  cfg = tb.LongQAConfig(name="squad_tiny", corpus="squad", num_docs=8, max_examples=5)
  builder = tb.LongQA(config=cfg, data_dir=str(tmp_path), file_format="array_record")
  builder.download_and_prepare(file_format="array_record",
                               download_config=tfds.download.DownloadConfig(manual_dir=SQUAD_DIR))
  splits = builder.as_data_source()
  assert set(splits) == {"train"}  # only the files present in manual_dir become splits
  records = sorted((pipeline.to_python(r) for r in splits["train"]), key=lambda r: r["index"])
  corpus = longqa.load_squad(os.path.join(SQUAD_DIR, "train-v1.1.json"))
  expected = longqa.build_long_qa(corpus.examples[:5], 8, seed=0, pool=corpus.pool)
  assert [r["context"] for r in records] == [e["context"] for e in expected]
  assert all(r["context"].count("Document ") == 8 and r["num_docs"] == 8 for r in records)

  empty = tmp_path / "manual"
  empty.mkdir()
  (empty / "README.txt").write_text("not the data")
  other = tb.LongQA(config=tb.LongQAConfig(name="hotpotqa_tiny", corpus="hotpotqa", num_docs=5),
                    data_dir=str(tmp_path), file_format="array_record")
  with pytest.raises(FileNotFoundError, match="hotpot_train_v1.1.json"):
    other.download_and_prepare(file_format="array_record",
                               download_config=tfds.download.DownloadConfig(manual_dir=str(empty)))


def test_toy_builder_writes_the_generator_samples(tmp_path):
  from memagent_jax.data import toy
  cfg = tb.ToyKVConfig(name="toy_tiny", length=256, num_samples=4, seed=3)
  tb.ToyKV(config=cfg, data_dir=str(tmp_path)).download_and_prepare()
  src = tfds.data_source("memagent_toy_kv/toy_tiny", data_dir=str(tmp_path))["test"]
  records = sorted((pipeline.to_python(src[i]) for i in range(len(src))), key=lambda r: r["index"])
  expected = toy.generate(4, 256, seed=3)
  assert len(records) == 4
  for r, e in zip(records, expected):
    for k in ("question", "context", "answers", "key", "num_tokens", "num_overrides", "index"):
      assert r[k] == e[k], k
  assert tb.ToyKV.builder_configs["x256"].length == 256 * toy.TRAIN_TOKENS


def test_prepared_source_by_name(tmp_path):
  """The training data path: '<builder>/<config>' prepared on first use, then read back."""
  src = tb.prepared_source("memagent_toy_kv/x1", split="test", data_dir=str(tmp_path))
  from memagent_jax.data import toy
  first = sorted((pipeline.to_python(src[i]) for i in range(3)), key=lambda r: r["index"])
  expected = {e["index"]: e for e in toy.generate(200, toy.TRAIN_TOKENS, seed=0)}
  assert all(r["context"] == expected[r["index"]]["context"] for r in first)
  with pytest.raises(ValueError, match="builder one of"):
    tb.prepared_source("nope/x1", split="test", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="unknown config 'x3'"):
    tb.prepared_source("memagent_toy_kv/x3", split="test", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="no split 'train'"):
    tb.prepared_source("memagent_toy_kv/x1", split="train", data_dir=str(tmp_path))


def test_question_batch_is_what_a_rollout_step_draws():
  """The training iterator's batches are typed (question, context, answers), their state still grain's."""
  from memagent_jax.data.tasks import QuestionBatch
  samples = [{"question": f"q{i}", "context": f"doc {i}", "answers": [f"a{i}", "alt"], "index": i} for i in range(6)]
  ds = pipeline.make_dataset(samples, 2, seed=0, num_epochs=None, drop_remainder=True)
  it = pipeline.iterate(ds.map(QuestionBatch.from_columns))
  first = next(it)
  assert isinstance(first, QuestionBatch) and len(first) == 2
  assert all(q.replace("q", "doc ") == c for q, c in zip(first.question, first.context))
  assert all(a[1] == "alt" and a[0] == "a" + q[1:] for q, a in zip(first.question, first.answers))
  state = it.get_state()
  again = pipeline.iterate(ds.map(QuestionBatch.from_columns))
  again.set_state(state)
  assert next(again) == next(it)  # resumes at the same batch
  assert QuestionBatch.of(samples[:2]) == QuestionBatch(question=("q0", "q1"), context=("doc 0", "doc 1"),
                                                        answers=(("a0", "alt"), ("a1", "alt")))
  with pytest.raises(ValueError, match="one context and one answer list per question"):
    QuestionBatch(question=("q",), context=(), answers=((),))
