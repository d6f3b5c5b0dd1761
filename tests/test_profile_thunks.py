"""experiments/benchmarks/profile_thunks.py: the wall time of overlapping thunks is shared, not counted twice."""

import gzip
import json

from experiments.benchmarks import profile_thunks


def test_wall_share_splits_overlapping_thunks_and_names_their_shapes(tmp_path):
  """Two thunks overlapping for 2 us share it (1 us each); control-flow wrappers and runtime events
  are not thunks; numbered copies of one fusion group together under its output shape and jax op."""
  (tmp_path / "plugins").mkdir()
  events = [dict(ph="X", name="ynn_fusion.3", ts=0.0, dur=4.0),  # alone 0-2, shared 2-4
            dict(ph="X", name="dot.7", ts=2.0, dur=4.0),  # shared 2-4, alone 4-6
            dict(ph="X", name="ynn_fusion.9", ts=10.0, dur=1.0),  # same kind and shape as .3
            dict(ph="X", name="while.2", ts=0.0, dur=11.0),  # a loop: its body's thunks are counted
            dict(ph="X", name="ThunkExecutor::Execute", ts=0.0, dur=11.0),
            dict(ph="i", name="marker", ts=1.0)]
  with gzip.open(tmp_path / "plugins" / "host.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  hlo = ('  %ynn_fusion.3 = f32[8,16]{1,0} fusion(%a), kind=kCustom, metadata={op_name="jit(f)/while/body/dot_general"}\n'
         '  %ynn_fusion.9 = f32[8,16]{1,0} fusion(%b), kind=kCustom, metadata={op_name="jit(f)/dot_general"}\n'
         "  ROOT %dot.7 = f32[4,4]{1,0} dot(%c, %d)\n")
  share, calls, covered = profile_thunks.wall_share(str(tmp_path), hlo)
  assert calls == {"ynn_fusion f32[8,16] dot_general": 2, "dot f32[4,4]": 1}
  assert abs(share["ynn_fusion f32[8,16] dot_general"] - 4e-6) < 1e-12  # 2 alone + 1 shared + 1 (the second call)
  assert abs(share["dot f32[4,4]"] - 3e-6) < 1e-12  # 1 shared + 2 alone
  assert abs(covered - 7e-6) < 1e-12  # the wall the thunks cover: 0-6 and 10-11


def test_its_flags_beside_the_scripts_it_imports_as_a_script():
  """Run as a script it defines its flags, then imports bench_sampler (prefill), sweep_batch (sweep) and
  bench_train (update):
  no flag name may be defined twice (checked in a fresh interpreter: flags are process-global)."""
  import subprocess
  import sys
  code = ("from experiments.benchmarks import profile_thunks; profile_thunks.define_flags(); "
          "import experiments.benchmarks.bench_sampler, experiments.benchmarks.sweep_batch, "
          "experiments.benchmarks.bench_train")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
