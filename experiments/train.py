"""Multi-Conv DAPO training from a config file.

  python -m experiments.train --config=configs/toy_cpu.py
  python -m experiments.train --config=configs/memagent_qwen2_5_7b.py:dapo --config.rl.clip_high=0.28
  python -m experiments.train --config=configs/toy_cpu.py:tiny --workdir=/tmp/run
  python -m experiments.train --config=configs/toy_memagent.py:rl,lookup   # a data curriculum (data.phases)

Resumes from the latest complete checkpoint in <workdir>/checkpoints; metrics go to
<workdir>/logs/metrics.jsonl and TensorBoard events in <workdir>/logs/tensorboard. SIGTERM (a
scheduler's preemption) or Ctrl-C stops the run after the step in flight, saves it and exits 143
or 130; running the same command again resumes it exactly. A second run on a workdir that a live
run holds (<workdir>/run.lock) is refused.
"""

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from memagent_jax.experiment import config_overrides
from memagent_jax.experiment.assembly import train_phases
from memagent_jax.runtime.checkpointing import CheckpointCorruptError
from memagent_jax.runtime.preemption import Preempted
from memagent_jax.runtime.workdir_lock import WorkdirLockedError

_CONFIG = config_flags.DEFINE_config_file("config", None, "training config file[:variant]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (default: config.train.workdir)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  cfg = _CONFIG.value
  try:
    out = train_phases(cfg, workdir=_WORKDIR.value)  # one run, or its data.phases one after another
    trainer = out.trainer
  except Preempted as e:  # SIGTERM / SIGINT: the step reached is saved
    print(f"train: {e}", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
  except (ValueError, OSError, FloatingPointError, CheckpointCorruptError, WorkdirLockedError) as e:
    # bad config, missing data or model, a diverged step, no readable checkpoint, a workdir in use:
    # one line, exit 2 (the traceback with --verbosity=1)
    if flags.FLAGS.verbosity >= logging.INFO:
      raise
    print(f"train: error: {' '.join(str(e).split())}", file=sys.stderr)
    sys.exit(2)
  last = out.history[-1].rollout if out.history else None
  summary = {"step": out.step, "workdir": trainer.workdir,
             **({} if last is None else dict(reward_mean=last.reward_mean, accuracy=last.accuracy,
                                             kept_group_frac=last.kept_group_frac))}
  print(json.dumps(summary))


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main, flags_parser=config_overrides.absl_flags_parser("train", "config"))  # a mistyped key: one line, exit 2
