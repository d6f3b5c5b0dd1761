"""Scoring a reader on a task (layer 7; imports data, rl.rewards and below).

  evaluate      `run_eval` (one task at one length, JSONL rows, resumable), `score`
  length_sweep  `sweep_lengths`: accuracy (Wilson interval), seconds and peak memory against length
"""
from memagent_jax.evaluation.evaluate import METRICS, Sampling, format_scores, partial_path, run_eval, score
