"""experiments/benchmarks/bench_gpu.py --smoke: the four GPU benchmark sections run on CPU at tiny shapes and write
markdown tables holding numbers (cuDNN rows say n/a), never touching docs/results/gpu.md."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PYTHON = os.path.join(REPO, ".venv", "bin", "python")
PYTHON = VENV_PYTHON if os.path.exists(VENV_PYTHON) else sys.executable
DEFAULT_OUT = os.path.join(REPO, "docs", "results", "gpu.md")
CPU_ENV = dict(os.environ, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")  # the smoke on any machine: CPU


def run_bench(*args, timeout=300):
  return subprocess.run([PYTHON, "-m", "experiments.benchmarks.bench_gpu", *args], cwd=REPO, env=CPU_ENV,
                        capture_output=True, text=True, timeout=timeout)


def is_number(cell: str) -> bool:
  return re.fullmatch(r"-?[\d,]*\.?\d+(e[-+]?\d+)?x?", cell) is not None


def tables(text: str) -> dict[str, list[dict[str, str]]]:
  """'## title' -> the rows of the first markdown table under it, as {column: cell}."""
  out = {}
  for part in re.split(r"^## ", text, flags=re.M)[1:]:
    title, body = part.split("\n", 1)
    lines = [ln for ln in body.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    assert len(cells) >= 3 and set(lines[1]) <= set("|-"), f"section {title!r} has no table:\n{body}"
    out[title] = [dict(zip(cells[0], row)) for row in cells[2:]]
  return out


def mtime(path):
  return os.path.getmtime(path) if os.path.exists(path) else None


@pytest.mark.slow
def test_smoke_writes_every_section_with_numbers(tmp_path):
  out = tmp_path / "gpu_smoke.md"
  before = mtime(DEFAULT_OUT)
  # one timed call per case (the smoke's default is 2): the tables need a number, not a median
  proc = run_bench("--smoke", "--repeats=1", f"--out={out}")
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert mtime(DEFAULT_OUT) == before  # a smoke run never writes the real results
  text = out.read_text()
  assert f"Command: `python -m experiments.benchmarks.bench_gpu --smoke --repeats=1 --out={out}`" in text
  t = tables(text)
  assert [k.split(".")[0] for k in t] == ["1", "2", "3", "4"], list(t)
  attn, update, decode, rl = t.values()

  assert len(attn) == 6  # 2 shapes x (attend xla, attend cudnn, jax.nn cudnn)
  for row in attn:
    if row["implementation"] == "attend xla":
      assert is_number(row["ms fwd+bwd"]) and float(row["ms fwd+bwd"]) > 0, row
      assert is_number(row["TFLOP/s"]), row
    else:
      assert row["ms fwd+bwd"] == "n/a on cpu", row

  assert [r["stack"] for r in update] == ["memagent_jax update_step", "PyTorch + transformers (cpu)"]
  for row in update:
    for col in ("s / update", "tokens/s", "time vs ours"):
      assert is_number(row[col]), (col, row)
    assert float(row["tokens/s"].replace(",", "")) > 0
    assert row["MFU % (spec)"] == "n/a"  # no peak FLOP/s on a CPU
  assert is_number(update[0]["GiB"]) and update[0]["time vs ours"] == "1.00"

  assert [(r["implementation"], r["B"]) for r in decode] == [
      ("memagent_jax sampler", "1"), ("HF generate (cpu)", "1"), ("memagent_jax sampler", "8"),
      ("HF generate (cpu)", "8")]
  for row in decode:
    assert is_number(row["tokens/s"]) and float(row["tokens/s"].replace(",", "")) > 0, row
    assert row["HBM limit tokens/s"] == "n/a"

  assert [r["step"] for r in rl] == ["1", "2"]
  for row in rl:
    for col in ("rollout s", "logprobs s", "update s", "step s", "updates", "rollout tokens/s", "update tokens/s"):
      assert is_number(row[col]), (col, row)
    assert float(row["rollout s"]) > 0 and float(row["update s"]) > 0
    assert float(row["step s"]) >= float(row["rollout s"])
    assert int(row["updates"]) >= 1


def test_smoke_refuses_the_real_results_path():
  before = mtime(DEFAULT_OUT)
  proc = run_bench("--smoke", "--out=docs/results/gpu.md", timeout=120)
  assert proc.returncode != 0 and "must not overwrite" in proc.stderr
  assert mtime(DEFAULT_OUT) == before
