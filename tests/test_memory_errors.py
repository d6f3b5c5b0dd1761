"""Where a toy memory goes wrong (evaluation/memory_errors.py), checked on trajectories whose
errors are known by construction: the imperfect memory teacher, and hand-made memories."""

import random

import pytest

import memagent_jax as mj
from memagent_jax.data import toy
from memagent_jax.evaluation import memory_errors as me
from memagent_jax.evaluation.evaluate import score
from memagent_jax.rl.toy_teacher import TEACHERS


@pytest.fixture(scope="module")
def agent():
  policy = mj.load_policy("random:toy-tiny", seed=0)
  return mj.MemAgent(policy, chunk_tokens=toy.CHUNK_TOKENS, memory_tokens=toy.MEMORY_TOKENS,
                     answer_tokens=toy.ANSWER_TOKENS, question_tokens=16, block_chunks=4)


def _sample():
  """A hand-laid document: chunk 0 states oslo=tiger, chunk 1 rome=crab, chunk 2 nothing,
  chunk 3 oslo=zebra (an override)."""
  c = toy.CHUNK_TOKENS
  return {"key": "oslo", "num_tokens": 4 * c, "facts": [["oslo", "tiger"], ["rome", "crab"], ["oslo", "zebra"]],
          "fact_starts": [3, c + 5, 3 * c + 10]}


@pytest.mark.parametrize("memories, correct, kind, chunk", [
    (["the code of oslo is tiger ."] * 3 + ["the code of oslo is zebra ."], True, None, None),
    (["No previous memory", "the code of oslo is tiger .", "the code of oslo is tiger .",
      "the code of oslo is zebra ."], True, "missed_update", 0),  # right answer, wrong memory: 'lucky'
    (["the code of oslo is tiger .", "the code of rome is crab .", "the code of rome is crab .",
      "the code of oslo is zebra ."], True, "distractor_overwrite", 1),
    (["the code of oslo is tiger .", "the code of oslo is tiger .", "the code of oslo is crab .",
      "the code of oslo is crab ."], False, "copy_corruption", 2),
    (["the code of oslo is tiger ."] * 4, False, "missed_update", 3),
    (["the code of oslo is tiger ."] * 3 + ["the code of oslo is zebra ."], False, "answer", 4),
    # any wording that keeps the value is right (RL drifts from the teacher's), a key name too
    (["code code of oslo is tiger .", "the code of rome is crab . the code of oslo is tiger .", "tiger",
      "zebra"], True, None, None),
    (["the code of oslo is tigers ."] * 3 + ["the code of oslo is zebra ."], False, "missed_update", 0),
])
def test_first_error_by_hand(memories, correct, kind, chunk):
  err = me.first_error(_sample(), memories, correct=correct, chunk_tokens=toy.CHUNK_TOKENS)
  if kind is None:
    assert err is None
  else:
    assert (err["kind"], err["chunk"]) == (kind, chunk)


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="3 memories for a document of 4 chunks"):
    me.first_error(_sample(), ["x"] * 3, correct=True, chunk_tokens=toy.CHUNK_TOKENS)
  with pytest.raises(ValueError, match="crosses a chunk boundary of 8"):
    me.chunk_facts(_sample(), 8)
  with pytest.raises(ValueError, match="another task, length or seed"):
    me.error_table([{**_sample(), "index": 0, "question": toy.question("oslo")}],
                   [{"index": 0, "score": 0.0, "memories": ["x"] * 4, "question": toy.question("rome")}],
                   chunk_tokens=toy.CHUNK_TOKENS)
  with pytest.raises(ValueError, match="without 'memories'"):
    me.error_table([{**_sample(), "index": 0}], [{"index": 0, "score": 0.0}], chunk_tokens=toy.CHUNK_TOKENS)


def test_teacher_errors_are_distractor_overwrites_and_counted(agent):
  """The memory teacher always takes the asked key's facts and never corrupts a copy; its only
  errors are overwrites by other keys' facts (probability 0.5 per such chunk)."""
  samples = toy.generate(60, 4 * toy.TRAIN_TOKENS, seed=2)
  rows = []
  for s in samples:
    r = TEACHERS.get("toy_memory")(agent, s["question"], s["context"], rng=random.Random(s["index"]),
                                   overwrite_prob=0.5)
    rows.append({"index": s["index"], "memories": r.memories,
                 "score": score(toy.TASK, r, s["answers"])["score"]})
  table = me.error_table(samples, rows, chunk_tokens=toy.CHUNK_TOKENS)
  wrong = sum(1 - r["score"] for r in rows)
  assert table["documents"] == 60 and table["wrong"] == wrong > 5
  assert table["missed_update"] == table["copy_corruption"] == 0
  # A wrong answer after right memories cannot happen: the teacher answers from its memory.
  assert table["answer"] == 0 and table["distractor_overwrite"] == wrong
  assert 0 < table["mean_relative_chunk"] <= 1
  # per-chunk hazards: the teacher overwrites on a distractor-only chunk with probability 0.5
  (missed, took), (lost, read), (corrupted, copied) = (table["per_chunk"][k] for k in me.CHUNK_KINDS)
  assert missed == corrupted == 0 and took > 60 and copied > 20
  assert lost >= table["distractor_overwrite"] and 0.3 < lost / read < 0.7, (lost, read)


