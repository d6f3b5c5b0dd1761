"""`memagent` command line: `answer` reads a document with the memory agent; `eval` scores a task;
`build-ruler-hotpotqa` builds the paper's test set from a HotpotQA dev file; `export` writes a training checkpoint as a transformers model directory; `compile` compiles a training
config's RL step for a TPU topology on this machine and reports its memory, FLOPs and collectives."""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys
import threading
import time
import traceback

import memagent_jax as mj
from configs import base as base_config
from memagent_jax import evaluation
from memagent_jax.data import ruler_hotpotqa, tasks
from memagent_jax.experiment import assembly, compile_report, config_overrides, gated_estimate
from memagent_jax.policy import export, loading
from memagent_jax.runtime import checkpointing, tpu_targets
from memagent_jax.runtime.atomic_io import atomic_directory, atomic_write

INT_MAX = 2 ** 31 - 1  # sizes end up in int32 arrays


class UsageError(Exception):
  """A flag combination that cannot work: printed as one `memagent: error:` line, exit 2."""


def _fail(msg: str):
  raise UsageError(msg)


MEMAGENT_ONLY = ("chunk_tokens", "memory_tokens", "block_chunks", "final_template", "show_memory")
AGENT_FLAGS = ("chunk_tokens", "memory_tokens", "answer_tokens", "block_chunks", "final_template")
AGENT_DEFAULTS = base_config.get_config().agent  # the one place reader defaults live


def _check_flags(args):
  """Flags that would do nothing with the chosen method are errors, not silently ignored."""
  if args.method == "direct":
    used = [f for f in MEMAGENT_ONLY if getattr(args, f, None) not in (None, False)]
    if used:
      _fail(f"--{used[0].replace('_', '-')} has no effect with --method direct")
  elif args.truncate:
    _fail("--truncate applies to --method direct only (the memory agent reads everything)")


def agent_config(args):
  """configs/base.py's `agent` section with the flags that were given."""
  a = base_config.get_config().agent
  a.kind = args.method
  for f in AGENT_FLAGS:
    if getattr(args, f) is not None:
      a[f] = getattr(args, f)
  return a


def _reader(args, policy):
  return assembly.build_reader(agent_config(args), policy, training=False, truncate=args.truncate)


