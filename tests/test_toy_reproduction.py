"""The toy reproduction pipeline end to end at a tiny scale, its determinism, and the notebook."""

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = ["-m", "experiments.toy_reproduction"]
# one step per stage: each stage starts from an earlier one's export, so one step's update still reaches every
# later stage and sweep (a demo RL step samples 192 rows: a second one cost 10 s)
TINY = ["--scale=demo", "--steps=pretrain=1,warm_start=1,rl=1,full_attention=1", "--n=6", "--max_multiple=2"]


def _run(args, cwd, xla_cache=None):
  # every run shares the test session's persistent compile cache (tests/conftest.py; xla_cache: a
  # folder of the run's own), keeping every program, however quick to compile: the runs below have
  # the shapes of the first, so they compile nothing (compiled programs are the same with or without it)
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  if xla_cache is not None:
    env["JAX_COMPILATION_CACHE_DIR"] = str(xla_cache)
  out = subprocess.run([sys.executable, *SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


def _rows(results_json):
  return json.load(open(results_json))["rows"]


def _scores(rows):
  """What a sweep measured of each row, in the rows' order (not its time or memory)."""
  return [(r["method"], r["length"], r["n"], r["accuracy"]) for r in rows]


def _answers(eval_dir):
  """Every per-document answer file of a run's sweeps (question, answer, every memory), by name."""
  return {p.name: p.read_text() for p in sorted(pathlib.Path(eval_dir).glob("*.jsonl"))}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """make demo's pipeline, tiny, as make demo runs it (--eval_workers=2, the default): full attention
  trained in a side process beside the warm start and RL, every method swept in a process of its own, a
  MemAgent method's longest length apart; its programs go into the cache every later run here loads them
  from. rows and answers: its table rows and per-document answers as it wrote them (a test below rewrites
  some)."""
  root = tmp_path_factory.mktemp("toy")
  stdout = _run([*TINY, f"--workdir={root}/run"], cwd=root)
  return types.SimpleNamespace(root=root, stdout=stdout, answers=_answers(root / "run" / "eval"),
                               rows=_rows(root / "run" / "results" / "toy_reproduction_demo.json"))


@pytest.mark.slow
def test_pipeline_writes_table_plot_logs_and_checkpoints(run):
  root, stdout = run.root, run.stdout
  res = root / "run" / "results"
  for name in ("toy_reproduction_demo.md", "toy_reproduction_demo.png", "toy_reproduction_demo.json"):
    assert (res / name).is_file() and (res / name).stat().st_size > 200, name
    assert str(res / name) in stdout  # the script says where everything is
  for stage in ("pretrain", "warm_start", "rl", "full_attention"):
    assert (root / "run" / stage / "export" / "config.json").is_file()
    assert (root / "run" / stage / "logs" / "metrics.jsonl").is_file()
    assert any((root / "run" / stage / "logs" / "tensorboard").iterdir())
  assert "TensorBoard" in stdout and "Checkpoints" in stdout
  assert "full_attention: trained in a side process" in stdout
  steps = {k: v["steps"] for k, v in json.load(open(root / "run" / "stages.json")).items()}
  assert steps == {"pretrain": 1, "warm_start": 1, "rl": 1, "full_attention": 1}
  rows = run.rows
  assert [(r["method"], r["length"]) for r in rows] == [(m, l) for m in ("rl", "warm_start", "full_attention")
                                                        for l in (128, 256)]
  for r in rows:
    assert r["n"] == 6 and 0 <= r["ci_low"] <= r["accuracy"] <= r["ci_high"] <= 1
    assert r["seconds_per_doc"] > 0 and r["peak_rss_mib"] > 50
    assert r["concurrent_sweeps"] == 2  # side by side
  assert len(list((root / "run" / "eval").glob("*.row.json"))) == 6  # one kept per finished (method, length)
  md = open(res / "toy_reproduction_demo.md").read()
  assert "| 256 | 2x |" in md and "RL-MemAgent" in md and "peak RSS" in md
  errors = open(res / "memory_errors_demo.md").read()  # first wrong chunk of each wrong document, by kind
  assert str(res / "memory_errors_demo.md") in stdout
  for stage in ("rl", "warm_start"):
    rows = [line for line in errors.split(f", {stage} (")[1].splitlines() if line.startswith("| 128 |")
            or line.startswith("| 256 |")][:2]
    assert len(rows) == 2 and all(int(line.split("|")[3]) == 6 for line in rows)  # 6 documents per length


@pytest.mark.slow
def test_rerunning_the_evaluation_gives_the_same_accuracies(run):
  """A rerun resumes after every finished length: the very same rows, measured times included, read
  back; the lengths whose rows were lost are evaluated again, and only they, here one sweep after another
  (--eval_workers=1): the same accuracies from the very same per-document answers as the side-by-side
  sweeps gave, for a MemAgent method (RL) and for full attention. (That a fresh run trains identically
  from the same seeds, in other processes: test_save_faults' and test_data_parallel_training's bit-exact
  comparisons.)"""
  root = run.root
  res = root / "run" / "results" / "toy_reproduction_demo.json"
  kept = sorted((root / "run" / "eval").glob("*.row.json"))  # one per finished (method, length)
  lost = [p for p in kept if p.name.startswith(("rl_", "full_attention_"))]
  others = [p for p in kept if p not in lost]
  assert len(lost) == 4 and len(others) == 2, [p.name for p in kept]
  untouched = {p.name: p.stat().st_mtime_ns for p in others}
  for p in lost:
    p.unlink()
  out = _run([*TINY, f"--workdir={root}/run", "--stages=eval", "--eval_workers=1"], cwd=root)
  assert "side process" not in out  # every sweep in this process
  rows = _rows(res)
  name = lambda r: f"{r['method']}_{r['length']}.row.json"
  relost = {p.name for p in lost}
  assert [r for r in rows if name(r) not in relost] == [r for r in run.rows if name(r) not in relost]
  assert {p.name: p.stat().st_mtime_ns for p in others} == untouched  # read back, not measured again
  assert all(p.is_file() for p in lost)  # measured again, and kept
  assert [r["concurrent_sweeps"] for r in rows if name(r) in relost] == [1] * 4
  assert _scores(rows) == _scores(run.rows)  # serial sweeps score as the side-by-side ones
  assert _answers(root / "run" / "eval") == run.answers


@pytest.mark.slow
def test_seed_run_trains_from_the_perturbed_warm_start_and_sweeps_rl_only(run, tmp_path):
  """A seed run end to end (make seeds' flags: --base, --stages=warm_start,rl,eval, --eval_methods=rl,
  --seed, --perturb; one process here), from `run`'s pretrained base at its tiny shapes, so nothing
  compiles again: RL's stage records seed and perturbation, only RL is swept, its results stay in the
  workdir, and the report names the seed and the perturbation. (Sweeps side by side give the serial rows
  and answers: test_rerunning_the_evaluation_gives_the_same_accuracies; RL alone split into two tasks:
  test_memagent_sweeps_split_their_longest_length_into_its_own_task.)"""
  work = tmp_path / "s"
  seed_run = ["--scale=demo", f"--base={run.root}/run/pretrain/export", "--steps=warm_start=1,rl=1", "--n=6",
              "--max_multiple=2", "--eval_methods=rl", "--seed=3", "--perturb=1e-6", f"--workdir={work}",
              f"--results_dir={work}/results"]
  _run([*seed_run, "--stages=warm_start,rl,eval", "--eval_workers=1"], cwd=tmp_path)
  stages = json.load(open(work / "stages.json"))
  assert stages["rl"]["seed"] == 3 and stages["rl"]["perturb"] == 1e-6 and stages["warm_start"]["seed"] == 3
  assert (work / "warm_start" / "export_perturbed_1e-06" / "model.safetensors").is_file()
  report = json.load(open(work / "results" / "toy_reproduction_demo.json"))
  assert {r["method"] for r in report["rows"]} == {"rl"} and report["seed"] == 3
  md = open(work / "results" / "toy_reproduction_demo.md").read()
  assert "training data 3" in md and "1 + 1e-06 N(0, 1)" in md
  assert "warm_start" not in open(work / "results" / "memory_errors_demo.md").read()
  assert [r["method"] for r in report["rows"]] == ["rl", "rl"]
  assert all(r["concurrent_sweeps"] == 1 for r in report["rows"])


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(run):
  import nbformat
  from nbclient import NotebookClient
  root = run.root
  path = os.path.join(REPO, "experiments", "notebooks", "memagent_quickstart.ipynb")
  nb = nbformat.read(path, as_version=4)
  # every cell as written, its accuracy sweep on 6 documents at 1x and 2x, the shapes `run` swept, so its
  # programs come from the session's compile cache (the notebook's own: 16 at 1x..8x, most of this test's
  # time, for numbers nothing here reads)
  sweep = [c for c in nb.cells if "N, MULTIPLES = 16, (1, 2, 4, 8)" in c.source]
  assert len(sweep) == 1
  sweep[0].source = sweep[0].source.replace("N, MULTIPLES = 16, (1, 2, 4, 8)", "N, MULTIPLES = 6, (1, 2)")
  os.environ["MEMAGENT_TOY_RUN"] = str(root / "run")
  try:
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(path)}}).execute()
  finally:
    del os.environ["MEMAGENT_TOY_RUN"]
  text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
  assert "memory:" in text and "final answer:" in text
  assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


