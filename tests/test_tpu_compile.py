"""`memagent compile`: the tiny model's RL step compiled for compile-only TPU devices (libtpu, no TPU),
its report's numbers checked against what the shapes imply, and its errors."""

import json
import re

import jax
import pytest

from memagent_jax import cli
from memagent_jax.experiment import compile_report
from memagent_jax.models.config import ModelConfig, get_preset
from memagent_jax.runtime import tpu_targets

TINY = "configs/toy_cpu.py:tiny"


@pytest.fixture(autouse=True)
def programs_as_users_compile_them():
  """The TPU programs at JAX's default matmul precision, as `memagent compile` runs them: conftest's "highest"
  (for comparisons against float32 references) would make every TPU float32 matmul a six-pass bfloat16
  product, and the compiles about twice as slow."""
  before = jax.config.jax_default_matmul_precision
  jax.config.update("jax_default_matmul_precision", None)  # global: the programs compile on other threads
  yield
  jax.config.update("jax_default_matmul_precision", before)


def test_topology_names_resolve_as_pod_users_write_them():
  t = tpu_targets.parse_topology("v5p-64")
  assert (t.desc, t.chips, t.chip.name) == ("v5p:2x4x4", 32, "v5p")
  assert tpu_targets.parse_topology("v5e-256").desc == "v5e:16x16"
  assert tpu_targets.parse_topology("v6e-8").desc == "v6e:2x4"
  assert tpu_targets.parse_topology("v5p:2x2x1", slices=2).chips == 8
  with pytest.raises(tpu_targets.UnknownTopologyError, match=r"known: .*v5e-256.*v5p-64"):
    tpu_targets.parse_topology("v5p-63")


@pytest.mark.parametrize("name, devices", [("v5e-8", 8), ("v5p-8", 4), ("v6e-8", 8), ("tpu7x-8", 8)])
def test_every_chip_is_a_target_of_the_installed_libtpu(name, devices):
  """Each chip the report sizes for is one libtpu compiles for, with the device kind and count per slice the
  chip table assumes: TPU7x's 4 chips are 8 devices (two dies each); v5p's "-8" counts cores of 4 chips."""
  topology = tpu_targets.parse_topology(name)
  found = tpu_targets.compile_only_devices(topology)
  assert len(found) == devices
  assert {d.device_kind for d in found} == {topology.chip.device_kind}
  per_chip = 2 if topology.chip.name == "tpu7x" else 1
  assert len(found) == topology.chips * per_chip


def test_a_mesh_axis_that_splits_a_torus_axis_is_laid_out():
  """The released 7B's mesh on v6e-64 (data 2 x fsdp 8 x tensor 4 on an 8x8 torus): no mesh axis is a product
  of whole physical axes, which jax.make_mesh refuses outside v5e; the mesh splits them, each device once."""
  from memagent_jax.runtime.parallel import MeshSpec, make_mesh
  devices = tpu_targets.compile_only_devices(tpu_targets.parse_topology("v6e-64"))
  mesh = make_mesh(MeshSpec(data=2, fsdp=8, tensor=4), devices)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 8, "tensor": 4}
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
  coords = lambda d: tuple(d.coords)
  for row in mesh.devices.reshape(16, 4):  # a tensor group: 4 neighbours along one torus axis
    xs = sorted(coords(d) for d in row)
    assert len({c[0] for c in xs}) == 1 or len({c[1] for c in xs}) == 1, xs


def test_missing_libtpu_names_the_package_and_the_command(tmp_path):
  want = re.escape(tpu_targets.LIBTPU_REQUIREMENT)  # jax's own tpu extra pin (test_lean_core checks it)
  with pytest.raises(tpu_targets.LibtpuMissingError, match=r"libtpu.*pip install --target .*" + want):
    tpu_targets.libtpu_path([str(tmp_path / "libtpu.so")])


def test_setup_installed_libtpu():
  assert tpu_targets.libtpu_path().endswith("libtpu.so")


def _compile(tmp_path, capsys, *args):
  out = tmp_path / "report.json"
  code = cli.main(["compile", "--config", TINY, "--json", str(out), "--quiet", *args])
  return code, json.loads(out.read_text()), capsys.readouterr()


# A 1-layer Llama whose every sharded dimension is a multiple of 128, so TPU tiling adds no padding and
# the argument bytes can be checked against the parameter count (toy-tiny's 16-wide heads pad 8x). One
# layer: libtpu's compile time grows with the layers, and a second layer is the same program again.
SMALL = ModelConfig(arch="llama", vocab_size=2048, hidden_size=512, intermediate_size=1024, num_layers=1,
                    num_heads=4, num_kv_heads=4, head_dim=128, max_position_embeddings=4096,
                    tie_word_embeddings=False)


