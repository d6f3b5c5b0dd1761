"""RULER-HotpotQA as the paper reports it: a MemAgent over every length of a built set, one table + PNG.

  memagent build-ruler-hotpotqa --input=hotpot_dev_distractor_v1.json --out=runs/ruler_hotpotqa
  python -m experiments.ruler_hotpotqa --set=runs/ruler_hotpotqa --model=<HF dir of RL-MemAgent-14B>

Runs the length sweep (evaluation.length_sweep) over the set's lengths (documents, as the paper's
50, 100, ... docs) and writes docs/results/ruler_hotpotqa_<model>.{md,png} plus the per-sample JSONL
and kept rows under --out. The headline is sub_em, what the paper's tables call accuracy; EM and F1
stand beside it and the training verifier (boxed exact match) apart. Defaults are the paper's
evaluation: chunks of 5000 tokens, 1024-token memory and answer, the "the answer is" final prompt,
temperature 0.7, top-p 0.95, all 128 questions.
"""

from __future__ import annotations

import hashlib
import os

from absl import app, flags

import memagent_jax as mj
from memagent_jax.data import ruler_hotpotqa as rhq
from memagent_jax.evaluation import evaluate
from memagent_jax.evaluation.length_sweep import SweepRow, SweepSpec, sweep_lengths
from memagent_jax.runtime.atomic_io import atomic_write, save_figure

PAPER_MEMAGENT_14B = {50: 83.6, 200: 84.4, 800: 76.6, 3200: 75.0, 6400: 77.3, 12800: 76.6, 25600: 78.1}


def _label(num_docs: int) -> str:
  return f"{rhq.PAPER_TOKENS.get(num_docs, '?')} ({num_docs} docs)"


def markdown(rows: list[SweepRow], manifest: dict, command: str, title: str) -> str:
  """The paper's layout (one row per reader, one column per length, sub_em %), then each length's scores."""
  lines = [f"# RULER-HotpotQA: {title}", "", f"Command: `{command}`", "",
           f"Set: {len(manifest['questions'])} questions of `{manifest['source']}` (seed {manifest['seed']}); "
           f"tokens measured with {manifest.get('tokenizer') or 'no tokenizer'}.", "",
           "Accuracy is sub_em, the score the paper's tables report (the reference's table script reads only "
           "`judge_sub_em`); EM and F1 are the reference scorer's other scores. The training verifier (boxed exact "
           "match, the RL reward) is a different, stricter score: do not compare it with the paper's numbers.", "",
           "| reader | " + " | ".join(_label(r.length) for r in rows) + " |", "|---|" + "---|" * len(rows),
           "| MemAgent, this model | " + " | ".join(f"{100 * r.accuracy:.1f}" for r in rows) + " |",
           "| RL-MemAgent-14B (paper) | " + " | ".join(str(PAPER_MEMAGENT_14B.get(r.length, "-")) for r in rows)
           + " |", "",
           "| documents | paper's length | mean tokens | n | sub_em (paper's accuracy) | 95% CI | EM | F1 | "
           "training verifier (boxed EM) | s/doc |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    o = r.others
    lines.append(f"| {r.length} | {rhq.PAPER_TOKENS.get(r.length, '-')} | {r.doc_tokens:,.0f} | {r.n} | "
                 f"{100 * r.accuracy:.1f} | {100 * r.ci_low:.1f}-{100 * r.ci_high:.1f} | {100 * o.get('em', 0):.1f} | "
                 f"{100 * o.get('f1', 0):.1f} | {100 * o.get('verifier', 0):.1f} | {r.seconds_per_doc:.1f} |")
  return "\n".join(lines) + "\n"


def plot(rows: list[SweepRow], path: str, title: str):
  import matplotlib  # matplotlib only when plotting
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5.5, 3.5))
  xs = [r.length for r in rows]
  ax.plot(xs, [100 * r.accuracy for r in rows], "o-", label="MemAgent (sub_em)")
  ax.fill_between(xs, [100 * r.ci_low for r in rows], [100 * r.ci_high for r in rows], alpha=0.2)
  paper = sorted(PAPER_MEMAGENT_14B.items())
  ax.plot(*zip(*paper), "s--", color="gray", label="RL-MemAgent-14B (paper)")
  ticks = sorted(set(xs) | {n for n, _ in paper})
  ax.set_xscale("log")
  ax.set_xticks(ticks, [rhq.PAPER_TOKENS.get(n, str(n)) for n in ticks], rotation=45)
  ax.set(xlabel="context (paper's token length)", ylabel="accuracy % (sub_em)", ylim=(-2, 102))
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8)
  fig.tight_layout()
  save_figure(fig, path, dpi=110)