BASE = os.path.join(REPO, "experiments", "data", "toy_base_lookup")
DEMO_WARM_START = os.path.join(REPO, "experiments", "data", "toy_warm_start_lookup_demo")  # make demo's


def test_committed_lookup_base_looks_facts_up_by_key():
  """The base `make demo` starts from answers held-out pretraining rows (a text with facts about
  several askable keys, then the question, plain text as the toy_recall teacher writes them) by
  matching the question's key, beyond the shortcut "latest askable key's fact" that an earlier base
  learnt. A broken or shortcut checkpoint fails here."""
  import re
  import memagent_jax as mj
  from configs import toy_memagent
  from memagent_jax.data import toy
  from memagent_jax.experiment.assembly import sample_pool
  from memagent_jax.policy.decode_spec import GREEDY
  assert json.load(open(os.path.join(BASE, "base.json")))["world"] == "lookup"
  cfg = toy_memagent.get_config("pretrain,lookup")
  policy = mj.load_policy(BASE)
  tok = policy.tokenizer
  samples = sample_pool(cfg.data, chunk_tokens=cfg.agent.chunk_tokens, size=128, seed=777, length=cfg.data.length,
                        tokenizer=tok)
  assert len({s["key"] for s in samples}) == 8  # all eight askable keys asked
  prompts = [tok.encode(s["context"]) + tok.encode(s["question"]) for s in samples]  # the teacher's rows
  out = policy.sample(prompts, 8, params=GREEDY)
  said = [re.findall(r"boxed\{ (\w+) \}", tok.decode(row[:n])) for row, n in zip(out.tokens, out.lengths)]
  right = sum(w == [s["answers"][0]] for w, s in zip(said, samples)) / len(samples)
  shortcut = sum([v for k, v in s["facts"] if k in toy.ASKED_KEYS][-1] == s["answers"][0] for s in samples) / len(samples)
  assert shortcut < 0.5 and right >= 0.9, (right, shortcut)