def test_exposures_count_the_chunks_read_while_the_memory_was_right():
  right = ["the code of oslo is tiger ."] * 3 + ["the code of oslo is zebra ."]
  assert me.exposures(_sample(), right, chunk_tokens=toy.CHUNK_TOKENS) == {
      "missed_update": 2, "distractor_overwrite": 1, "copy_corruption": 1}  # chunks 0 and 3, 1, 2
  lost = ["the code of oslo is tiger .", "the code of rome is crab .", "x", "the code of oslo is zebra ."]
  assert me.exposures(_sample(), lost, chunk_tokens=toy.CHUNK_TOKENS) == {
      "missed_update": 1, "distractor_overwrite": 1}  # up to the first wrong chunk, included
  table = me.error_table([{**_sample(), "index": 0}, {**_sample(), "index": 1}],
                         [{"index": 0, "memories": right, "score": 1.0}, {"index": 1, "memories": lost, "score": 1.0}],
                         chunk_tokens=toy.CHUNK_TOKENS)
  assert table["per_chunk"] == {"missed_update": (0, 3), "distractor_overwrite": (1, 2), "copy_corruption": (0, 1)}
  assert table["wrong"] == 0 and table["right_despite_wrong_memory"] == 1
  # chunk 1 (rome, a key questions ask about) read twice, lost once; no chunk of unaskable keys only
  assert table["distractor_split"] == {"other_askable": (1, 2), "unaskable": (0, 0)}
  kyiv = {**_sample(), "facts": [["oslo", "tiger"], ["kyiv", "crab"], ["oslo", "zebra"]]}  # never asked
  rows = [{"index": 0, "memories": right, "score": 1.0}, {"index": 1, "memories": lost, "score": 1.0}]
  table = me.error_table([{**kyiv, "index": 0}, {**kyiv, "index": 1}], rows, chunk_tokens=toy.CHUNK_TOKENS)
  assert table["distractor_split"] == {"other_askable": (0, 0), "unaskable": (1, 2)}
  one_key = [{**_sample(), "index": i, "task": toy.ONE_KEY_TASK} for i in (0, 1)]  # there rome is never asked
  table = me.error_table(one_key, rows, chunk_tokens=toy.CHUNK_TOKENS)
  assert table["distractor_split"] == {"other_askable": (0, 0), "unaskable": (1, 2)}


def test_both_toy_worlds_are_scored_by_exact_match():
  r = type("R", (), {"prediction": "tigers", "answer": "\\boxed{ tigers }"})()
  for task in toy.TASKS:
    assert score(task, r, ["tiger"])["score"] == 0.0  # substring match would give 1


def test_every_known_task_has_a_metric_and_an_unknown_one_is_an_error():
  from memagent_jax.data import tasks
  from memagent_jax.evaluation.evaluate import SCORERS
  assert set(tasks.task_names()) <= set(SCORERS)
  r = type("R", (), {"prediction": "tigers", "answer": "\\boxed{ tigers }"})()
  assert score("squad", r, ["tiger"])["score"] == 1.0  # QA: substring match of a normalised answer
  with pytest.raises(KeyError, match="unknown task metric 'toy_kv_v2'"):
    score("toy_kv_v2", r, ["tigers"])


def _write_teacher_sweeps(agent, tmp_path, seed, lengths, n=12):
  """<tmp_path>/{flawless,flawed}_<length>.jsonl as `toy_analysis sweep` writes them, from the memory teacher
  over the evaluation's own documents (lookup world): never overwriting, or with probability 0.5."""
  import json
  from configs import toy_memagent
  from memagent_jax.data import tasks
  cfg = toy_memagent.get_config("rl,lookup")
  for name, prob in (("flawless", 0.0), ("flawed", 0.5)):
    for length in lengths:
      samples = tasks.make_samples(cfg.data.task, length, n, seed + length, None, chunk_tokens=cfg.agent.chunk_tokens)
      with open(tmp_path / f"{name}_{length}.jsonl", "w") as f:
        for s in samples:
          r = TEACHERS.get("toy_memory")(agent, s["question"], s["context"], rng=random.Random(s["index"]),
                                         overwrite_prob=prob)
          f.write(json.dumps({"index": s["index"], "question": s["question"], "memories": r.memories,
                              "score": score(toy.TASK, r, s["answers"])["score"]}) + "\n")


