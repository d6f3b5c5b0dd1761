"""experiments/plot_training.py: the reward table, the held-out score (step 0 = before training), and
steps that made no update."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_table_has_reward_means_and_held_out_scores_and_tolerates_steps_without_update(tmp_path):
  os.makedirs(tmp_path / "logs")
  rows = [{"step": 0, "eval/score": 0.25},
          {"step": 1, "train/reward_mean": -1.0, "train/step_seconds": 2.0},  # no kept group: no entropy
          {"step": 2, "train/reward_mean": 0.5, "train/entropy": 1.5, "train/step_seconds": 3.0},
          {"step": 2, "eval/score": 0.5},
          {"step": 3, "train/reward_mean": 1.0, "train/entropy": 0.5, "train/step_seconds": 4.0}]
  with open(tmp_path / "logs" / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  out = tmp_path / "curve"
  subprocess.run([sys.executable, "-m", "experiments.plot_training", f"--workdir={tmp_path}", f"--out={out}",
                  "--window=2", "--command=train it"], cwd=REPO, check=True, capture_output=True)
  md = open(f"{out}.md").read()
  assert "| 1-2 | -0.250 | 1.50 | 5 |" in md  # mean of -1 and 0.5; entropy of the step that updated
  assert "| 3-3 | 1.000 | 0.50 | 9 |" in md
  assert "| 0 | 0.250 |" in md and "| 2 | 0.500 |" in md
  assert "Command: `train it`" in md and os.path.getsize(f"{out}.png") > 0
