"""Evaluation: a task at a length -> samples -> MemAgent or direct reading -> scores + JSONL.

RULER tasks are scored with string_match_all (paper Eq. 7) on the extracted answer, or on the
whole response when it has none (RULER's convention); QA tasks with sub_em (what the paper's tables
call accuracy) on the extracted answer only (no \\boxed{} / "the answer is" = wrong), with EM and
token F1 beside it and, apart, the training verifier (boxed exact match, the RL reward); the toy task
(data.toy) with exact match of the extracted answer, sub_em beside it. `METRICS` names each score.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Iterable

import jax
import numpy as np
from tqdm.auto import tqdm

from memagent_jax.agent.gates import GATE_NAMES
from memagent_jax.data import ruler, tasks, toy
from memagent_jax.rl import rewards
from memagent_jax.runtime.process_gather import sum_over_processes, this_process_share
from memagent_jax.runtime.registry import Registry


def _toy_scores(result, answers):  # one-word answers: exact match of the extracted answer
  return {"score": rewards.exact_match(result.prediction, answers),
          "sub_em": rewards.sub_em(result.prediction, answers)}


def _ruler_scores(result, answers):
  return {"score": rewards.string_match_all(result.answer if result.prediction is None else result.prediction,
                                            answers)}


def _qa_scores(result, answers):
  p = result.prediction
  return {"score": rewards.sub_em(p, answers), "em": rewards.exact_match(p, answers), "f1": rewards.f1(p, answers),
          "verifier": rewards.memagent_verifier(result.answer, answers)}


# task name -> its metrics; a task missing here is an error, never silently scored by another metric
SCORERS: Registry = Registry("task metric")
for _names, _fn in ((toy.TASKS, _toy_scores), (ruler.TASKS, _ruler_scores),
                    (tasks.QA_TASKS + tasks.BUILT_QA_TASKS, _qa_scores)):
  for _name in _names:
    SCORERS.register(_name, _fn)


QA_METRICS = {"score": "sub_em (the paper's accuracy)", "em": "EM", "f1": "F1",
              "verifier": "training verifier (boxed exact match; not the paper's metric)"}
# task name -> {score key: what it is}, in report order: the task's headline "score" first
METRICS = {**{t: {"score": "exact match", "sub_em": "sub_em"} for t in toy.TASKS},
           **{t: {"score": "string_match_all (paper Eq. 7)"} for t in ruler.TASKS},
           **{t: QA_METRICS for t in tasks.QA_TASKS + tasks.BUILT_QA_TASKS}}


def score(task: str, result, answers: list[str]) -> dict[str, float]:
  """Scores an AgentResult against the reference answers with its task's metrics ("score" first)."""
  return scorer(task)(result, answers)


def scorer(task: str):
  return SCORERS.get(task)


def format_scores(task: str, summary: dict) -> str:
  """`sub_em (the paper's accuracy) 0.500, EM 0.250, F1 0.400; training verifier (...) 0.125`: the
  headline score first and named, the verifier apart, so a validation score is not read as the paper's."""
  names = METRICS.get(task, {"score": "score"})
  head = ", ".join(f"{label} {summary[k]:.3f}" for k, label in names.items() if k != "verifier" and k in summary)
  return head + (f"; {names['verifier']} {summary['verifier']:.3f}" if "verifier" in names and "verifier" in summary
                 else "")


def _batches(items: list, size: int) -> Iterable[list]:
  for i in range(0, len(items), size):
    yield items[i:i + size]


def partial_path(out_path: str) -> str:
  """Where run_eval keeps the finished batches of a run until it succeeds."""
  return out_path + ".partial"


def _write_all(fd: int, data: bytes):
  while data:  # one write per batch: no torn lines if the process is killed between batches
    data = data[os.write(fd, data):]


def _row(task: str, s: dict, r, scores: dict) -> str:
  return json.dumps({"task": task, "index": s.get("index"), "question": s["question"],
                     "answers": list(s["answers"]), "prediction": r.prediction, "answer": r.answer,
                     "boxed": r.boxed, **scores, "num_chunks": r.num_chunks,
                     "document_tokens": r.document_tokens, "decoded_tokens": r.decoded_tokens,
                     **({"gates": list(r.gates)} if getattr(r, "gates", None) is not None else {}),
                     "final_memory": r.memories[-1] if r.memories else None,
                     "memories": list(r.memories)}) + "\n"  # every chunk's: where a memory went wrong


