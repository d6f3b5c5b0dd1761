"""The seed-robustness runs (experiments/toy_seeds.py) and the toy reproduction's --seed / --perturb (a seed
run end to end: tests/test_toy_reproduction.py, from its pipeline run's base at its shapes)."""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from memagent_jax.evaluation.length_sweep import SweepRow
from memagent_jax.models import safetensors_io
from test_toy_reproduction import BASE, REPO


def _rows(accs, lengths=(128, 256, 512)):
  return [SweepRow(method="rl", length=l, n=200, accuracy=a / 100, ci_low=a / 100 - 0.03,
                   ci_high=min(1, a / 100 + 0.02), seconds_per_doc=0.01, peak_rss_mib=700.0, doc_tokens=float(l))
          for l, a in zip(lengths, accs)]


def test_verdict_measures_the_drop_below_each_runs_own_1x():
  from experiments import toy_seeds
  assert toy_seeds.verdict(_rows([99.0, 97.0, 94.0])) == (5.0, True)
  assert toy_seeds.verdict(_rows([99.0, 99.5, 93.5])) == (5.5, False)
  assert toy_seeds.verdict(_rows([90.0, 95.0, 92.0])) == (0.0, True)  # above 1x is no drop


def test_five_runs_each_with_its_own_workdir_and_results(monkeypatch):
  """Seed 0 is make reproduce's run; the others never write docs/results or sweep other methods; the
  fifth runs seed 0 with two forced host devices, and only it changes the environment."""
  from experiments import toy_seeds
  runs = toy_seeds.runs("runs/x")
  assert [(r["seed"], r["perturb"]) for r in runs] == [(0, 0.0), (0, 1e-6), (1, 0.0), (2, 0.0), (0, 0.0)]
  assert runs[0]["workdir"] == "runs/toy_full_lookup" and len({r["workdir"] for r in runs}) == 5
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
  for run in runs[:4]:
    assert toy_seeds.run_environment(run)["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
  assert toy_seeds.run_environment(runs[4])["XLA_FLAGS"] == (
      "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2")
  assert toy_seeds.shown_command(runs[4]).startswith("XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m")
  assert toy_seeds.shown_command(runs[1]).startswith("python -m experiments.toy_reproduction")
  for run in runs:
    cmd = toy_seeds.command(run)
    assert f"--results_dir={run['workdir']}/results" in cmd and "--eval_methods=rl" in cmd
    assert f"--seed={run['seed']}" in cmd and "--scale=full" in cmd
  assert "--perturb=1e-06" in toy_seeds.command(runs[1])


def test_table_marks_a_run_that_falls(tmp_path):
  from experiments import toy_seeds
  runs = toy_seeds.runs(str(tmp_path))
  results = [(runs[0], dict(rows=_rows([99.0, 98.0, 96.0]), minutes=None, commit=None)),
             (runs[2], dict(rows=_rows([99.0, 92.0, 95.0]), minutes=24.5, commit="abc123"))]
  text = toy_seeds.markdown(results, ["cmd a", "cmd b"])
  lines = [line for line in text.splitlines() if line.startswith("| seed")]
  assert lines[0] == ("| seed 0 (make reproduce) | 99.0 [96, 100] | 98.0 [95, 100] | 96.0 [93, 98] | 3.0 | yes | - "
                      "| - |")
  assert lines[1].endswith("| 7.0 | **no** | 24.5 | abc123 |")
  assert "| run | 1x | 2x | 4x |" in text


def test_perturbed_export_moves_every_float_weight_by_about_the_asked_amount(tmp_path):
  from experiments import toy_reproduction
  with pytest.raises(FileNotFoundError, match="no warm-start export"):
    toy_reproduction.perturbed_export(str(tmp_path), 1e-6)
  shutil.copytree(BASE, tmp_path / "warm_start" / "export")
  path = toy_reproduction.perturbed_export(str(tmp_path), 1e-6)
  assert path == str(tmp_path / "warm_start" / "export_perturbed_1e-06")
  before = safetensors_io.load_tensors(os.path.join(BASE, "model.safetensors"))
  after = safetensors_io.load_tensors(os.path.join(path, "model.safetensors"))
  assert before.keys() == after.keys()
  for name, a in before.items():
    b = after[name]
    assert b.dtype == a.dtype and b.shape == a.shape
    rel = np.abs(b.astype(np.float64) - a) / np.maximum(np.abs(a), 1e-30)
    assert rel.max() < 1e-5 and (a == 0).sum() == (b == 0).sum(), name
    if a.size > 1000:  # a large matrix: most weights move, by about 1e-6 of themselves
      moved = rel[a != 0]
      assert 0.5e-6 < np.median(moved) < 1.5e-6, (name, np.median(moved))
  for name in os.listdir(BASE):
    if name != "model.safetensors":
      assert open(os.path.join(path, name), "rb").read() == open(os.path.join(BASE, name), "rb").read()
  stamp = os.path.getmtime(os.path.join(path, "model.safetensors"))
  assert toy_reproduction.perturbed_export(str(tmp_path), 1e-6) == path  # made once, then reused
  assert os.path.getmtime(os.path.join(path, "model.safetensors")) == stamp


def test_seed_reaches_every_trained_stage_and_perturb_rls_source(tmp_path):
  from experiments import toy_reproduction
  run = toy_reproduction.ToyRun(scale="full", root=str(tmp_path), world="lookup", n=1, max_multiple=1)
  for stage in ("warm_start", "rl", "full_attention"):
    cfg = toy_reproduction.stage_config(stage, dataclasses.replace(run, seed=2))
    assert cfg.train.seed == 2 and cfg.data.seed == 2, stage
  assert toy_reproduction.stage_config("rl", run).model.source.endswith("warm_start/export")
  shutil.copytree(BASE, tmp_path / "warm_start" / "export")
  cfg = toy_reproduction.stage_config("rl", dataclasses.replace(run, perturb=1e-6))
  assert cfg.model.source == str(tmp_path / "warm_start" / "export_perturbed_1e-06")


def test_table_and_plot_hold_the_runs_finished_so_far(tmp_path, monkeypatch):
  """A stopped `make seeds` leaves a table of the runs it finished; unfinished ones are left out. A
  finished run's record, committed, counts as finished on a machine without its workdir; seed 0 without
  its workdir is make reproduce's committed result; a result of another recipe counts for nothing."""
  from experiments import toy_report, toy_seeds
  monkeypatch.setattr(toy_seeds, "REPRODUCE_ROOT", str(tmp_path / "seed0"))
  monkeypatch.setattr(toy_seeds, "REPRODUCE_RESULT", str(tmp_path / "reproduce.json"))
  finished = str(tmp_path / "finished")
  runs = toy_seeds.runs(str(tmp_path))
  out = str(tmp_path / "res" / "seeds")
  toy_seeds.write_table(runs, ["a", "b", "c", "d", "e"], out, finished=finished)  # none finished (a new recipe)
  assert json.load(open(out + ".json"))["runs"] == [] and "No run of the current recipe" in open(out + ".md").read()
  for run, accs in ((runs[0], [99.0, 98.0, 97.0]), (runs[2], [99.5, 93.0, 99.0])):
    os.makedirs(os.path.join(run["workdir"], "results"))
    rows = [r.to_json() for r in _rows(accs) + [dataclasses.replace(_rows([50.0])[0], method="warm_start")]]  # ignored
    with open(os.path.join(run["workdir"], "results", toy_report.report_name("full", "lookup") + ".json"), "w") as f:
      json.dump({"rows": rows, "minutes": 12.0 if run is runs[2] else None, "recipe": toy_report.reproduce_recipe()}, f)
  toy_seeds.write_table(runs, ["a", "b", "c", "d", "e"], out, finished=finished)
  text = open(out + ".md").read()
  assert [line.split(" |")[0] for line in text.splitlines() if line.startswith("| seed")] == [
      "| seed 0 (make reproduce)", "| seed 1"]
  assert "| 6.5 | **no** | 12.0 |" in text and "![RL-MemAgent across seeds](seeds.png)" in text
  assert os.path.getsize(out + ".png") > 1000
  # seed 1's record kept, its workdir gone (another machine): still finished, with its minutes and commit
  toy_seeds.keep_record(runs[2], "c", 12.0, finished=finished)
  shutil.rmtree(runs[2]["workdir"])
  record = json.load(open(os.path.join(finished, "seed1.json")))
  assert record["label"] == "seed 1" and record["minutes"] == 12.0 and len(record["rows"]) == 3
  assert [r.accuracy for r in toy_seeds.finished_run(runs[2], finished)["rows"]] == [0.995, 0.93, 0.99]
  # seed 0's workdir gone: make reproduce's committed result stands for it
  shutil.rmtree(runs[0]["workdir"])
  assert toy_seeds.finished_run(runs[0], finished) is None
  result = {"rows": [r.to_json() for r in _rows([99.0, 98.0, 97.0])], "minutes": 147.3, "commit": "b8afd27"}
  for recipe in (None, "0123456789ab"):  # written before recipes were recorded / by another recipe
    with open(tmp_path / "reproduce.json", "w") as f:
      json.dump({**result, **({"recipe": recipe} if recipe else {})}, f)
    assert toy_seeds.finished_run(runs[0], finished) is None
  with open(tmp_path / "reproduce.json", "w") as f:
    json.dump({**result, "recipe": toy_report.reproduce_recipe()}, f)
  done = toy_seeds.finished_run(runs[0], finished)
  assert done["minutes"] == 147.3 and done["commit"] == "b8afd27" and done["source"] == str(tmp_path / "reproduce.json")
  assert toy_seeds.finished_run(runs[3], finished) is None  # seed 2: neither workdir nor record


def test_imports_beside_other_scripts_with_flags_of_the_same_names():
  """Its --out, --root, --dry_run are defined only when it runs as a script: importing it beside
  experiments.sweep (--root, --dry_run) and profile_step (--out), as one pytest worker does, defines
  nothing twice; so for bench_length_sweep (--n) beside toy_reproduction."""
  import importlib
  for name in ("experiments.sweep", "experiments.benchmarks.profile_step", "experiments.toy_seeds",
               "experiments.toy_reproduction", "experiments.benchmarks.bench_length_sweep",
               "experiments.benchmarks.tpu_compile_table", "experiments.readme_results"):
    importlib.import_module(name)


def test_gated_sweep_reuses_make_seeds_overwrite_runs_and_records_its_own(tmp_path, monkeypatch):
  """make gated at full scale: overwrite seed s is make seeds' run of seed s (seed 0 make reproduce's), not run
  again; a gated run's result counts only with the gated recipe's digest, and its committed record stands for
  it where its workdir is gone. At demo scale every run is its own."""
  from experiments import toy_gated, toy_report, toy_seeds
  monkeypatch.setattr(toy_seeds, "REPRODUCE_ROOT", str(tmp_path / "seed0"))
  monkeypatch.setattr(toy_seeds, "REPRODUCE_RESULT", str(tmp_path / "reproduce.json"))
  monkeypatch.setattr(toy_seeds, "FINISHED", str(tmp_path / "seed_records"))
  finished = str(tmp_path / "gated_records")
  runs = toy_gated.runs(str(tmp_path / "gated"), [0, 1])
  assert [(r["memory"], r["seed"], "seeds_run" in r) for r in runs] == [
      ("overwrite", 0, True), ("gated", 0, False), ("overwrite", 1, True), ("gated", 1, False)]
  assert toy_gated.command(runs[0], "full") == toy_seeds.command(toy_seeds.runs("runs/toy_seeds_lookup")[0])
  assert "--memory=gated" in toy_gated.command(runs[1], "full")
  assert not any("seeds_run" in r for r in toy_gated.runs("x", [0, 1], "demo"))
  with open(tmp_path / "reproduce.json", "w") as f:  # make reproduce's committed result: seed 0's overwrite run
    json.dump({"rows": [r.to_json() for r in _rows([99.0, 98.0, 97.0])], "minutes": 52.4,
               "recipe": toy_report.reproduce_recipe()}, f)
  assert [r.accuracy for r in toy_gated.finished_rows(runs[0], "full", finished)[0]] == [0.99, 0.98, 0.97]
  assert toy_gated.finished_rows(runs[2], "full", finished) is None  # seed 1: make seeds has not run it here
  gated = runs[1]
  os.makedirs(os.path.join(gated["workdir"], "results"))
  for recipe, counts in ((toy_report.reproduce_recipe(), False), (toy_gated.run_recipe(gated, "full"), True)):
    with open(toy_gated.result_path(gated, "full"), "w") as f:
      json.dump({"rows": [r.to_json() for r in _rows([90.0, 80.0, 70.0])], "minutes": 30.0, "recipe": recipe}, f)
    assert (toy_gated.finished_rows(gated, "full", finished) is not None) == counts
  assert toy_gated.run_recipe(gated, "full") != toy_report.reproduce_recipe()
  toy_gated.keep_record(gated, "full", "cmd", 31.0, finished=finished)
  shutil.rmtree(gated["workdir"])
  rows, minutes = toy_gated.finished_rows(gated, "full", finished)
  assert [r.accuracy for r in rows] == [0.9, 0.8, 0.7] and minutes == 31.0
  assert json.load(open(os.path.join(finished, "gated_seed0.json")))["recipe"] == toy_gated.run_recipe(gated, "full")


def test_gated_page_says_where_gating_loses(tmp_path):
  """The first-error table beside overwrite (or '-' where its answers are gone), and the sentence on the
  longest length, from each run's first errors; a run without per-document answers has none."""
  from experiments import toy_gated
  e = lambda wrong, missed, distractor: {"wrong": wrong, "missed_update": missed, "distractor_overwrite": distractor,
                                         "copy_corruption": 0, "answer": wrong - missed - distractor}
  errors = {(0, "overwrite"): {"128": e(1, 1, 0), "256": e(2, 1, 1)}, (0, "gated"): {"128": e(0, 0, 0), "256": e(5, 1, 4)},
            (1, "overwrite"): None, (1, "gated"): {"128": e(3, 0, 3), "256": e(9, 2, 6)}}
  text = "\n".join(toy_gated.errors_markdown(errors))
  assert "| 0 | 256 (2x) | 2 / 5 | 1 / 1 | 1 / 4 | 0 / 0 | 0 / 0 |" in text
  assert "| 1 | 128 (1x) | - / 3 | - / 0 | - / 3 | - / 0 | - / 0 |" in text
  assert ("At the longest length (256 tokens), gated seed 0: 4 of its 5 wrong documents first went wrong at a "
          "distractor overwrite, 1 at a missed update; seed 1: 6 of its 9") in text
  assert toy_gated.errors_markdown({(0, "gated"): None}) == []
  assert toy_gated.first_errors(str(tmp_path)) is None  # no eval/rl_<length>.jsonl there


def test_a_later_setting_at_its_no_op_value_leaves_the_recipe(monkeypatch):
  """toy_report.LATER_SETTINGS: the overwrite recipe's digest is the one its committed results carry (made
  before rl.gate_rewards.evidence existed); the same setting at any other value is another recipe."""
  from configs import toy_memagent
  from experiments import toy_report
  committed = json.load(open(os.path.join(REPO, "docs", "results", "toy_reproduction_lookup.json")))["recipe"]
  assert toy_report.reproduce_recipe() == committed
  make = toy_memagent.get_config

  def weighted(variant):
    c = make(variant)
    c.rl.gate_rewards.evidence = 0.5
    return c
  monkeypatch.setattr(toy_memagent, "get_config", weighted)
  assert toy_report.reproduce_recipe() != committed


def test_gated_page_names_the_rl_signals_its_config_sets(monkeypatch):
  from configs import toy_memagent
  from experiments import toy_gated
  assert toy_gated.gated_rl_signals("full") == (
      "Its RL adds gate terms to the final reward (rl/gate_signals.py): evidence x 0.5 (+1 on a turn that writes "
      "from a chunk holding the answer or keeps past a chunk without it, -1 on the other two); advantages turn_mix, "
      "turn weight 0.5.")
  make = toy_memagent.get_config

  def final_reward_only(variant):
    c = make(variant)
    c.rl.gate_rewards.evidence = 0.0
    c.rl.advantage_mode = "trajectory"
    return c
  def gate_groups(variant):
    c = make(variant)
    c.rl.dynamic_sampling_filter = "score_or_gates"
    return c
  monkeypatch.setattr(toy_memagent, "get_config", gate_groups)
  assert toy_gated.gated_rl_signals("full").endswith(
      "turn weight 0.5. Dynamic sampling keeps a group whose answers all scored the same when its gate terms differ.")
  monkeypatch.setattr(toy_memagent, "get_config", final_reward_only)
  assert toy_gated.gated_rl_signals("demo") == "Its RL has the final reward alone; advantages trajectory."