def _load(args):
  t0 = time.perf_counter()
  policy = mj.load_policy(args.model, dtype=args.dtype)
  print(f"[memagent] loaded {args.model} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
  return policy


def cmd_answer(args) -> int:
  """Streams the document (file or stdin) through the reader and prints the answer."""
  _check_flags(args)
  policy = _load(args)
  reader = _reader(args, policy)
  t0 = time.perf_counter()
  kw = dict(from_files=True)
  if args.method == "memagent":
    kw.update(progress=not args.quiet, keep_prompts=False)
  res = reader.answer_batch([args.question], [args.doc], temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed, **kw)[0]
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


def default_eval_out(args) -> str:
  """Default predictions file: under runs/ (git-ignored), never loose in the current directory."""
  return os.path.join("runs", "eval", f"eval_{args.task}_{args.length}_{args.method}.jsonl")


def cmd_eval(args, *, make_samples=tasks.make_samples, make_reader=_reader) -> int:
  """Generates the task at the length, runs the reader, prints accuracy, writes JSONL.

  Finished batches go to `<out>.partial` as they come; `<out>` is replaced only on success.
  make_samples / make_reader: where samples and the reader come from (as `tasks.make_samples`, `_reader`)."""
  _check_flags(args)
  out = args.out or default_eval_out(args)
  if os.path.isdir(out):
    raise IsADirectoryError(f"--out {out} is a directory; pass a file name for the JSONL")
  policy = _load(args)
  samples = make_samples(args.task, args.length, args.n, args.data_seed, policy._require_tokenizer(),
                         args.data_dir, chunk_tokens=agent_config(args).chunk_tokens)
  reader = make_reader(args, policy)
  args.partial = evaluation.partial_path(out)  # named by the main thread if interrupted
  summary = evaluation.run_eval(reader, args.task, samples, out, batch_size=args.batch_size,
                                sampling=evaluation.Sampling(args.temperature, args.top_p, args.seed),
                                progress=not args.quiet)
  summary.update(method=args.method, length=args.length, model=args.model, predictions=out)
  print(json.dumps(summary))
  unit = "documents" if args.task in tasks.BUILT_QA_TASKS else "tokens"
  print(f"{args.task} @ {args.length} {unit}, {args.method}: {evaluation.format_scores(args.task, summary)} "
        f"(n={summary['n']}); predictions in {out}", file=sys.stderr)
  return 0


def _int_list(text: str) -> list[int]:
  try:
    values = [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
  if not values or min(values) < 1:
    raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}")
  return values


def cmd_build_ruler_hotpotqa(args) -> int:
  """Builds RULER-HotpotQA into --out and writes its table of lengths and gold positions."""
  ids = None
  if args.ids:
    with open(args.ids, encoding="utf-8") as f:
      ids = [line.strip() for line in f if line.strip()]
  tokenizer = None if args.tokenizer == "none" else loading.load_tokenizer(args.tokenizer)
  manifest = ruler_hotpotqa.build_set(
      args.input, args.out, ruler_hotpotqa.SetSpec(num_docs=args.num_docs, n=args.n, seed=args.seed, ids=ids),
      tokenizer=tokenizer, tokenizer_name=args.tokenizer,
      progress=lambda n: print(f"[memagent] building {n} documents", file=sys.stderr))
  flags = [f"--input={args.input}", f"--out={args.out}", f"--n={args.n}", f"--seed={args.seed}",
           f"--tokenizer={args.tokenizer}"]
  flags += [f"--num-docs={','.join(map(str, args.num_docs))}"] if args.num_docs else []
  flags += [f"--ids={args.ids}"] if args.ids else []
  table = ruler_hotpotqa.build_table(manifest, command="memagent build-ruler-hotpotqa " + " ".join(flags))
  if args.table:
    with atomic_write(args.table) as f:
      f.write(table)
  print(table)
  return 0


def cmd_export(args) -> int:
  """Exports the params of a checkpoint step (latest complete one by default) to an HF dir.

  Written beside --out and swapped in on success: a failed export leaves --out as it was."""
  out = args.out
  if os.path.exists(out) and not os.path.isdir(out):
    raise NotADirectoryError(f"--out {out} exists and is not a directory")
  if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(os.path.join(out, "config.json")):
    raise FileExistsError(f"--out {out} is a non-empty directory without config.json; export "
                          "replaces the whole directory, so pass a new or empty one")
  with atomic_directory(out) as tmp:
    step = export.export_checkpoint(args.ckpt, tmp, step=args.step, dtype=args.dtype)
  print(f"[memagent] exported step {step} of {args.ckpt} to {out}", file=sys.stderr)
  return 0


def load_config(spec: str, overrides: list[str]):
  """A training config file[:variant] with `--config.<key>=<value>` overrides applied (as train.py takes);
  a mistyped key is an error naming the nearest valid one."""
  cfg = config_overrides.load_config_file(spec)
  for item in overrides:
    if not item.startswith("--config.") or "=" not in item:
      _fail(f"unrecognized argument {item!r} (overrides look like --config.rl.clip_high=0.28)")
    key, text = item[len("--config."):].split("=", 1)
    config_overrides.check_key(cfg, key)
    *parents, leaf = key.split(".")
    node = cfg
    for name in parents:
      node = node[name]
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text  # a bare word: a string
    old = node[leaf]
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    try:
      node[leaf] = value
    except TypeError as e:
      _fail(f"--config.{key}={text}: {e}")
  return cfg


def cmd_compile(args) -> int:
  """Compiles the config's step for the topology: a table on stdout, JSON with --json; exit 3 when the
  step does not fit (a program's own peak plus what the trainer holds beside it)."""
  cfg = load_config(args.config, args.overrides)
  topology = tpu_targets.parse_topology(args.topology, args.slices)
  programs = tuple(args.programs.split(","))
  unknown = set(programs) - {"rollout", "answer", "logprobs", "update"}
  if unknown:
    _fail(f"--programs: unknown {sorted(unknown)}; choose from rollout, answer, logprobs, update")
  try:
    assume = None
    if args.keep_rate is not None:
      try:
        assume = gated_estimate.GatedAssumption(keep_rate=args.keep_rate, form_tokens=args.form_tokens,
                                                buckets=max(cfg.agent.decode_buckets, 1))
      except ValueError as e:
        _fail(str(e))
    options = dict(args.xla_options)
    try:
      report = compile_report.compile_step(cfg, topology, programs=programs, progress=not args.quiet, assume=assume,
                                           compiler_options=options)
    except RuntimeError as e:
      if options and "compile option" in str(e):  # XLA refused an option: name it, no traceback
        _fail(f"--xla-option: {str(e).splitlines()[0]}")
      raise
    if args.json:
      compile_report.write_json(report, args.json)
    print(compile_report.format_table(report), flush=True)
    compile_report.check_fits(report)
  except compile_report.DoesNotFitError as e:
    print(f"memagent compile: does not fit: {e}", file=sys.stderr)
    return 3
  return 0


def _xla_option(item: str) -> tuple[str, object]:
  """argparse type: KEY=VALUE -> (key, value), true/false as booleans."""
  key, sep, value = item.partition("=")
  if not sep or not key:
    raise argparse.ArgumentTypeError(f"{item!r}: write KEY=VALUE, e.g. xla_tpu_enable_latency_hiding_scheduler=false")
  return key, {"true": True, "false": False}.get(value.lower(), value)


def _int_flag(lo: int, hi: int = INT_MAX):
  """argparse type: an integer in [lo, hi], else an error with the value and the range
  (argparse prefixes `argument --flag:`)."""
  def parse(text: str) -> int:
    try:
      v = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}], got {text!r}") from None
    if not lo <= v <= hi:
      raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}], got {v}")
    return v
  return parse