# The whole step on v5e; on two slices of v5p (a 3-D torus; the data axis across the slices) the update alone:
# what the mesh changes there is how the update's weights, optimizer state and batch split (checked below); the
# rollout, answer and log-prob programs and the step estimate are the same code on both (2 compiles instead of 6).
@pytest.mark.parametrize("topology,mesh,programs", [
    ("v5e:2x2", ["--config.mesh.fsdp=4"], "rollout,answer,logprobs,update"),
    ("v5p:2x2x1", ["--slices", "2", "--config.mesh.fsdp=4"], "update")])
def test_small_step_compiles_for_tpu(tmp_path, capsys, topology, mesh, programs):
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  (model_dir / "config.json").write_text(json.dumps(SMALL.to_hf_dict()))
  code, r, out = _compile(tmp_path, capsys, "--topology", topology, f"--config.model.source={model_dir}",
                          "--programs", programs, *mesh)
  assert code == 0
  assert "| update |" in out.out
  whole_step = programs.count(",") == 3
  if whole_step:
    # the trainer's programs: its two width groups give two log-prob passes, the first update reads old = current
    assert {name.split("#")[0] for name in r["programs"]} == {"rollout", "answer", "logprobs", "update"}
    assert "step estimate" in out.out
    # the step at MaxText's training MFU for the chip: the roofline divided by it, in wall and chip seconds
    lo, hi = compile_report.MAXTEXT_MFU[r["chip"]]
    assert r["step_wall_s_range"] == pytest.approx([r["step_estimate_s"] / hi, r["step_estimate_s"] / lo])
    assert r["step_chip_s_range"] == pytest.approx([w * r["chips"] for w in r["step_wall_s_range"]])
    assert r["step_estimate_s"] == pytest.approx(sum(p["calls_per_step"] * p["live_share"] * p["roofline_s"]
                                                     for p in r["programs"].values()))
  else:
    assert {name.split("#")[0] for name in r["programs"]} == {"update"} and r["step_estimate_s"] is None
    # two slices: the data axis goes across them, fsdp within each
    assert (r["devices"], r["slices"], r["chips"]) == (8, 2, 8)
    assert r["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
  fsdp = r["mesh"]["fsdp"]
  params = SMALL.num_params
  for name, p in r["programs"].items():
    assert p["fits"] and 0 < p["peak_bytes"] < p["step_peak_bytes"] < r["hbm_bytes_per_chip"], name
    assert p["attention_backend"] == "splash"
    assert p["flops"] > 0 and p["bytes_accessed"] > 0 and p["roofline_s"] > 0
    assert not p["uncounted_custom_calls"], name  # the splash kernels' FLOPs are counted from their shapes
  up = r["programs"]["update"]
  # the splash kernel (a Mosaic custom call) runs inside the update and the rollout's prefill
  assert up["custom_calls"].get("tpu_custom_call", 0) >= 1
  # arguments: fp32 params + AdamW's two moments, split over fsdp (norm scales are replicated), + the
  # mini-batch's width groups (tokens int32, valid bool; loss mask bool, old and reference log-probs f32)
  s = r["shapes"]
  n = s["response_width"]
  batch = sum(rows * ((width + n) * (4 + 1) + n * (1 + 4 + 4) + 4) for rows, width in s["width_groups"])
  expected = 3 * 4 * params / fsdp + batch / (r["mesh"]["data"] * fsdp)
  assert abs(up["argument_bytes"] - expected) / expected < 0.10, (up["argument_bytes"], expected)
  # donation: the updated params and optimizer state reuse the input buffers
  weights = r["per_device_weight_bytes"]["train"] * 3
  assert up["alias_bytes"] >= 0.95 * weights
  if not whole_step:
    return
  _step_peak_is_own_plus_what_the_trainer_holds(r)
  assert r["programs"]["rollout"]["custom_calls"].get("tpu_custom_call", 0) >= 1
  # the rollout's scan and decode loops are multiplied in: more than XLA's count of each body once
  ro = r["programs"]["rollout"]
  assert ro["flops"] > 2 * ro["xla_cost_flops_loop_bodies_once"]
  assert sorted(l["trip_count"] for l in ro["loops"])[-1] == s["response_width"] or any(
      l["trip_count"] == 16 for l in ro["loops"])  # the decode loop: memory_tokens new tokens at most


def _step_peak_is_own_plus_what_the_trainer_holds(r: dict):
  """Every program's step peak is its own peak plus the named buffers the trainer keeps beside it; on a chip
  between the largest own peak and the largest step peak every program alone would fit, the step does not,
  and the error names what sits beside the program."""
  assert {"fp32 weights", "optimizer state", "update batches (every mini-batch)"} <= set(r["held_through_step"])
  for name, p in r["programs"].items():
    assert p["step_peak_bytes"] == p["peak_bytes"] + sum(p["co_resident"].values()), name
    if name.startswith("update"):  # its own arguments are the weights and optimizer state; beside it, the batches
      assert "fp32 weights" not in p["co_resident"] and "optimizer state" not in p["co_resident"]
      assert p["co_resident"]["update batches (every mini-batch)"] > 0
  own = max(p["peak_bytes"] for p in r["programs"].values())
  step = max(p["step_peak_bytes"] for p in r["programs"].values())
  assert step > own
  small = compile_report.on_chip_with(r, (own + step) // 2)  # the report's own fit decision, on a smaller chip
  assert all(p["peak_bytes"] <= small["hbm_bytes_per_chip"] for p in small["programs"].values())  # alone: fits
  assert not all(p["fits"] for p in small["programs"].values())  # the step: does not
  first = next(k for k, p in small["programs"].items() if not p["fits"])
  with pytest.raises(compile_report.DoesNotFitError, match=re.escape(first) + r" needs .* its own \+ \w"):
    compile_report.check_fits(small)


def test_rollout_layout_stops_moving_weights(tmp_path, capsys):
  """With the training (FSDP) layout every decoded token and every prefill reduces partial products
  over the sharded weights; the replicated rollout layout decodes without collectives on weights
  (rows are independent: with tensor = 1 nothing is exchanged at all)."""
  per_token, total = {}, {}
  for layout in ("train", "replicated"):
    gated = ["--assume.keep_rate=0.8", "--config.agent.decode_buckets=3"] if layout == "replicated" else []
    code, r, out = _compile(tmp_path, capsys, "--topology", "v5e:2x2", "--programs", "rollout",
                            "--config.mesh.fsdp=4", f"--config.mesh.rollout={layout}", *gated)
    assert code == 0
    if gated:  # the same program re-costed for a gated memory from its own decode loop (test_gated_estimate)
      g, ro = r["gated"], r["programs"]["rollout"]
      assert "gated memory at keep rate 0.8" in out.out
      assert g["overwrite_roofline_s"] == ro["roofline_s"] and 0 < g["bucket_share"] < 1
      assert 0 < g["flops"] < ro["flops"] and 0 < g["bytes_accessed"] < ro["bytes_accessed"]
      assert g["roofline_s"] < ro["roofline_s"]
    per_token[layout] = r["programs"]["rollout"]["loop_collective_bytes_per_iteration"]
    total[layout] = r["programs"]["rollout"]["collective_bytes"]
    weights = r["per_device_weight_bytes"]["rollout"]
  assert per_token["train"] > 0 and total["train"] > 0
  assert per_token["replicated"] <= 0.1 * weights
  assert total["replicated"] <= 0.1 * total["train"]


def test_a_config_that_cannot_fit_exits_3_with_one_line(tmp_path, capsys):
  code = cli.main(["compile", "--config", "configs/memagent_qwen2_5_14b.py", "--topology", "v5e-4", "--quiet",
                   "--config.mesh.fsdp=4", "--config.mesh.tensor=1"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 3
  assert len(err) == 1
  assert re.fullmatch(r"memagent compile: does not fit: (the step holds|update needs) [0-9.]+ GiB per chip .*"
                      r"v5e has 14\.9 GiB", err[0]), err[0]


def test_xla_options_reach_the_compiler_or_are_refused_in_one_line(tmp_path, capsys):
  """--xla-option KEY=VALUE goes to XLA with every program (an unknown key is XLA's own refusal, one line,
  exit 2) and is recorded in the report."""
  for bad, said in (("novalue", "write KEY=VALUE"), ("xla_no_such_option=true", "No such compile option")):
    with pytest.raises(SystemExit) as e:
      cli.main(["compile", "--config", TINY, "--topology", "v5e:2x2", "--programs", "answer", "--quiet",
                "--config.mesh.fsdp=4", "--xla-option", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and "--xla-option" in err[0], err
  code, r, out = _compile(tmp_path, capsys, "--topology", "v5e:2x2", "--programs", "answer", "--config.mesh.fsdp=4",
                          "--xla-option", "xla_tpu_enable_latency_hiding_scheduler=false")
  assert code == 0 and r["compiler_options"] == {"xla_tpu_enable_latency_hiding_scheduler": False}
  assert "XLA option xla_tpu_enable_latency_hiding_scheduler=False" in out.out


def test_unknown_topology_lists_the_known_ones(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["compile", "--config", TINY, "--topology", "v9z-8"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "unknown TPU topology 'v9z-8'" in err and "v5p-64" in err and "v6e-8" in err


def test_a_mesh_that_does_not_match_the_topology_is_named(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["compile", "--config", TINY, "--topology", "v5e:2x2", "--config.mesh.data=3", "--quiet"])
  assert e.value.code == 2
  assert "topology v5e:2x2 (4 devices)" in capsys.readouterr().err


def test_overrides_are_checked(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["compile", "--config", TINY, "--topology", "v5e:2x2", "--config.mesh.nosuch=1"])
  assert e.value.code == 2
  assert "--config.mesh.nosuch: no such config key" in capsys.readouterr().err



def test_compiler_out_of_memory_is_a_does_not_fit_line(tmp_path, capsys):
  """A program whose temporaries exceed HBM is refused by the TPU compiler itself: reported as not
  fitting (exit 3, one line), not as an internal error."""
  code = cli.main(["compile", "--config", TINY, "--topology", "v5e:2x2", "--quiet", "--programs", "update",
                   "--config.mesh.fsdp=4", "--config.rl.rollout_batch=4096", "--config.rl.questions_per_step=2048",
                   "--config.rl.ppo_mini_batch=2048", "--config.agent.chunk_tokens=2048",
                   "--config.data.length=32768", "--config.agent.max_chunks=16", "--config.data.train_size=4096"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 3
  assert len(err) == 1 and re.fullmatch(r"memagent compile: does not fit: update needs [0-9.]+ GiB per chip "
                                        r"\([0-9.]+ its own \+ .*\), v5e has 14\.9 GiB", err[0]), err


def test_dynamic_sampling_cap_costs_the_rollout_again():
  """Each extra generation batch re-runs the rollout and answer programs (calls x live share x roofline), not the
  update: by hand, 4 x 0.5 x 10 + 4 x 1 x 2 = 28 s per batch; 3 extra on a 128 s step give 212 s."""
  import ml_collections
  reports = {"rollout": dict(calls_per_step=4, live_share=0.5, roofline_s=10.0),
             "answer": dict(calls_per_step=4, live_share=1.0, roofline_s=2.0),
             "update": dict(calls_per_step=1, live_share=1.0, roofline_s=100.0),
             "update#2": dict(calls_per_step=2, live_share=1.0, roofline_s=0.0)}
  rl = ml_collections.ConfigDict(dict(dynamic_sampling=True, max_extra_gen_batches=3))
  r = compile_report.dynamic_sampling_regeneration(rl, reports, 128.0)
  assert r == {"max_extra_gen_batches": 3, "roofline_s_per_extra_batch": 28.0, "step_estimate_worst_s": 212.0}
  assert compile_report.dynamic_sampling_regeneration(rl, reports, None) is None  # no step estimate
  rl.dynamic_sampling = False
  assert compile_report.dynamic_sampling_regeneration(rl, reports, 128.0) is None


def test_scanned_and_unrolled_rows_side_by_side():
  """The page's layers section from hand-made rows of one config and its twin (`_unrolled` beside a scanned
  row, `_scanned` beside an unrolled one): update temporaries, collectives and roofline, the largest step peak
  and the step roofline, scanned first; the largest all-gather growth named."""
  from experiments.benchmarks import tpu_compile_table as page
  gib = 1024 ** 3

  def report(temp, gathered, roofline, peak, step, scanned):
    update = dict(temp_bytes=temp * gib, collective_bytes=2 * gathered * 1e9, roofline_s=roofline,
                  step_peak_bytes=peak * gib, hbm_share=peak / 16, collectives={"all-gather": {"bytes": gathered * 1e9}})
    rollout = dict(temp_bytes=1 * gib, step_peak_bytes=4 * gib, hbm_share=4 / 16)
    return {"programs": {"rollout": rollout, "update": update}, "step_estimate_s": step,
            "model": {"scan_layers": scanned}}

  scanned, unrolled = report(2.5, 150, 10.4, 8, 173, True), report(7.9, 67, 9.7, 12, 167, False)
  row = ("| 0.5b_v5e-8 | 2.50 | 7.90 | 300 | 134 | 10.40 | 9.70 | 8.0 GiB (50%, update) | 12.0 GiB (75%, update) | "
         "173 | 167 |")
  lines = page.layer_loops({"0.5b_v5e-8": scanned, "0.5b_v5e-8_unrolled": unrolled,
                            "7b_v5p-64": report(1, 1, 1, 1, 1, True)})
  assert "(0.5b_v5e-8: 150 GB of all-gathers per update instead of 67)" in lines[2]
  assert lines[-2] == row
  assert page.layer_loops({"0.5b_v5e-8": unrolled, "0.5b_v5e-8_scanned": scanned})[-2] == row
  assert page.layer_loops({"7b_v5p-64": report(1, 1, 1, 1, 1, True)}) == []  # no twin: no section
