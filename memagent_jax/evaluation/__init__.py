"""Scoring a reader on a task: one length (`run_eval`) or the accuracy-vs-length curve (`sweep_lengths`)."""
from memagent_jax.evaluation.evaluate import partial_path, run_eval, score