def test_variants_table_counts_each_policys_errors(agent, tmp_path):
  """experiments/toy_analysis.py variants on two teacher "policies" over the evaluation's own documents: the
  flawless one (never overwrites) scores 100% with no error; the flawed one's overwrites are counted
  per kind, and both land in the table and the PNG."""
  from experiments import toy_analysis
  seed = 1000
  _write_teacher_sweeps(agent, tmp_path, seed, (128, 512))
  policies = {label: toy_analysis.policy_rows(str(tmp_path / label), "lookup", seed) for label in ("flawless", "flawed")}
  assert sorted(policies["flawed"]) == [128, 512] and policies["flawless"][512]["n"] == 12
  assert policies["flawless"][512]["accuracy"] == 1.0 and policies["flawless"][512]["wrong"] == 0
  flawed = policies["flawed"][512]
  lost = sum(flawed["distractor_split"][k][0] for k in ("other_askable", "unaskable"))
  assert flawed["accuracy"] < 1.0 and lost == flawed["per_chunk"]["distractor_overwrite"][0] > 0
  text = toy_analysis.write_variants(policies, "python -m experiments.toy_analysis variants ...", str(tmp_path / "out"))
  row = next(line for line in text.splitlines() if line.startswith("| flawed |"))
  cells = [c.strip() for c in row.split("|")]  # "", label, 1x, 4x, other askable, unaskable, copy, missed, ""
  assert cells[3].startswith(f"{100 * flawed['accuracy']:.1f} [")
  assert sum(int(c.split("/")[0]) for c in cells[4:6]) == lost  # the 4x overwrites, split by key kind
  assert "| flawless | 100.0 [" in text and (tmp_path / "out.png").stat().st_size > 10_000
  with pytest.raises(FileNotFoundError, match="no .*missing_<length>.jsonl"):
    toy_analysis.policy_rows(str(tmp_path / "missing"), "lookup", seed)


def test_distractor_hazards_by_hand():
  """One distractor chunk (chunk 1: rome=crab at offset 5, a quarter into a 4-chunk document), read by
  three memories: lost after the teacher's wording, kept after it, kept after another wording."""
  right = ["the code of oslo is tiger ."] * 3 + ["the code of oslo is zebra ."]
  lost = ["the code of oslo is tiger .", "the code of oslo is crab .", "x", "x"]
  reworded = ["code code of oslo is tiger ."] * 3 + ["zebra"]
  samples = [{**_sample(), "index": i} for i in range(3)]
  rows = [{"index": i, "memories": m, "score": 1.0} for i, m in enumerate((lost, right, reworded))]
  hazards = me.distractor_hazards(samples, rows, chunk_tokens=toy.CHUNK_TOKENS)
  assert hazards == {"last_fact_offset": {"0-15": (1, 3)}, "facts_in_chunk": {"1": (1, 3)},
                     "asked_key": {"oslo": (1, 3)}, "distractor_value": {"crab": (1, 3)},
                     "document_quarter": {"2": (1, 3)},
                     "memory_before": {"other wording": (0, 1), "the teacher's wording": (1, 2)}}
  late = {**_sample(), "index": 0, "fact_starts": [3, 2 * toy.CHUNK_TOKENS - 9, 3 * toy.CHUNK_TOKENS + 10]}
  hazards = me.distractor_hazards([late], rows[:1], chunk_tokens=toy.CHUNK_TOKENS)
  quarter = toy.CHUNK_TOKENS // 4
  assert hazards["last_fact_offset"] == {f"{3 * quarter}-{4 * quarter - 1}": (1, 1)}
  assert me.canonical_memory("the code of oslo is tiger .", "oslo")
  assert not me.canonical_memory("the code of oslo is tiger tiger", "oslo")
  assert not me.canonical_memory("the code of rome is tiger .", "oslo")


def test_hazard_tables_split_every_counted_overwrite(agent, tmp_path):
  """experiments/toy_analysis.py hazards on the teacher "policies": each factor's levels add up to the chunks
  and overwrites error_table counts (values: at least, a chunk may hold two), the flawless one loses
  none, and every factor gets a table and a panel."""
  from experiments import toy_analysis
  seed = 1000
  _write_teacher_sweeps(agent, tmp_path, seed, (512,))
  policies = {label: toy_analysis.policy_hazards(str(tmp_path / label), 512, "lookup", seed)
              for label in ("flawless", "flawed")}
  table = toy_analysis.prefix_rows(str(tmp_path / "flawed"), seed, "lookup")[0]
  lost, read = table["per_chunk"]["distractor_overwrite"]
  assert lost > 0
  for factor, levels in policies["flawed"].items():
    sums = tuple(map(sum, zip(*levels.values())))
    if factor == "distractor_value":
      assert sums[0] >= lost and sums[1] >= read, (factor, sums)
    else:
      assert sums == (lost, read), (factor, sums)
  assert all(v[0] == 0 for levels in policies["flawless"].values() for v in levels.values())
  text = toy_analysis.write_hazards(policies, 4, "python -m experiments.toy_analysis hazards ...", str(tmp_path / "hz"))
  assert all(f"### {title}" in text for title in toy_analysis.FACTOR_TITLES.values())
  assert (tmp_path / "hz.png").stat().st_size > 10_000
  with pytest.raises(FileNotFoundError, match="no .*missing_512.jsonl"):
    toy_analysis.policy_hazards(str(tmp_path / "missing"), 512, "lookup", seed)
