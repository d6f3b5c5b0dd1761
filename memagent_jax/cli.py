"""`memagent` command line. `answer` reads a document and answers a question about it."""

from __future__ import annotations

import argparse
import sys
import time

DEMO_QUESTION = "How many stories tall is the main library at Notre Dame?"  # gold (SQuAD): 14


def read_document(path: str) -> str:
  """Reads a UTF-8 text file ('-' = stdin) with errors that name the file."""
  if path == "-":
    return sys.stdin.read()
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except FileNotFoundError:
    raise SystemExit(f"memagent: document not found: {path}") from None
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise SystemExit(f"memagent: {path} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 4]!r})") from None


def cmd_answer(args) -> int:
  """Direct reading: the whole document in one prompt (the memory agent replaces this later)."""
  import memagent_jax as mj
  doc = read_document(args.doc)
  t0 = time.perf_counter()
  policy = mj.load_policy(args.model, dtype=args.dtype)
  print(f"[memagent] loaded {args.model} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
  prompt = (f"Read the document and answer the question.\n\n<document>\n{doc.strip()}\n</document>\n\n"
            f"Question: {args.question}\nAnswer briefly.")
  t0 = time.perf_counter()
  try:
    answer = policy.generate([prompt], args.max_new_tokens, temperature=args.temperature,
                             top_p=args.top_p, seed=args.seed)[0]
  except ValueError as e:  # e.g. document + question over the model's context window
    raise SystemExit(f"memagent: {args.doc}: {e}") from None
  print(f"[memagent] answered in {time.perf_counter() - t0:.1f}s (includes compilation)",
        file=sys.stderr)
  print(f"Q: {args.question}\nA: {answer.strip()}")
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="memagent", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  a = sub.add_parser("answer", help="answer a question about a document")
  a.add_argument("--doc", required=True, help="UTF-8 text file, or - for stdin")
  a.add_argument("--question", default=DEMO_QUESTION)
  a.add_argument("--model", default="smollm2-135m-instruct",
                 help="embedded default, preset/hub id, HF directory or .gguf file")
  a.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  a.add_argument("--max-new-tokens", type=int, default=64)
  a.add_argument("--temperature", type=float, default=0.0)
  a.add_argument("--top-p", type=float, default=1.0)
  a.add_argument("--seed", type=int, default=0)
  a.set_defaults(func=cmd_answer)
  return parser


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  return args.func(args)


if __name__ == "__main__":
  sys.exit(main())
