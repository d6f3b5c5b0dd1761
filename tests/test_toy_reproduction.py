"""The toy reproduction pipeline end to end at a tiny scale, its determinism, and the notebook."""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = ["-m", "experiments.toy_reproduction"]
TINY = ["--scale=demo", "--steps=pretrain=2,warm_start=3,rl=2,full_attention=3", "--n=6", "--max_multiple=2"]


def _run(args, cwd, xla_cache):
  # every run of this module shares one persistent compile cache: the reruns below compile
  # (almost) nothing, and the compiled programs are the same with or without it
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_COMPILATION_CACHE_DIR": str(xla_cache),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  out = subprocess.run([sys.executable, *SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  root = tmp_path_factory.mktemp("toy")
  stdout = _run([*TINY, f"--workdir={root}/run"], cwd=root, xla_cache=root / "xla_cache")
  return root, stdout


@pytest.mark.slow
def test_pipeline_writes_table_plot_logs_and_checkpoints(run):
  root, stdout = run
  res = root / "run" / "results"
  for name in ("toy_reproduction_demo.md", "toy_reproduction_demo.png", "toy_reproduction_demo.json"):
    assert (res / name).is_file() and (res / name).stat().st_size > 200, name
    assert str(res / name) in stdout  # the script says where everything is
  for stage in ("pretrain", "warm_start", "rl", "full_attention"):
    assert (root / "run" / stage / "export" / "config.json").is_file()
    assert (root / "run" / stage / "logs" / "metrics.jsonl").is_file()
    assert any((root / "run" / stage / "logs" / "tensorboard").iterdir())
  assert "TensorBoard" in stdout and "Checkpoints" in stdout
  table = json.load(open(res / "toy_reproduction_demo.json"))
  rows = table["rows"]
  assert {(r["method"], r["length"]) for r in rows} == {(m, l) for m in ("rl", "warm_start", "full_attention")
                                                        for l in (128, 256)}
  for r in rows:
    assert r["n"] == 6 and 0 <= r["ci_low"] <= r["accuracy"] <= r["ci_high"] <= 1
    assert r["seconds_per_doc"] > 0 and r["peak_rss_mib"] > 50
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
  root, _ = run
  res = root / "run" / "results" / "toy_reproduction_demo.json"
  rows_before = json.load(open(res))["rows"]
  before = {(r["method"], r["length"]): r["accuracy"] for r in rows_before}
  kept = sorted((root / "run" / "eval").glob("*.row.json"))  # one per finished (method, length)
  assert len(kept) == 6
  # a rerun resumes after every finished length: the very same rows, measured times included
  _run([*TINY, f"--workdir={root}/run", "--stages=eval"], cwd=root, xla_cache=root / "xla_cache")
  assert json.load(open(res))["rows"] == rows_before
  # evaluating again for real gives the same accuracies: test_a_fresh_rerun_trains_and_scores_identically
  # retrains and re-scores every row from the same seeds
  kept[0].unlink()  # one finished length lost: only it is evaluated again, the same
  _run([*TINY, f"--workdir={root}/run", "--stages=eval"], cwd=root, xla_cache=root / "xla_cache")
  assert len(list((root / "run" / "eval").glob("*.row.json"))) == 6
  after = {(r["method"], r["length"]): r["accuracy"] for r in json.load(open(res))["rows"]}
  assert after == before


@pytest.mark.slow
def test_a_fresh_rerun_trains_and_scores_identically(run, tmp_path):
  """Same seeds, new workdir: every stage retrained from scratch gives the same losses and table. The
  rerun is serial (--eval_workers=1: every stage and sweep in one process, in TRAIN_STAGES order), so
  the side process the first run trained full attention and swept the baselines in changes nothing."""
  from memagent_jax.rl.metrics import read_jsonl
  root, stdout = run
  assert "full_attention: trained in a side process" in stdout
  again = _run([*TINY, f"--workdir={tmp_path}/again", "--fresh", "--eval_workers=1"], cwd=tmp_path,
               xla_cache=root / "xla_cache")
  assert "side process" not in again
  steps = lambda d: [(k, v["steps"]) for k, v in json.load(open(f"{d}/stages.json")).items()]
  assert steps(tmp_path / "again") == steps(root / "run")  # the same stages, in the same order
  acc = lambda d: {(r["method"], r["length"]): r["accuracy"]
                   for r in json.load(open(f"{d}/results/toy_reproduction_demo.json"))["rows"]}
  assert acc(tmp_path / "again") == acc(root / "run")
  for stage in ("pretrain", "warm_start", "rl", "full_attention"):
    losses = lambda d: [l.get("train/loss") for l in read_jsonl(f"{d}/{stage}/logs/metrics.jsonl")]
    assert losses(tmp_path / "again") == losses(root / "run"), stage


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(run):
  import nbformat
  from nbclient import NotebookClient
  root, _ = run
  path = os.path.join(REPO, "experiments", "notebooks", "memagent_quickstart.ipynb")
  nb = nbformat.read(path, as_version=4)
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
       cwd=tmp_path, xla_cache=tmp_path / "xla_cache")
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


@pytest.mark.slow
def test_side_by_side_sweeps_give_the_rows_of_sequential_ones(tmp_path):
  """evaluate(workers=2) runs each method's sweep in its own processes (the longest length apart): the
  same rows (accuracy, n, length), in length order, as one after the other, marked with how many ran at once."""
  from experiments import toy_reproduction
  for stage in ("rl", "warm_start"):  # the committed base stands in for both trained policies
    shutil.copytree(BASE, tmp_path / "run" / stage / "export")
  rows = {}
  run = toy_reproduction.ToyRun(scale="demo", root=str(tmp_path / "run"), world="lookup", n=6, max_multiple=2)
  for workers in (1, 2):
    shutil.rmtree(tmp_path / "run" / "eval", ignore_errors=True)  # nothing read back from the other run
    rows[workers] = toy_reproduction.evaluate(run, trained=["warm_start", "rl"], workers=workers)
  strip = lambda rs: [(r.method, r.length, r.n, r.accuracy) for r in rs]
  assert strip(rows[2]) == strip(rows[1])
  assert [r.method for r in rows[2]] == ["rl", "rl", "warm_start", "warm_start"]
  assert all(r.concurrent_sweeps == 2 for r in rows[2]) and rows[1][0].concurrent_sweeps == 1
  # one method alone (a seed run sweeps RL only) still runs its two tasks side by side
  shutil.rmtree(tmp_path / "run" / "eval")
  alone = toy_reproduction.evaluate(run, trained=["rl"], workers=2)
  assert strip(alone) == strip(rows[1])[:2] and all(r.concurrent_sweeps == 2 for r in alone)


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
  distractors, then mixed ones, then mixed with late facts), its warm start and the demo's RL on the
  warm start's documents; the one-key world needs no sentence."""
  from experiments import toy_report
  full = toy_report._training_documents("lookup", "full")
  demo = toy_report._training_documents("lookup", "demo")
  assert "warm_start on 1x documents generated with num_distractors=3;" in full
  assert ("rl on 1x documents generated with, in turn, steps 1-200 distractor_keys=askable, num_distractors=3; "
          "steps 201-300 distractor_keys=mixed, num_distractors=3; steps 301-400 distractor_keys=mixed, "
          "late_fact_share=1.0, num_distractors=3;") in full
  assert "askable" not in demo and "rl on 1x documents generated with num_distractors=3;" in demo
  assert toy_report._training_documents("one_key", "full") == ""