def _float_flag(lo: float, hi: float, lo_open: bool = False):
  """argparse type: a finite float in [lo, hi] (or (lo, hi] with lo_open)."""
  rng = f">= {lo:g}" if hi == math.inf else f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
  def parse(text: str) -> float:
    try:
      v = float(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"must be a finite number {rng}, got {text!r}") from None
    if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
      raise argparse.ArgumentTypeError(f"must be a finite number {rng}, got {text}")
    return v
  return parse


def _debug_flag(p: argparse.ArgumentParser, top: bool = False):
  # On subcommands too, without overwriting a top-level `memagent --debug answer`.
  p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                 help="show the Python traceback of an error")


def _common(p: argparse.ArgumentParser):
  p.add_argument("--model", default="smollm2-135m-instruct",
                 help="embedded default, preset/hub id, random:<preset>, HF directory or .gguf file")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--method", default="memagent", choices=["memagent", "direct"])
  d = AGENT_DEFAULTS
  p.add_argument("--chunk-tokens", type=_int_flag(1), help=f"memagent: tokens per chunk (default {d.chunk_tokens})")
  p.add_argument("--memory-tokens", type=_int_flag(1),
                 help=f"memagent: memory cap in tokens (default {d.memory_tokens})")
  p.add_argument("--answer-tokens", type=_int_flag(1), help=f"final answer cap in tokens (default {d.answer_tokens})")
  p.add_argument("--block-chunks", type=_int_flag(1),
                 help=f"memagent: scan steps compiled per block (default {d.block_chunks})")
  p.add_argument("--final-template", choices=["boxed", "eval"],
                 help=f"memagent: final prompt (default {d.final_template})")
  p.add_argument("--truncate", action="store_true", help="direct: centre-truncate to the context")
  p.add_argument("--temperature", type=_float_flag(0.0, math.inf), default=0.0,
                 help="0 = greedy")
  p.add_argument("--top-p", type=_float_flag(0.0, 1.0, lo_open=True), default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--quiet", action="store_true", help="no progress bar")
  _debug_flag(p)


class _Parser(argparse.ArgumentParser):
  """argparse with the CLI's one-line error form (still exit code 2)."""

  def error(self, message):
    self.exit(2, f"memagent: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog="memagent", description=__doc__)
  _debug_flag(parser, top=True)
  sub = parser.add_subparsers(dest="command", required=True)
  a = sub.add_parser("answer", help="answer a question about a document of any length")
  a.add_argument("--doc", required=True, help="UTF-8 text file, or - for stdin")
  a.add_argument("--question", required=True)
  a.add_argument("--show-memory", action="store_true", help="print the memory after each chunk")
  _common(a)
  a.set_defaults(func=cmd_answer)
  e = sub.add_parser("eval", help="accuracy on a RULER or long-QA task at a length")
  e.add_argument("--task", required=True, help="niah_single_1 .. fwe, squad / hotpotqa, ruler_hotpotqa (a built "
                                                 "set), or jsonl (your own questions, one JSON object a line)")
  e.add_argument("--length", type=_int_flag(1), required=True,
                 help="context tokens per sample (ruler_hotpotqa: documents, a length of the built set)")
  e.add_argument("--n", type=_int_flag(1), default=16, help="number of samples")
  e.add_argument("--data-seed", type=int, default=0)
  e.add_argument("--data-dir", help="squad/hotpotqa: directory (or file) of the JSON corpus; jsonl: the file; "
                                    "ruler_hotpotqa: the built set's directory")
  e.add_argument("--batch-size", type=_int_flag(1), default=4)
  e.add_argument("--out", help="JSONL of every prediction (default runs/eval/eval_<task>_<length>_<method>"
                               ".jsonl); finished batches are kept in <out>.partial until the run succeeds")
  _common(e)
  e.set_defaults(func=cmd_eval)
  b = sub.add_parser("build-ruler-hotpotqa", help="build the paper's RULER-HotpotQA test set (eval_<docs>.json "
                                                   "per length + manifest.json) from a HotpotQA dev JSON")
  b.add_argument("--input", required=True, help="hotpot_dev_distractor_v1.json (HotpotQA dev, distractor setting)")
  b.add_argument("--out", required=True, help="directory of the built set")
  b.add_argument("--num-docs", type=_int_list, help="documents per sample, comma-separated (default the paper's "
                                                    "50,100,...,6400, and 12800,25600 when the pool allows)")
  b.add_argument("--n", type=_int_flag(1), default=ruler_hotpotqa.PAPER_QUESTIONS, help="questions, drawn by --seed")
  b.add_argument("--ids", help="file of HotpotQA _ids to ask instead (one a line), e.g. the paper's filtered 128")
  b.add_argument("--seed", type=int, default=0, help="questions drawn, padding and order")
  b.add_argument("--tokenizer", default=loading.EMBEDDED_DEFAULT,
                 help="tokenizer source that measures the tokens (load_tokenizer), or none")
  b.add_argument("--table", help="also write the markdown table to this file")
  _debug_flag(b)
  b.set_defaults(func=cmd_build_ruler_hotpotqa)
  x = sub.add_parser("export", help="write a training checkpoint as a transformers model directory")
  x.add_argument("--ckpt", required=True, help="checkpoint directory written by training")
  x.add_argument("--out", required=True, help="output directory (config.json + model.safetensors), "
                                              "replaced whole on success")
  x.add_argument("--step", type=_int_flag(0), help="checkpoint step (default: the latest complete one)")
  x.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  _debug_flag(x)
  x.set_defaults(func=cmd_export)
  c = sub.add_parser("compile", help="compile a training config's RL step for a TPU pod on this machine: "
                                     "each program's memory beside what the trainer holds (the step's peak), FLOPs, "
                                     "collectives and a roofline time per chip")
  c.add_argument("--config", required=True, help="training config file[:variant], e.g. "
                                                 "configs/memagent_qwen2_5_7b.py; --config.<key>=<value> overrides")
  c.add_argument("--topology", required=True, help="TPU slice as pod users name it: v5p-64, v5e-256, v6e-8, "
                                                   "v4-32, tpu7x-32, or <chip>:<AxB[xC]>")
  c.add_argument("--slices", type=_int_flag(1), default=1, help="multi-slice: this many slices of --topology")
  c.add_argument("--json", help="also write the report as JSON to this file")
  c.add_argument("--programs", default="rollout,answer,logprobs,update",
                 help="comma-separated subset of rollout, answer, logprobs, update (each kind: every "
                      "distinct program of it the step runs)")
  c.add_argument("--assume.keep_rate", dest="keep_rate", type=float, default=None,
                 help="gated memory: the share of memory turns that keep the memory; the rollout is re-costed "
                      "with its writing rows compacted into agent.decode_buckets sizes (experiment/gated_estimate.py)")
  c.add_argument("--assume.form_tokens", dest="form_tokens", type=_int_flag(1), default=3,
                 help="tokens of the keep form <keep> in the model's tokenizer (default 3, as '<', 'keep', '>'; count it with yours)")
  c.add_argument("--xla-option", dest="xla_options", action="append", default=[], metavar="KEY=VALUE",
                 type=_xla_option,
                 help="an XLA compiler option for every program (repeatable), e.g. "
                      "xla_tpu_enable_latency_hiding_scheduler=false: what a flag you would run with changes")
  c.add_argument("--quiet", action="store_true", help="no progress bar")
  _debug_flag(c)
  c.set_defaults(func=cmd_compile)
  return parser


def _is_user_error(e: BaseException) -> bool:
  """Bad input rather than a bug: ValueError (the project's load, budget and document errors),
  OSError, KeyError("unknown ..."), CheckpointCorruptError."""
  if isinstance(e, (UsageError, ValueError, OSError)):  # OSError: FileNotFound, IsADirectory, ...
    return True
  if isinstance(e, KeyError):  # the project's lookups raise KeyError("unknown <kind> ...")
    return len(e.args) == 1 and isinstance(e.args[0], str) and e.args[0].startswith("unknown ")
  return isinstance(e, (checkpointing.CheckpointCorruptError, tpu_targets.LibtpuMissingError))


def _message(e: BaseException) -> str:
  text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
  return " ".join(str(text).split()) or type(e).__name__  # one line


def _run_in_worker(func, args):
  """Runs func(args) in a daemon thread; the main thread waits in short slices so Ctrl-C is
  handled at once even while the worker sits inside a long compiled XLA call."""
  box = {}

  def work():
    try:
      box["result"] = func(args)
    except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
      box["error"] = e

  worker = threading.Thread(target=work, name=f"memagent-{args.command}", daemon=True)
  worker.start()
  while worker.is_alive():
    worker.join(0.05)
  if "error" in box:
    raise box["error"]
  return box["result"]


def _interrupted(args):
  """Ctrl-C: outputs are already flushed batch by batch; exit now without waiting for XLA."""
  kept = getattr(args, "partial", None)
  note = f" (finished predictions kept in {kept})" if kept and os.path.exists(kept) else ""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os.write(2, f"memagent: interrupted{note}\n".encode())
  os._exit(130)


def main(argv=None, *, commands: dict | None = None) -> int:
  """Parses argv and runs the command: user errors are one `memagent: error:` line (exit 2),
  internal errors one line too (exit 1); --debug adds the traceback; Ctrl-C exits 130.
  commands: {name: func(args) -> exit code} run in place of the built-in subcommands of those names."""
  args, extra = build_parser().parse_known_args(argv)
  if args.command == "compile":
    args.overrides = extra
  elif extra:
    build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
  try:
    return _run_in_worker((commands or {}).get(args.command, args.func), args)
  except KeyboardInterrupt:
    _interrupted(args)
  except SystemExit:
    raise
  except BaseException as e:  # noqa: BLE001 - the CLI's error contract
    if args.debug:
      traceback.print_exception(e, file=sys.stderr)
    if _is_user_error(e):
      print(f"memagent: error: {_message(e)}", file=sys.stderr)
      raise SystemExit(2) from None
    print(f"memagent: internal error: {type(e).__name__}: {_message(e)} (run with --debug for the "
          "traceback)", file=sys.stderr)
    raise SystemExit(1) from None


if __name__ == "__main__":
  sys.exit(main())