def define_flags():
  """The command line's flags, defined when run as a script only (tests import this module beside others)."""
  flags.DEFINE_string("set", None, "a set built by `memagent build-ruler-hotpotqa`")
  flags.DEFINE_string("model", "smollm2-135m-instruct", "what load_policy takes: a preset, HF directory or .gguf")
  flags.DEFINE_string("num_docs", "", "lengths to run, comma-separated documents (default: every built length)")
  flags.DEFINE_integer("n", None, "questions per length (default: all the set holds)")
  flags.DEFINE_integer("chunk_tokens", 5000, "MemAgent's chunk size")
  flags.DEFINE_integer("memory_tokens", 1024, "MemAgent's memory cap")
  flags.DEFINE_integer("answer_tokens", 1024, "the final answer's token cap")
  flags.DEFINE_enum("final_template", "eval", ["eval", "boxed"], "final prompt: the paper's evaluation one "
                    "(\"the answer is\") or the training one (\\boxed{}, which the verifier reads)")
  flags.DEFINE_float("temperature", 0.7, "sampling temperature (the paper's evaluation: 0.7; 0 = greedy)")
  flags.DEFINE_float("top_p", 0.95, "nucleus sampling (the paper's evaluation: 0.95)")
  flags.DEFINE_integer("batch_size", 8, "documents per call")
  flags.DEFINE_integer("seed", 0, "answer sampling")
  flags.DEFINE_string("dtype", "float32", "float32 (CPU) or bfloat16 (accelerators)")
  flags.DEFINE_string("out", "docs/results", "directory of the table and plot")
  flags.DEFINE_string("runs", "runs/ruler_hotpotqa", "directory of per-sample JSONL and kept rows (resumable)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  manifest = rhq.load_manifest(args.set)
  built = [e["num_docs"] for e in manifest["lengths"]]
  lengths = tuple(int(x) for x in args.num_docs.split(",")) if args.num_docs else tuple(built)
  n = args.n or len(manifest["questions"])
  policy = mj.load_policy(args.model, dtype=args.dtype)
  reader = mj.MemAgent(policy, chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                       answer_tokens=args.answer_tokens, final_template=args.final_template)
  spec = SweepSpec(task=rhq.TASK, lengths=lengths, n=n, seed=args.seed, batch_size=args.batch_size,
                   temperature=args.temperature, top_p=args.top_p, chunk_tokens=args.chunk_tokens,
                   warmup_each_length=False, data_dir=args.set)
  name = os.path.basename(os.path.normpath(args.model)).replace(".gguf", "")
  # a kept row is reused only for the same model, reader settings and built set
  reader_id = hashlib.sha256(f"{args.model}:{args.dtype}:{args.memory_tokens}:{args.answer_tokens}:"
                             f"{args.final_template}:{manifest['source_sha256']}:{manifest['seed']}:"
                             f"{manifest['questions']}".encode()).hexdigest()[:16]

  def report(row: SweepRow):
    scores = evaluate.format_scores(rhq.TASK, {"score": row.accuracy, **row.others})
    print(f"{row.length} documents ({row.doc_tokens:,.0f} tokens): {scores}", flush=True)

  rows = sweep_lengths(reader, name, spec, out_dir=args.runs, reader_id=reader_id, on_row=report)
  command = (f"python -m experiments.ruler_hotpotqa --set={args.set} --model={args.model} --num_docs="
             f"{','.join(map(str, lengths))} --n={n} --chunk_tokens={args.chunk_tokens} --memory_tokens="
             f"{args.memory_tokens} --answer_tokens={args.answer_tokens} --final_template={args.final_template} "
             f"--temperature={args.temperature} --top_p={args.top_p} --batch_size={args.batch_size} --seed={args.seed}")
  title = f"{name}, MemAgent ({args.chunk_tokens}-token chunks, {args.memory_tokens}-token memory)"
  table = markdown(rows, manifest, command, title)
  print(table)
  with atomic_write(os.path.join(args.out, f"ruler_hotpotqa_{name}.md")) as f:
    f.write(table + f"\n![accuracy](ruler_hotpotqa_{name}.png)\n")
  plot(rows, os.path.join(args.out, f"ruler_hotpotqa_{name}.png"), f"RULER-HotpotQA: MemAgent on {name}")


if __name__ == "__main__":
  define_flags()
  flags.mark_flag_as_required("set")
  app.run(main)
