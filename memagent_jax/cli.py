"""`memagent` command line: `answer` reads a document with the memory agent; `eval` scores a task;
`export` writes a training checkpoint as a transformers model directory."""

from __future__ import annotations

import argparse
import json
import sys
import time

def _fail(msg: str):
  raise SystemExit(f"memagent: {msg}")


MEMAGENT_ONLY = ("chunk_tokens", "memory_tokens", "block_chunks", "final_template", "show_memory")
DEFAULTS = dict(chunk_tokens=5000, memory_tokens=1024, block_chunks=8, final_template="boxed")


def _check_flags(args):
  """Flags that would do nothing with the chosen method are errors, not silently ignored."""
  if args.method == "direct":
    used = [f for f in MEMAGENT_ONLY if getattr(args, f, None) not in (None, False)]
    if used:
      _fail(f"--{used[0].replace('_', '-')} has no effect with --method direct")
  elif args.truncate:
    _fail("--truncate applies to --method direct only (the memory agent reads everything)")
  for f, v in DEFAULTS.items():
    if getattr(args, f) is None:
      setattr(args, f, v)


def _reader(args, policy):
  import memagent_jax as mj
  if args.method == "direct":
    return mj.DirectReader(policy, answer_tokens=args.answer_tokens, truncate=args.truncate)
  return mj.MemAgent(policy, chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                     answer_tokens=args.answer_tokens, final_template=args.final_template,
                     block_chunks=args.block_chunks)


def _load(args):
  import memagent_jax as mj
  t0 = time.perf_counter()
  policy = mj.load_policy(args.model, dtype=args.dtype)
  print(f"[memagent] loaded {args.model} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
  return policy


def cmd_answer(args) -> int:
  """Streams the document (file or stdin) through the reader and prints the answer."""
  _check_flags(args)
  policy = _load(args)
  try:
    reader = _reader(args, policy)
    t0 = time.perf_counter()
    kw = dict(from_files=True)
    if args.method == "memagent":
      kw.update(progress=not args.quiet, keep_prompts=False)
    res = reader.answer_batch([args.question], [args.doc], temperature=args.temperature,
                              top_p=args.top_p, seed=args.seed, **kw)[0]
  except (ValueError, FileNotFoundError, IsADirectoryError) as e:
    _fail(str(e))
  dt = time.perf_counter() - t0
  if args.show_memory:
    for k, m in enumerate(res.memories):
      print(f"--- memory after chunk {k + 1}/{res.num_chunks} ---\n{m}")
  print(f"[memagent] {args.method}: {res.document_tokens} document tokens, {res.num_chunks} chunks, "
        f"{dt:.1f}s ({res.document_tokens / max(dt, 1e-9):.0f} tok/s, compilation included)",
        file=sys.stderr)
  print(f"Q: {args.question}\nA: {res.answer.strip()}")
  if res.prediction is not None:
    print(f"answer: {res.prediction}")
  return 0


def cmd_eval(args) -> int:
  """Generates the task at the length, runs the reader, prints accuracy, writes JSONL."""
  from memagent_jax import evaluation
  _check_flags(args)
  policy = _load(args)
  try:
    samples = evaluation.make_samples(args.task, args.length, args.n, args.data_seed,
                                      policy._require_tokenizer(), args.data_dir)
    reader = _reader(args, policy)
    out = args.out or f"eval_{args.task}_{args.length}_{args.method}.jsonl"
    summary = evaluation.run_eval(reader, args.task, samples, out, args.batch_size,
                                  args.temperature, args.top_p, args.seed, progress=not args.quiet)
  except (ValueError, FileNotFoundError) as e:
    _fail(str(e))
  summary.update(method=args.method, length=args.length, model=args.model, predictions=out)
  print(json.dumps(summary))
  print(f"{args.task} @ {args.length} tokens, {args.method}: accuracy {summary['score']:.3f} "
        f"(n={summary['n']}); predictions in {out}", file=sys.stderr)
  return 0


def cmd_export(args) -> int:
  """Exports the params of a checkpoint step (latest complete one by default) to an HF dir."""
  from memagent_jax import checkpointing
  try:
    step = checkpointing.export_checkpoint(args.ckpt, args.out, step=args.step, dtype=args.dtype)
  except (ValueError, FileNotFoundError, checkpointing.CheckpointCorruptError) as e:
    _fail(str(e))
  except KeyError as e:  # an unknown tokenizer_source recorded in the checkpoint
    _fail(str(e.args[0]))
  print(f"[memagent] exported step {step} of {args.ckpt} to {args.out}", file=sys.stderr)
  return 0


def _common(p: argparse.ArgumentParser):
  p.add_argument("--model", default="smollm2-135m-instruct",
                 help="embedded default, preset/hub id, random:<preset>, HF directory or .gguf file")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--method", default="memagent", choices=["memagent", "direct"])
  p.add_argument("--chunk-tokens", type=int, help="memagent: tokens per chunk (default 5000)")
  p.add_argument("--memory-tokens", type=int, help="memagent: memory cap in tokens (default 1024)")
  p.add_argument("--answer-tokens", type=int, default=1024)
  p.add_argument("--block-chunks", type=int, help="memagent: scan steps compiled per block (default 8)")
  p.add_argument("--final-template", choices=["boxed", "eval"], help="memagent: final prompt (default boxed)")
  p.add_argument("--truncate", action="store_true", help="direct: centre-truncate to the context")
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--top-p", type=float, default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="memagent", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  a = sub.add_parser("answer", help="answer a question about a document of any length")
  a.add_argument("--doc", required=True, help="UTF-8 text file, or - for stdin")
  a.add_argument("--question", required=True)
  a.add_argument("--show-memory", action="store_true", help="print the memory after each chunk")
  _common(a)
  a.set_defaults(func=cmd_answer)
  e = sub.add_parser("eval", help="accuracy on a RULER or long-QA task at a length")
  e.add_argument("--task", required=True, help="niah_single_1 .. fwe, or squad / hotpotqa")
  e.add_argument("--length", type=int, required=True, help="context tokens per sample")
  e.add_argument("--n", type=int, default=16)
  e.add_argument("--data-seed", type=int, default=0)
  e.add_argument("--data-dir", help="squad/hotpotqa: directory (or file) of the JSON corpus")
  e.add_argument("--batch-size", type=int, default=4)
  e.add_argument("--out", help="JSONL of every prediction (default eval_<task>_<length>_<method>.jsonl)")
  _common(e)
  e.set_defaults(func=cmd_eval)
  x = sub.add_parser("export", help="write a training checkpoint as a transformers model directory")
  x.add_argument("--ckpt", required=True, help="checkpoint directory written by training")
  x.add_argument("--out", required=True, help="output directory (config.json + model.safetensors)")
  x.add_argument("--step", type=int, help="checkpoint step (default: the latest complete one)")
  x.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  x.set_defaults(func=cmd_export)
  return parser


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  return args.func(args)


if __name__ == "__main__":
  sys.exit(main())
