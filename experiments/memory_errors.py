"""Where the toy reproduction's memories go wrong, per length: the first chunk after which a
memory lost the asked key's latest code, by what that chunk held (evaluation/memory_errors.py).

  python experiments/memory_errors.py --workdir=runs/toy_full --stage=rl

Reads the per-document evaluation lines (<workdir>/eval/<stage>_<length>.jsonl, written by
experiments/toy_reproduction.py) and regenerates their documents from the same task and seeds.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from configs import toy_memagent  # noqa: E402
from memagent_jax.data import tasks, toy  # noqa: E402
from memagent_jax.evaluation.memory_errors import CHUNK_KINDS, DISTRACTOR_SPLIT, KINDS, error_table  # noqa: E402


def swept_documents(prefix: str, length: int, eval_seed: int, world: str = "one_key") -> tuple[list[dict], list[dict]]:
  """The documents of <prefix>_<length>.jsonl, regenerated from the task and seeds, and its lines."""
  cfg = toy_memagent.get_config(f"rl,{world}")
  path = f"{prefix}_{length}.jsonl"
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no {path}: evaluate the policy at {length} tokens first (experiments/toy_sweep.py)")
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  samples = tasks.make_samples(cfg.data.task, length, len(rows), eval_seed + length, None,
                               chunk_tokens=cfg.agent.chunk_tokens)
  return samples, rows


def prefix_rows(prefix: str, eval_seed: int, world: str = "one_key", lengths: set[int] | None = None) -> list[dict]:
  """One row per <prefix>_<length>.jsonl (of `lengths` if given), by length: n, exact-match hits and
  the counts of first-error kinds, over the documents regenerated from the task and seeds."""
  cfg = toy_memagent.get_config(f"rl,{world}")
  out = []
  for length in sorted(int(m.group(1)) for p in glob.glob(f"{prefix}_*.jsonl")
                       if (m := re.search(r"_(\d+)\.jsonl$", p))):
    if lengths and length not in lengths:
      continue
    samples, rows = swept_documents(prefix, length, eval_seed, world)
    out.append({"length": length, "n": len(rows), "right": sum(bool(r["score"]) for r in rows),
                **error_table(samples, rows, chunk_tokens=cfg.agent.chunk_tokens)})
  if not out:
    raise FileNotFoundError(f"no {prefix}_<length>.jsonl: evaluate the policy first "
                            "(experiments/toy_reproduction.py or experiments/toy_sweep.py)")
  return out


def error_rows(workdir: str, stage: str, eval_seed: int, world: str = "one_key") -> list[dict]:
  """One row per evaluated length of `stage`: counts of first-error kinds."""
  return prefix_rows(os.path.join(workdir, "eval", stage), eval_seed, world)


def rate(failed: int, exposed: int, digits: int = 1) -> str:
  return f"{failed}/{exposed} = {100 * failed / exposed:.{digits}f}%" if exposed else "-"


def markdown(rows: list[dict], stage: str) -> str:
  head = ["length (tokens)", "x training", "documents", "wrong", *KINDS, "right despite a wrong memory",
          "mean position of the first error (0 = first chunk, 1 = last)",
          *(f"per-chunk {k} rate" for k in CHUNK_KINDS),
          *(f"distractor overwrite rate, {k.replace('_', ' ')} keys" for k in DISTRACTOR_SPLIT)]
  lines = [f"First memory error of each wrong document, {stage} (experiments/memory_errors.py). Per-chunk "
           "rate: first errors at chunks of that kind / such chunks read while the memory was still right.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    pos = "-" if r["mean_relative_chunk"] is None else f"{r['mean_relative_chunk']:.2f}"
    rates = [rate(*r["per_chunk"][k]) for k in CHUNK_KINDS] + [rate(*r["distractor_split"][k])
                                                                 for k in DISTRACTOR_SPLIT]
    lines.append(f"| {r['length']} | {r['length'] // toy.TRAIN_TOKENS}x | {r['documents']} | {r['wrong']} | "
                 + " | ".join(str(r[k]) for k in KINDS) + f" | {r['right_despite_wrong_memory']} | {pos} | "
                 + " | ".join(rates) + " |")
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  text = markdown(error_rows(f.workdir, f.stage, f.eval_seed, f.world), f.stage)
  print(text)
  if f.out:
    with open(f.out, "w") as out:
      out.write(text)


if __name__ == "__main__":  # flags only when run as a script: toy_reproduction.py imports this module
  flags.DEFINE_string("workdir", "runs/toy_full", "the reproduction's run directory")
  flags.DEFINE_string("stage", "rl", "which evaluated policy (rl, warm_start)")
  flags.DEFINE_integer("eval_seed", 1000, "the reproduction's --eval_seed")
  flags.DEFINE_enum("world", "one_key", list(toy_memagent.WORLDS), "the reproduction's --world")
  flags.DEFINE_string("out", None, "also write the table to this markdown file")
  app.run(main)