# what reading a document cost, averaged over the documents in a summary
COST_KEYS = ("decoded_tokens_per_doc", "chunks_per_doc", "seconds_per_doc")


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How an evaluation samples its answers (greedy by default; the paper's validation: 0.7 / 0.95)."""
  temperature: float = 0.0
  top_p: float = 1.0
  seed: int = 0  # batch b samples with seed + b


def run_eval(reader, task: str, samples: list[dict], out_path: str | None, *, batch_size: int,
             sampling: Sampling = Sampling(), progress: bool = True, split_over_processes: bool = False) -> dict:
  """Runs `reader` (MemAgent or DirectReader) over samples; one JSON line per sample.

  Each finished batch is appended to `<out_path>.partial` (started afresh) as it completes, so
  a failed or interrupted run keeps what it computed; out_path is replaced by rename on success.
  split_over_processes (a MemAgent on a multi-process mesh): each process reads its contiguous
  share of every batch, each row sampled with the key it has in one process (seed + batch index,
  its row in the batch), and the scores are summed over processes; no JSONL (out_path None)."""
  if not samples:
    raise ValueError("no samples to evaluate: n must be >= 1")
  scorer(task)  # an unknown task fails before any document is read
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size}: must be >= 1")
  if split_over_processes and out_path:
    raise ValueError(f"run_eval split over processes writes no JSONL; got out_path={out_path}")
  if out_path and os.path.isdir(out_path):
    raise IsADirectoryError(f"eval output {out_path} is a directory; pass a file name for the JSONL")
  t0 = time.perf_counter()
  totals: dict[str, float] = {}
  partial = partial_path(out_path) if out_path else None
  fd = None
  if partial:
    os.makedirs(os.path.dirname(os.path.abspath(partial)), exist_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
  done = doc_tokens = 0
  cost = dict.fromkeys(COST_KEYS, 0.0)  # per-document cost totals (decoded tokens, chunks read, seconds)
  gate_counts: dict[str, float] = {}  # gated readers: memory turns per gate
  mine_total = len(samples) // jax.process_count() if split_over_processes else len(samples)
  bar = tqdm(total=mine_total, desc=f"eval {task}", unit="doc", disable=not progress)
  try:
    for b, batch in enumerate(_batches(samples, batch_size)):
      kw = {}
      if split_over_processes:  # rows of every process together: the one-process batch
        mine = this_process_share(len(batch), f"held-out batch {b} ({len(batch)} rows)")
        batch, kw = batch[mine], {"row_ids": np.arange(mine.start, mine.stop)}
      results = reader.answer_batch([s["question"] for s in batch], [s["context"] for s in batch],
                                    temperature=sampling.temperature, top_p=sampling.top_p,
                                    seed=sampling.seed + b, **kw)
      lines = []
      for s, r in zip(batch, results):
        scores = score(task, r, list(s["answers"]))
        doc_tokens += r.document_tokens
        for key, value in zip(COST_KEYS, (r.decoded_tokens, r.num_chunks, r.seconds)):
          cost[key] += value
        if getattr(r, "gates", None) is not None:  # the same four keys on every process
          gate_counts = gate_counts or dict.fromkeys(GATE_NAMES, 0.0)
          for g in r.gates:
            gate_counts[g] += 1
        for k, v in scores.items():
          totals[k] = totals.get(k, 0.0) + v
        lines.append(_row(task, s, r, scores))
      if fd is not None:
        _write_all(fd, "".join(lines).encode("utf-8"))
      done += len(batch)
      bar.update(len(batch))
      bar.set_postfix(acc=f"{totals.get('score', 0) / done:.3f}")
    if fd is not None:
      os.fsync(fd)
  finally:
    bar.close()
    if fd is not None:
      os.close(fd)
  if partial:
    os.replace(partial, out_path)  # only now is an earlier out_path replaced
  gate_keys = [f"gate/{g}" for g in gate_counts]
  if split_over_processes:
    totals = sum_over_processes({**totals, "document_tokens": doc_tokens, **cost,
                                 **{f"gate/{g}": n for g, n in gate_counts.items()}})
    doc_tokens = totals.pop("document_tokens")
    cost = {k: totals.pop(k) for k in COST_KEYS}
    gate_counts = {k[len("gate/"):]: totals.pop(k) for k in gate_keys}
  summary = {k: v / len(samples) for k, v in totals.items()}
  summary.update({k: v / len(samples) for k, v in cost.items()})
  turns = sum(gate_counts.values())
  summary.update({f"{g}_frac": gate_counts.get(g, 0.0) / turns for g in ("keep", "stop", "invalid")} if turns else {})
  summary.update(task=task, n=len(samples), mean_document_tokens=round(doc_tokens / len(samples)),
                 seconds=round(time.perf_counter() - t0, 2))
  return summary
