"""Accuracy and per-chunk memory error rates of ONE exported toy policy at several lengths: the quick
look between training runs that the full reproduction (toy_reproduction.py) does for three policies.

  python experiments/toy_sweep.py --export=runs/toy_full_lookup/rl/export --name=rl --multiples=1,4,16

Prints one line per length: accuracy with its 95% Wilson interval, seconds per document, and for each
chunk kind (evaluation/memory_errors.py) first errors / such chunks read while the memory was right.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from configs import toy_memagent  # an installed package (setup.py)
from memagent_jax.data import tasks, toy
from memagent_jax.evaluation.length_sweep import sweep_lengths
from memagent_jax.evaluation.memory_errors import error_table
from memagent_jax.experiment.assembly import load_reader

_EXPORT = flags.DEFINE_string("export", None, "an exported policy directory (a stage's export)", required=True)
_NAME = flags.DEFINE_string("name", "policy", "its name in the output files")
_WORLD = flags.DEFINE_enum("world", "lookup", list(toy_memagent.WORLDS), "the world it was trained in")
_MULTIPLES = flags.DEFINE_list("multiples", ["1", "4", "16"], "lengths, as multiples of the training length")
_N = flags.DEFINE_integer("n", 200, "documents per length")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.7, "sampling temperature (0: greedy)")
_SEED = flags.DEFINE_integer("eval_seed", 1000, "documents: seed + length (the reproduction's)")
_OUT = flags.DEFINE_string("out_dir", None, "per-document lines (default runs/toy_sweep/<name>)")


def rate(pair) -> str:
  failed, exposed = pair
  return f"{failed}/{exposed} = {100 * failed / exposed:.1f}%" if exposed else "-"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cfg = toy_memagent.get_config(f"rl,{_WORLD.value}")
  chunk, n, seed = cfg.agent.chunk_tokens, _N.value, _SEED.value
  out_dir = _OUT.value or os.path.join("runs", "toy_sweep", _NAME.value)
  os.makedirs(out_dir, exist_ok=True)
  reader = load_reader(cfg, _EXPORT.value, training=False)
  lengths = [toy.TRAIN_TOKENS * int(m) for m in _MULTIPLES.value]
  rows = sweep_lengths(reader, _NAME.value, cfg.data.task, lengths, n=n, seed=seed, batch_size=n,
                       temperature=_TEMPERATURE.value, top_p=cfg.eval.top_p, chunk_tokens=chunk,
                       out_dir=out_dir, warmup_each_length=False,  # one warm-up, on 1x documents
                       warmup_length=toy.TRAIN_TOKENS)  # (with --multiples=256 alone, not on 200 long ones)
  for length, row in zip(lengths, rows):
    multiple = length // toy.TRAIN_TOKENS
    with open(os.path.join(out_dir, f"{_NAME.value}_{length}.jsonl")) as f:
      answers = [json.loads(line) for line in f]
    samples = tasks.make_samples(cfg.data.task, length, n, seed + length, None, chunk_tokens=chunk)
    table = error_table(samples, answers, chunk_tokens=chunk)
    kinds = {**table["per_chunk"], **{f"overwrite by {k}": v for k, v in table["distractor_split"].items()}}
    print(f"{_NAME.value} {multiple}x: {100 * row['accuracy']:.1f}% [{100 * row['ci_low']:.0f}, "
          f"{100 * row['ci_high']:.0f}], {row['seconds_per_doc']:.3f} s/doc; "
          + "; ".join(f"{k} {rate(v)}" for k, v in kinds.items()), flush=True)


if __name__ == "__main__":
  app.run(main)