def test_base_flag_makes_the_committed_base_the_pretrain_stage(tmp_path):
  """--base: the pretrain stage is the committed export, byte for byte, not retrained (warm_start and
  full_attention start from <workdir>/pretrain/export, as the pipeline test checks for a trained one)."""
  _run(["--scale=demo", "--world=lookup", f"--base={BASE}", f"--workdir={tmp_path}/b", "--stages=pretrain"],
       cwd=tmp_path)
  stages = json.load(open(tmp_path / "b" / "stages.json"))
  assert stages["pretrain"]["base"] == BASE and stages["pretrain"]["steps"] == 800
  assert not (tmp_path / "b" / "pretrain" / "checkpoints").exists()  # not retrained
  for name in os.listdir(BASE):
    with open(tmp_path / "b" / "pretrain" / "export" / name, "rb") as a, open(os.path.join(BASE, name), "rb") as b:
      assert a.read() == b.read(), name


def test_base_of_another_world_or_an_incomplete_one_is_refused(tmp_path):
  from experiments import toy_reproduction
  with pytest.raises(ValueError, match="trained for world 'lookup', this run is --world=one_key"):
    toy_reproduction.use_base(BASE, str(tmp_path / "run"), "one_key")
  (tmp_path / "partial").mkdir()
  (tmp_path / "partial" / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="is not a pretrain export.*model.safetensors, base.json"):
    toy_reproduction.use_base(str(tmp_path / "partial"), str(tmp_path / "run"), "lookup")
  assert not (tmp_path / "run").exists()  # nothing copied before the checks pass


