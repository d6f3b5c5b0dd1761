"""Every command in the README's bash blocks runs verbatim on a fresh clone after the set-up:
it names a make target that exists or a program under .venv/bin, its files exist, and its
flags parse (the memagent CLI, config files with their variants and overrides)."""

import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest

from memagent_jax import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PROGRAMS = {"python", "memagent", "tensorboard"}


def readme_commands() -> list[str]:
  text = open(os.path.join(REPO, "README.md")).read()
  blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
  commands = []
  for block in blocks:
    for line in block.splitlines():
      line = line.split("  #")[0].strip()
      if line and not line.startswith("#"):
        commands.append(line)
  return commands


def make_targets() -> set[str]:
  text = open(os.path.join(REPO, "Makefile")).read()
  return set(re.findall(r"^([a-zA-Z0-9_-]+):", text, flags=re.M))


COMMANDS = readme_commands()


def test_readme_has_commands():
  assert len(COMMANDS) >= 10, COMMANDS
  assert COMMANDS[0] == "make demo" and COMMANDS[1] == "make test"


def _programs(command: str) -> list[list[str]]:
  return [shlex.split(part) for part in command.split(" | ")]


def _check_repo_path(token: str):
  path = token.split(":")[0]
  if path.startswith(("experiments/", "configs/", "tests/", "docs/")):
    assert os.path.exists(os.path.join(REPO, path)), f"README names a missing file: {token}"


def _check_config(argv: list[str]):
  """--config=path[:variant] loads, and every --config.a.b=v override names an existing key."""
  spec = next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
  path, _, variant = spec.partition(":")
  module = importlib.import_module(path[:-3].replace("/", "."))
  cfg = module.get_config(variant) if variant else module.get_config()
  for a in argv:
    if a.startswith("--config."):
      key, _ = a[len("--config."):].split("=", 1)
      node = cfg
      for part in key.split("."):
        assert part in node, f"README override {a}: no key {key} in {spec}"
        node = node[part]


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_is_runnable(command):
  for argv in _programs(command):
    prog = argv[0]
    if prog == "cat":
      _check_repo_path(argv[1])
      continue
    if prog == "make":
      assert argv[1] in make_targets(), f"no make target {argv[1]!r}"
      continue
    assert prog.startswith(".venv/bin/") and prog[len(".venv/bin/"):] in VENV_PROGRAMS, (
        f"{command!r} must call a program under .venv/bin (set-up does not activate the venv)")
    for token in argv[1:]:
      _check_repo_path(token.split("=", 1)[-1])
    if prog.endswith("/memagent"):
      cli.build_parser().parse_args(argv[1:])  # SystemExit on an unknown flag or bad value
    elif prog.endswith("/python"):
      assert argv[1] == "-m", f"{command!r}: run scripts as modules (python -m experiments.<name>)"
      module = argv[2].replace(".", "/")
      assert os.path.isfile(os.path.join(REPO, module + ".py")), f"README names a missing module: {argv[2]}"
      if any(a.startswith("--config=") for a in argv):
        _check_config(argv)


@pytest.mark.parametrize("program", sorted(VENV_PROGRAMS))
def test_venv_programs_exist(program):
  """The set-up installs every program the README calls (tensorboard included)."""
  if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(REPO, ".venv")):
    pytest.skip(f"not running in the set-up's .venv (sys.prefix={sys.prefix}): make setup did not run here")
  path = os.path.join(os.path.dirname(sys.executable), program)
  assert os.access(path, os.X_OK), f"{path} is not installed"