def test_committed_demo_warm_start_is_checked_and_copied_in(tmp_path):
  """--warm_start takes a warm_start export of this world and scale (make demo's committed one) and
  refuses a base, another world or another scale before copying anything."""
  from experiments import toy_reproduction
  with pytest.raises(ValueError, match="is a pretrain export, not a warm_start one"):
    toy_reproduction.use_export("warm_start", BASE, str(tmp_path / "run"), "lookup", "demo")
  with pytest.raises(ValueError, match="trained at scale 'demo', this run is --scale=full"):
    toy_reproduction.use_export("warm_start", DEMO_WARM_START, str(tmp_path / "run"), "lookup", "full")
  assert not (tmp_path / "run").exists()
  info = toy_reproduction.use_export("warm_start", DEMO_WARM_START, str(tmp_path / "run"), "lookup", "demo")
  assert info["steps"] == 270 and info["base"] == DEMO_WARM_START
  assert os.path.isfile(tmp_path / "run" / "warm_start" / "export" / "model.safetensors")


def test_eval_sweeps_only_the_trained_stages(tmp_path):
  """make demo trains no full-attention baseline: the sweep skips it instead of failing on a missing export."""
  from experiments import toy_reproduction
  swept = []
  run = toy_reproduction.ToyRun(scale="demo", root=str(tmp_path), world="lookup", n=4, max_multiple=2)
  toy_reproduction.evaluate(run, trained=["pretrain", "warm_start", "rl"],
                            sweep=lambda stage, run, lengths, **kw: swept.append((stage, lengths)) or [])
  assert swept == [("rl", [128, 256]), ("warm_start", [128, 256])]


def test_memagent_sweeps_split_their_longest_length_into_its_own_task():
  """Side by side, a MemAgent method's longest length (as costly as all shorter ones together) runs
  beside the rest; full attention and a one-process evaluation keep one task."""
  from experiments.toy_reproduction import sweep_parts
  lengths = [128, 256, 512, 1024]
  assert sweep_parts("rl", lengths, 2) == [[1024], [128, 256, 512]]
  assert sweep_parts("warm_start", lengths, 2) == [[1024], [128, 256, 512]]
  assert sweep_parts("full_attention", lengths, 2) == [lengths]
  assert sweep_parts("rl", lengths, 1) == [lengths] and sweep_parts("rl", [128], 2) == [[128]]


def test_toy_sweep_reports_accuracy_and_per_chunk_rates(tmp_path):
  """experiments/toy_analysis.py sweep on the committed base: one line per length with the Wilson interval and
  the per-chunk rates, and the per-document answers with every memory."""
  env = {**os.environ, "PYTHONPATH": REPO}
  out = subprocess.run([sys.executable, "-m", "experiments.toy_analysis", "sweep", f"--export={BASE}",
                        "--name=base", "--multiples=1,2", "--n=4", f"--out_dir={tmp_path}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = [line for line in out.stdout.splitlines() if line.startswith("base ")]
  assert [line.split(":")[0] for line in lines] == ["base 1x", "base 2x"]
  assert all("% [" in line and "missed_update" in line and "overwrite by other_askable" in line for line in lines)
  answers = [json.loads(line) for line in open(tmp_path / "base_256.jsonl")]
  assert len(answers) == 4 and all(len(a["memories"]) == 4 for a in answers)  # 256 tokens = 4 chunks


def test_report_names_each_stage_training_documents():
  """The report says which stage trained on which documents: full-scale RL's curriculum (askable-key
  distractors, then mixed ones, then mixed with late facts, then eight mixed ones at chunk ends), its warm start and the demo's RL on the
  warm start's documents; the one-key world needs no sentence."""
  from experiments import toy_report
  full = toy_report._training_documents("lookup", "full")
  demo = toy_report._training_documents("lookup", "demo")
  assert "warm_start on 1x documents generated with num_distractors=3;" in full
  assert ("rl on 1x documents generated with, in turn, steps 1-200 distractor_keys=askable, num_distractors=3; "
          "steps 201-300 distractor_keys=mixed, num_distractors=3; steps 301-400 distractor_keys=mixed, "
          "late_fact_share=1.0, num_distractors=3; steps 401-550 distractor_keys=mixed, late_fact_share=1.0, "
          "num_distractors=8;") in full
  assert "askable" not in demo and "rl on 1x documents generated with num_distractors=3;" in demo
  assert toy_report._training_documents("one_key", "full") == ""