def test_sweep_dry_run_prints_commands():
  out = subprocess.run([sys.executable, "-m", "experiments.sweep", "--sweep=configs/sweeps/clip_high.py",
                        "--dry_run"], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert "experiments.train" in out.stdout and "clip_high" in out.stdout


def test_readme_results_are_generated_from_the_result_files():
  """Every table and number in the README's generated blocks is what docs/results' JSON files say now."""
  from experiments import readme_results
  text = open(os.path.join(REPO, "README.md")).read()
  assert all(f"<!-- generated:{name} -->" in text for name in readme_results.BLOCKS)
  assert readme_results.render(text) == text, "run: python -m experiments.readme_results"


def test_readme_generator_follows_its_json(tmp_path):
  """A changed result file changes the rendered block (the check above can fail)."""
  import json
  import shutil
  from experiments import readme_results
  os.makedirs(tmp_path / "docs" / "results")
  src = os.path.join(REPO, "docs", "results", "toy_reproduction_lookup_demo.json")
  shutil.copy(src, tmp_path / "docs" / "results")
  block = "<!-- generated:demo -->\n<!-- /generated:demo -->"
  before = readme_results.render(block, repo=str(tmp_path))
  data = json.load(open(src))
  data["rows"][0]["accuracy"] = 0.123
  json.dump(data, open(tmp_path / "docs" / "results" / "toy_reproduction_lookup_demo.json", "w"))
  after = readme_results.render(block, repo=str(tmp_path))
  assert before != after and "12.3" in after


def test_pod_table_row_is_computed_from_its_compile_report(tmp_path):
  """The README's pod table from a hand-made compile row: peak 12 of 16 GiB is 25% free, a step of 60-90 s
  is 150 x 60 s = 2.5 h to 400 x 90 s = 10 h; a row over 90% of HBM is "tight", one over 100% does not fit."""
  import json
  from experiments import readme_results
  gib = 1024 ** 3
  folder = tmp_path / "docs" / "results" / "tpu_compile_rows"
  os.makedirs(folder)
  program = dict(hbm_share=0.75, step_peak_bytes=12 * gib, fits=True)
  report = {"chips": 8, "programs": {"rollout": program, "answer": dict(program, hbm_share=0.5)},
            "step_wall_s_range": [60.0, 90.0]}
  json.dump(report, open(folder / "qwen3_1.7b_v5e-8.json", "w"))
  block = readme_results.pods(str(tmp_path))
  row = next(line for line in block.splitlines() if "qwen3.py:1.7b" in line)
  assert row == ("| `configs/memagent_qwen3.py:1.7b` | v5e-8 (8 chips) | yes, 25% free | 12.0 GiB (75%, rollout) | "
                 "60-90 | 2.5-10.0 |")
  missing = next(line for line in block.splitlines() if line.startswith("Not compiled yet: "))
  names = missing.removeprefix("Not compiled yet: ").split(" (")[0].split(", ")
  assert "qwen3_4b_v6e-8" in names and "qwen3_1.7b_v5e-8_dapo" in names and "qwen3_1.7b_v5e-8" not in names
  # the DAPO variant: up to its cap of extra generation batches, the worst roofline 180 s at the low MFU 0.5
  dapo = dict(report, regeneration={"step_estimate_worst_s": 180.0}, utilisation_range=[0.5, 0.8])
  json.dump(dapo, open(folder / "qwen3_1.7b_v5e-8_dapo.json", "w"))
  row = next(line for line in readme_results.pods(str(tmp_path)).splitlines() if "qwen3.py:1.7b,dapo" in line)
  assert row.endswith("| 60-360 | 2.5-40.0 |")
  program.update(hbm_share=0.95)
  json.dump(report, open(folder / "qwen3_1.7b_v5e-8.json", "w"))
  assert "| tight, 5% free |" in readme_results.pods(str(tmp_path))
  program.update(hbm_share=1.2, fits=False)
  report["step_wall_s_range"] = None
  json.dump(report, open(folder / "qwen3_1.7b_v5e-8.json", "w"))
  assert "| no | 12.0 GiB (120%, rollout) | - | - |" in readme_results.pods(str(tmp_path))
  report["step_estimate_s"] = 444.4  # a chip without a published MFU (TPU7x): the roofline, named as such
  json.dump(report, open(folder / "qwen3_1.7b_v5e-8.json", "w"))
  assert "| roofline 444 (no published MFU) | - |" in readme_results.pods(str(tmp_path))


def test_released_7b_sentence_is_computed_from_its_compile_rows(tmp_path):
  import json
  from experiments import readme_results
  gib = 1024 ** 3
  folder = tmp_path / "docs" / "results" / "tpu_compile_rows"
  os.makedirs(folder)
  assert "not all compiled yet" in readme_results.released_7b(str(tmp_path))
  rows = (("7b_v5p-64", 25, 33, 16, True), ("7b_v5p-64_unrolled", 90, 100, 16, False),
          ("7b_v5p-64_no_lhs", 10, 20, 16, False), ("7b_v5p-64_mb32", 80, 91, 32, False))
  for name, temp, peak, micro, scanned in rows:
    update = dict(temp_bytes=temp * gib, step_peak_bytes=peak * gib, fits=peak <= 95, hbm_share=peak / 95)
    json.dump({"hbm_bytes_per_chip": 95 * gib, "model": {"source": "qwen2.5-7b-instruct", "scan_layers": scanned},
               "shapes": {"micro_batches": micro}, "programs": {"update": update}}, open(folder / f"{name}.json", "w"))
  text = readme_results.released_7b(str(tmp_path))
  assert text.startswith("**The released 7B fits v5p-64:** its update's step peak is 33.0 GiB per chip of 95 "
                         "(35%; 25.0 GiB of temporaries) with the training forwards' layers scanned")
  assert "one `lax.scan` over 27 of the 28 layers' stacked weights" in text
  assert "Unrolled, the same update needed 100.0 GiB, 90.0 GiB of it temporaries" in text
  assert "its temporaries without that scheduler 10.0 GiB" in text
  assert "32 micro-batches instead of 16: still 91.0 GiB" in text
  update = dict(temp_bytes=99 * gib, step_peak_bytes=106 * gib, fits=False, hbm_share=106 / 95)
  json.dump({"hbm_bytes_per_chip": 95 * gib, "model": {"source": "qwen2.5-7b-instruct", "scan_layers": True},
             "shapes": {"micro_batches": 16}, "programs": {"update": update}}, open(folder / "7b_v5p-64.json", "w"))
  assert readme_results.released_7b(str(tmp_path)).startswith(
      "**The released 7B does not fit v5p-64 as the trainer compiles it today:** its update's step peak is 106.0")


def test_gated_block_is_computed_from_its_result(tmp_path):
  """The README's gated table from a hand-made make-gated result: per seed and length, both accuracies,
  decoded tokens and seconds per document, the keep share; the full scale wins over the demo one."""
  import json
  from experiments import readme_results
  folder = tmp_path / "docs" / "results"
  os.makedirs(folder)
  row = lambda length, acc, tokens, seconds, keep=None: dict(
      length=length, n=200, accuracy=acc, seconds_per_doc=seconds,
      reading=dict(decoded_tokens_per_doc=tokens, **({} if keep is None else {"keep_frac": keep})))
  result = {"scale": "demo", "commit": "abc", "runs": [
      {"seed": 0, "memory": "overwrite", "rows": [row(128, 0.74, 40.0, 0.02), row(512, 0.43, 136.0, 0.06)]},
      {"seed": 0, "memory": "gated", "rows": [row(128, 0.80, 20.0, 0.015, 0.5), row(512, 0.50, 50.0, 0.03, 0.75)]}]}
  json.dump(result, open(folder / "toy_gated_demo.json", "w"))
  block = readme_results.gated(str(tmp_path))
  assert "| 0 | 4x | 43.0 | 50.0 | 136 -> 50 | 0.060 -> 0.030 | 75% |" in block
  assert "Scale demo" in block and "commit abc" in block
  result["scale"] = "full"
  result["runs"][1]["rows"][1]["accuracy"] = 0.61
  full = dict(result, runs=result["runs"][:1])  # a full make gated still running: only its overwrite run
  json.dump(full, open(folder / "toy_gated.json", "w"))
  assert "Scale demo" in readme_results.gated(str(tmp_path))  # the demo's table, not an empty full one
  json.dump(result, open(folder / "toy_gated.json", "w"))
  block = readme_results.gated(str(tmp_path))
  assert "| 0 | 4x | 43.0 | 61.0 |" in block and "Scale full" in block and "n = 200 per point" in block
