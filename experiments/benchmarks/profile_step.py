"""Where the time goes: one toy RL step and one evaluation batch of the length sweep, split into
rollout (prefill / decode / sampling / host), update (log-prob passes / forward / backward /
optimizer / host) and evaluation rows, with compilation reported apart.

  python -m experiments.benchmarks.profile_step --config=configs/toy_memagent.py:rl,lookup \\
    --config.model.source=experiments/data/toy_base_lookup --config.train.steps=4 --config.data.phases="" \\
    --config.rl.dynamic_sampling=false --config.eval.every=0 --config.train.progress=false \\
    --out=docs/results/profile_step.md

The RL step is `Trainer.train_step` of the config, as `experiments.train` runs it; the sweep batch is
what `experiments.toy_reproduction` evaluates at --sweep_multiple x (one batch of its batch size, RL
config's agent and sampling, the lookup world's documents). Totals and the host rows are measured in
the real programs (the trainer's rollout/update seconds, the agent's DeviceClock, the step programs
timed in place); a compiled program's seconds are split by the shares its pieces take when the same
program and its pieces run in isolation at the same inputs, and what the pieces leave is a row of its
own ("rest ...").
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import shlex
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from configs import toy_memagent
from experiments.toy_reproduction import SCALES
from memagent_jax.agent import recurrence
from memagent_jax.agent.recurrence import pack_left
from memagent_jax.data import tasks, toy
from memagent_jax.evaluation.evaluate import Sampling, run_eval
from memagent_jax.experiment.assembly import build_experiment, load_reader
from memagent_jax.models.kv_cache import KVCache
from memagent_jax.policy import sampling
from memagent_jax.rl import losses
from memagent_jax.rl import update as upd
from memagent_jax.rl.trainer import StepPrograms
from memagent_jax.runtime import parallel
from memagent_jax.runtime.atomic_io import atomic_write

_CONFIG = config_flags.DEFINE_config_file("config", "configs/toy_memagent.py:rl,lookup", "RL config[:variant]",
                                          lock_config=True)
_MEASURED = flags.DEFINE_integer("measured_steps", 2, "RL steps timed after the first (compiling) one")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timings of each isolated piece (median; the first call compiles)")
_SWEEP_SOURCE = flags.DEFINE_string("sweep_source", "experiments/data/toy_base_lookup", "the reader's weights")
_SWEEP_WORLD = flags.DEFINE_enum("sweep_world", "lookup", list(toy_memagent.WORLDS), "the sweep's world")
_SWEEP_MULTIPLE = flags.DEFINE_integer("sweep_multiple", 256, "document length / training length")
_SWEEP_BATCH = flags.DEFINE_integer("sweep_batch", SCALES["full"]["batch"], "documents per batch")
_SWEEP_SEED = flags.DEFINE_integer("sweep_seed", 1000, "evaluation seed (toy_reproduction --eval_seed)")
_PARTS = flags.DEFINE_list("parts", ["rl", "sweep"], "what to profile: rl, sweep")
_OUT = flags.DEFINE_string("out", None, "write the table here (.md) and the chart beside it (.png)")

# (key, phase, row, how the row is measured). "in-situ x share": the seconds the program took inside the
# real step times the piece's share of the same program timed whole and in pieces in isolation (same inputs)
ROWS = (
    ("prefill", "rollout", "prefill (memory-update and final-answer prompts)",
     "in-situ memory/answer block seconds x share of `sampling.prefill` at the same [B, W] prompts (template "
     "prefix cache as in situ) x active scan steps"),
    ("decode", "rollout", "decode: one-token model forward + logits",
     "in-situ x share of the model's decode step (fori_loop from the prefilled cache) x while-loop iterations"),
    ("sampling", "rollout", "sampling (`_pick`: temperature, top-p sort, categorical)",
     "in-situ x share of `_pick` on the same [B, V] logits x while-loop iterations"),
    ("rollout_rest", "rollout", "rest of the compiled blocks + copies to host",
     "in-situ x what the three pieces leave of the isolated blocks (scan, prompt packing, lax.cond, KV and "
     "output writes, loop control); the answer-block share also carries the copies of outputs to the host"),
    ("agent_host", "rollout", "host: agent (chunking, tokenising; results: Conversation objects, memory texts)",
     "in situ: `answer_batch` / `rollout_slots` wall minus its DeviceClock seconds"),
    ("collector_host", "rollout", "host: rewards, advantages, training rows (RL) / scoring, JSON rows (sweep)",
     "in situ: rollout_seconds (RL) or `run_eval` wall (sweep) minus the agent calls' wall"),
    ("logprobs", "update", "reference / old log-prob passes (`batch_logprobs`)",
     "in situ: the step's program timed to completion"),
    ("forward", "update", "update forward (loss, no gradient)",
     "in-situ `update_step` x share of a scan of `_micro_loss` over the micro-batches (same batch, spec, prefix)"),
    ("backward", "update", "update backward", "in-situ `update_step` x share of (forward + gradient) - forward"),
    ("optimizer", "update", "optimizer (grad norm, clip, AdamW, apply)",
     "in-situ `update_step` x share of the optimizer tail alone"),
    ("update_rest", "update", "rest of `update_step`", "in-situ `update_step` x what the three pieces leave"),
    ("update_host", "update", "host: mini-batching, upload, prefix check, learning rate",
     "in situ: update_seconds minus the two program rows"),
    ("after", "step", "after the update: finite check, policy sync, metrics",
     "in situ: step_seconds - rollout_seconds - update_seconds"),
)

SHORT = dict(prefill="prefill", decode="decode (forward)", sampling="sampling", rollout_rest="rest of compiled blocks",
             agent_host="host: agent", collector_host="host: rewards, rows / scoring", logprobs="ref/old log-probs",
             forward="update forward", backward="update backward", optimizer="optimizer",
             update_rest="rest of update_step", update_host="host: update", after="after update")


class CompileSeconds:
  """Seconds jax spends tracing, lowering and compiling (jax.monitoring events), summed."""
  EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
            "/jax/core/compile/backend_compile_duration")

  def __init__(self):
    self.seconds = 0.0
    jax.monitoring.register_event_duration_secs_listener(self._on)

  def _on(self, event, duration, **_):
    if event in self.EVENTS:
      self.seconds += duration


COMPILE = None  # one listener per process


def compile_clock() -> CompileSeconds:
  global COMPILE
  COMPILE = COMPILE or CompileSeconds()
  return COMPILE


def median_seconds(fn, repeats: int, setup=tuple) -> float:
  """Median wall seconds of fn(*setup()) run to completion (setup untimed: fresh inputs for a program
  that donates them); a first call compiles and is not counted."""
  jax.block_until_ready(fn(*setup()))
  times = []
  for _ in range(max(1, repeats)):
    args = jax.block_until_ready(setup())
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


class AgentProbe:
  """Times a MemAgent in place: each `answer_batch` / `rollout_slots` call (evaluation / RL), each memory
  block run to completion (the host waits for its outputs right after anyway), the while-loop
  iterations those blocks ran."""

  def __init__(self, agent):
    self.agent = agent
    self.reset()
    block, answer, slots = agent.memory_block, agent.answer_batch, agent.rollout_slots

    def memory_block(*args, **kw):
      t = time.perf_counter()
      rows, outs = jax.block_until_ready(block(*args, **kw))
      self.s["memory_block"] += time.perf_counter() - t
      active, length = jax.device_get((outs.active, outs.response_len))  # [K, B]
      for k in np.flatnonzero(active.any(axis=1)):
        self.n["mem_steps"] += 1
        self.n["mem_iters"] += int(length[k][active[k]].max())  # the loop runs until its last row stops
      self.n["memory_blocks"] += 1
      self.last_block = dict(args=args, kw=kw, rows_out=rows)
      return rows, outs

    def timed(call, answer_lengths):
      def run(*args, **kw):
        t, d = time.perf_counter(), agent.device_clock.seconds
        out = call(*args, **kw)
        self.s["agent_call"] += time.perf_counter() - t
        self.s["agent_device"] += agent.device_clock.seconds - d
        self.n["answer_calls"] += 1
        self.n["answer_iters"] += int(max(answer_lengths(out)))
        self.n["rows"] = len(out)
        return out
      return run

    agent.memory_block = memory_block  # this instance only
    agent.answer_batch = timed(answer, lambda results: [len(r.conversations[-1].response_ids) for r in results])
    agent.rollout_slots = timed(slots, lambda out: (out.response_len * out.is_final).sum(1))

  def reset(self):
    self.s, self.n = collections.defaultdict(float), collections.defaultdict(int)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_size"))
def _prefill(graphdef, state, tokens, valid, prefix, *, cache_size):
  return sampling.prefill(nnx.merge(graphdef, state), tokens, valid, cache_size=cache_size, prefix=prefix)


@functools.partial(jax.jit, static_argnames=("graphdef", "n"))
def _decode_forward(graphdef, state, logits, cache, pos, *, n):
  """n decode steps of the model alone (forward of one token per row + logits) from a prefilled cache;
  each step's token is the argmax of the last logits, so nothing is hoisted out of the loop."""
  model = nnx.merge(graphdef, state)
  ones = jnp.ones((logits.shape[0], 1), bool)

  def body(_, carry):
    cache, pos, x = carry
    h, cache = model(jnp.argmax(x, axis=-1).astype(jnp.int32)[:, None], pos[:, None], ones, cache)
    return cache, pos + 1, model.logits(h[:, 0])
  return jax.lax.fori_loop(0, n, body, (cache, pos, logits))[2]


@functools.partial(jax.jit, static_argnames=("n",))
def _picks(logits, keys, decode, *, n):
  def body(i, carry):  # each pick reads the last one's output: nothing is hoisted out of the loop
    x, total = carry
    tok, lp, _ = sampling._pick(x, sampling.fold_rows(keys, i.astype(jnp.uint32)), decode)
    return x + 1e-6 * lp[:, None], total + tok
  return jax.lax.fori_loop(0, n, body, (logits, jnp.zeros(logits.shape[:1], jnp.int32)))


@dataclasses.dataclass(frozen=True)
class PromptBatch:
  """One packed batch of prompts, as the agent prefills it: what `generation_parts` times (the memory
  block's and the answer block's prompts differ in all three)."""
  tokens: jax.Array  # [B, P] left-padded prompt ids (`pack_left`)
  valid: jax.Array  # [B, P] True on real tokens
  prefix: KVCache | None = None  # `sampling.prefix_cache` of the ids every row starts with, or None


def generation_parts(graphdef, state, prompts: PromptBatch, *, keys, decode, n, repeats):
  """Isolated seconds of one prompt batch [B, P]: its prefill, and per new token (n of them) the model's
  decode step and the sampling pick."""
  tokens, valid, prefix = prompts.tokens, prompts.valid, prompts.prefix
  b, p = tokens.shape
  prefill = median_seconds(lambda: _prefill(graphdef, state, tokens, valid, prefix, cache_size=p + n), repeats)
  logits, cache = _prefill(graphdef, state, tokens, valid, prefix, cache_size=p + n)
  pos = jnp.sum(valid, axis=1).astype(jnp.int32)
  decode_s = median_seconds(lambda: _decode_forward(graphdef, state, logits, cache, pos, n=n), repeats) / n
  picks = 32
  pick = median_seconds(lambda: _picks(logits, keys, decode, n=picks), repeats) / picks
  return dict(prefill=prefill, decode=decode_s, sampling=pick, width=p, batch=b)


def _fixed(piece, b):
  return jnp.broadcast_to(piece[None, :], (b, piece.shape[0])), jnp.full((b,), piece.shape[0])


def _shares(total: float, parts: dict) -> dict:
  """parts of an isolated program's `total` seconds as fractions, "rest" what they leave."""
  out = {k: v / total for k, v in parts.items()}
  out["rollout_rest"] = 1.0 - sum(out.values())
  return out


def generation_iso(probe: AgentProbe, mesh, repeats: int) -> dict:
  """Shares of prefill / decode / sampling / rest in the memory block and the answer block, each timed
  whole and in pieces in isolation, at the inputs of the last memory block `probe` saw (the current
  weights: a step's own may have been donated to its update)."""
  agent, kw = probe.agent, probe.last_block["kw"]
  gd, state = agent.policy.graphdef, agent.policy.state
  rows, block, spec, decode, pieces = kw["rows"], kw["block"], kw["spec"], kw["decode"], kw["pieces"]
  b = rows.memory.shape[0]
  with parallel.trace_mesh(mesh):
    whole = lambda: recurrence.memory_block(gd, state, **kw)
    mb_s = median_seconds(whole, repeats)
    outs = whole()[1]
    active, length = jax.device_get((outs.active, outs.response_len))
    steps = [k for k in range(active.shape[0]) if active[k].any()]
    iters = sum(int(length[k][active[k]].max()) for k in steps)
    prefix = sampling.prefix_cache(nnx.merge(gd, state), pieces[0]) if spec.reuse_prefix else None
    tokens, valid = pack_left([_fixed(pieces[0], b), (rows.question, rows.q_len), _fixed(pieces[1], b),
                               (rows.memory, rows.mem_len), _fixed(pieces[2], b),
                               (block.chunks[:, 0], block.lengths[:, 0]), _fixed(pieces[3], b)], spec.pad_id)
    keys = sampling.fold_rows(rows.keys, jnp.uint32(0))
    mem = generation_parts(gd, state, PromptBatch(tokens, valid, prefix), keys=keys, decode=decode,
                           n=spec.memory_tokens, repeats=repeats)
    final, out = agent._final_pieces, probe.last_block["rows_out"]
    answer = lambda: recurrence.answer_block(gd, state, pieces=final, rows=out, decode=decode, spec=spec)
    ab_s = median_seconds(answer, repeats)
    ab_iters = int(answer()[2].steps)
    tokens, valid = pack_left([_fixed(final[0], b), (out.question, out.q_len), _fixed(final[1], b),
                               (out.memory, out.mem_len), _fixed(final[2], b)], spec.pad_id)
    ans = generation_parts(gd, state, PromptBatch(tokens, valid), keys=keys, decode=decode,
                           n=spec.answer_tokens, repeats=repeats)
  mem_parts = dict(prefill=mem["prefill"] * len(steps), decode=mem["decode"] * iters, sampling=mem["sampling"] * iters)
  ans_parts = dict(prefill=ans["prefill"], decode=ans["decode"] * ab_iters, sampling=ans["sampling"] * ab_iters)
  return dict(memory=mem, answer=ans, memory_block_s=mb_s, answer_block_s=ab_s, memory_steps=len(steps),
              memory_iters=iters, answer_iters=ab_iters,
              memory_shares=_shares(mb_s, mem_parts), answer_shares=_shares(ab_s, ans_parts))


def rollout_rows(s: dict, n: dict, iso: dict) -> dict:
  """The rollout rows of one agent run from its in-situ seconds `s` (AgentProbe): the memory blocks'
  seconds split by the isolated memory block's shares, the rest of the agent's device seconds (the
  answer block and the copies to host) by the isolated answer block's."""
  mem, other = s["memory_block"], s["agent_device"] - s["memory_block"]
  out = {k: mem * iso["memory_shares"][k] + other * iso["answer_shares"][k] for k in iso["memory_shares"]}
  out["agent_host"] = s["agent_call"] - s["agent_device"]
  return out


def rollout_details(n: dict, s: dict, iso: dict) -> dict:
  mem, ans = iso["memory"], iso["answer"]
  f = lambda d: {k: round(v, 5) for k, v in d.items()}
  return dict(n, memory_block_s=s["memory_block"], agent_device_s=s["agent_device"],
              memory_prompt=f"[{mem['batch']}, {mem['width']}]", answer_prompt=f"[{ans['batch']}, {ans['width']}]",
              iso_memory_block=f(dict(seconds=iso["memory_block_s"], steps=iso["memory_steps"],
                                      iters=iso["memory_iters"], **iso["memory_shares"])),
              iso_answer_block=f(dict(seconds=iso["answer_block_s"], iters=iso["answer_iters"],
                                      **iso["answer_shares"])),
              iso_pieces=f({f"{k}_{p}": v[p] for k, v in (("memory", mem), ("answer", ans))
                            for p in ("prefill", "decode", "sampling")}))


@functools.partial(jax.jit, static_argnames=("graphdef", "spec", "grad"))
def _loss_pass(params, batch, prefix, *, graphdef, spec, grad: bool):
  """update_step's scans over width groups without the optimizer: the loss (grad=False) or loss + grads."""
  groups = batch if isinstance(batch, tuple) else (batch,)
  prefixes = prefix if isinstance(prefix, tuple) else (prefix,) * len(groups)
  denominator = upd.group_denominator([g.loss_mask for g in groups], spec.agg)
  grad_fn = jax.value_and_grad(upd._micro_loss, has_aux=True)
  carry = (jax.tree_util.tree_map(jnp.zeros_like, params), jnp.float32(0))
  for group, p in zip(groups, prefixes):
    def accumulate(carry, mb, p=p):
      grads, loss = carry
      if not grad:
        return (grads, loss + upd._micro_loss(params, mb, denominator, p, graphdef=graphdef, spec=spec)[0]), None
      (l, _), g = grad_fn(params, mb, denominator, p, graphdef=graphdef, spec=spec)
      return (jax.tree_util.tree_map(jnp.add, grads, g), loss + l), None
    carry, _ = jax.lax.scan(accumulate, carry, group)
  return carry if grad else carry[1]


@functools.partial(jax.jit, static_argnames=("tx",))
def _optimizer(params, opt_state, grads, *, tx):
  """update_step's tail: grad norm, the transform (clip + AdamW), apply, keep-if-finite."""
  finite = jnp.isfinite(optax.global_norm(grads))
  updates, new_state = tx.update(grads, opt_state, params)
  keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
  return keep(optax.apply_updates(params, updates), params), keep(new_state, opt_state)


def update_parts(captured: dict, params, opt_state, mesh, repeats: int) -> dict:
  """Shares of forward / backward / optimizer / rest in the captured `update_step` call, from the
  whole program and its pieces timed in isolation at the same inputs."""
  batch, kw = captured["batch"], captured["kw"]
  common = dict(graphdef=kw["graphdef"], spec=kw["spec"])
  prefix = kw.get("prefix")
  copies = lambda: jax.tree.map(jnp.copy, (params, opt_state))  # update_step donates them
  with parallel.trace_mesh(mesh):
    whole = median_seconds(lambda p, o: upd.update_step(p, o, batch, **kw), repeats, setup=copies)
    forward = median_seconds(lambda: _loss_pass(params, batch, prefix, grad=False, **common), repeats)
    both = median_seconds(lambda: _loss_pass(params, batch, prefix, grad=True, **common), repeats)
    grads = _loss_pass(params, batch, prefix, grad=True, **common)[0]
    opt = median_seconds(lambda: _optimizer(params, opt_state, grads, tx=kw["tx"]), repeats)
  shares = dict(forward=forward / whole, backward=(both - forward) / whole, optimizer=opt / whole)
  shares["update_rest"] = 1.0 - sum(shares.values())
  return dict(shares=shares, seconds=dict(update_step=whole, forward=forward, forward_backward=both, optimizer=opt))


def profile_rl(cfg, *, measured_steps: int, repeats: int) -> dict:
  """Runs 1 + measured_steps RL steps of cfg (the first compiles); rows are means over the steps
  that compiled nothing."""
  clock = compile_clock()
  s = collections.defaultdict(float)
  captured = {}

  def timed(name, fn):
    def run(*args, **kw):
      t = time.perf_counter()
      out = jax.block_until_ready(fn(*args, **kw))
      s[name] += time.perf_counter() - t
      if name == "update_step":
        captured.update(batch=args[2], kw=kw)
      return out
    return run

  programs = StepPrograms(batch_logprobs=timed("logprobs", upd.batch_logprobs),
                          update_step=timed("update_step", upd.update_step))
  with tempfile.TemporaryDirectory() as workdir:
    exp = build_experiment(cfg, workdir, programs=programs)
    trainer = exp.trainer
    probe = AgentProbe(exp.agent)
    steps, first = [], None
    for i in range(1 + measured_steps):
      probe.reset()
      s.clear()
      c0, t0 = clock.seconds, time.perf_counter()
      m = trainer.train_step()
      wall = time.perf_counter() - t0
      trainer.state.step += 1  # as Trainer.train does
      if m.updates == 0:
        raise ValueError("the profiled step ran no update: set --config.rl.dynamic_sampling=false")
      print(f"RL step {i + 1}: {wall:.1f} s", flush=True)
      rec = dict(wall=wall, compile=clock.seconds - c0, metrics=m, s=dict(s), n=dict(probe.n), ps=dict(probe.s))
      if i == 0:
        first = rec
      elif rec["compile"] > 0.05 * wall:
        print(f"step {i + 1} compiled for {rec['compile']:.1f} s: not counted", flush=True)
      else:
        steps.append(rec)
    if not steps:
      raise RuntimeError("every measured step compiled: raise --measured_steps")
    iso = generation_iso(probe, exp.mesh, repeats)
    totals = collections.defaultdict(float)
    for rec in steps:
      m = rec["metrics"]
      rows = rollout_rows(rec["ps"], rec["n"], iso)
      rows["collector_host"] = m.rollout.rollout_seconds - rec["ps"]["agent_call"]
      rows["logprobs"] = rec["s"].get("logprobs", 0.0)
      rows["update_host"] = m.update_seconds - rows["logprobs"] - rec["s"]["update_step"]
      rows["after"] = m.step_seconds - m.rollout.rollout_seconds - m.update_seconds
      rows["update_step"] = rec["s"]["update_step"]
      rows["step_seconds"], rows["wall"] = m.step_seconds, rec["wall"]
      for k, v in rows.items():
        totals[k] += v / len(steps)
    details = rollout_details(steps[-1]["n"], steps[-1]["ps"], iso)
    parts = update_parts(captured, trainer.state.params, trainer.state.opt_state, exp.mesh, repeats)
    in_situ = totals.pop("update_step")
    totals.update({k: in_situ * f for k, f in parts["shares"].items()})
    details["iso_update"] = {k: round(v, 4) for k, v in parts["seconds"].items()}
    groups = captured["batch"] if isinstance(captured["batch"], tuple) else (captured["batch"],)
    details.update(update_batch=" + ".join(f"{b.tokens.shape[0]} x [{b.tokens.shape[1]}, {b.tokens.shape[2]}]"
                                           for b in groups) + " tokens",
                   compile_step_wall=first["wall"], compile_seconds=first["compile"], measured=len(steps),
                   rollout_tokens=steps[-1]["metrics"].rollout.rollout_tokens)
    trainer.checkpointer.wait()
    trainer.lock.release()
  return dict(rows=dict(totals), total=totals["step_seconds"], wall=totals["wall"], details=details)


def profile_sweep(cfg, source: str, *, length: int, batch: int, seed: int, repeats: int) -> dict:
  """One evaluation batch of `batch` documents of `length` tokens, as the toy reproduction's sweep
  runs it (after its warm-up batch of 1x documents, which compiles the reader)."""
  clock = compile_clock()
  reader = load_reader(cfg, source, training=False)
  ev, task, chunk = cfg.eval, cfg.data.task, cfg.agent.chunk_tokens
  probe = AgentProbe(reader)
  warm = tasks.make_samples(task, toy.TRAIN_TOKENS, batch, seed + toy.TRAIN_TOKENS, reader.tokenizer,
                            chunk_tokens=chunk)
  c0, t0 = clock.seconds, time.perf_counter()
  reader.answer_batch([x["question"] for x in warm], [x["context"] for x in warm], temperature=ev.temperature,
                      top_p=ev.top_p, seed=seed)
  warm_wall, warm_compile = time.perf_counter() - t0, clock.seconds - c0
  print(f"sweep warm-up batch: {warm_wall:.1f} s", flush=True)
  t0 = time.perf_counter()
  samples = tasks.make_samples(task, length, batch, seed + length, reader.tokenizer, chunk_tokens=chunk)
  generate = time.perf_counter() - t0
  probe.reset()
  c0, t0 = clock.seconds, time.perf_counter()
  summary = run_eval(reader, task, samples, None, batch_size=batch,
                     sampling=Sampling(ev.temperature, ev.top_p, seed), progress=False)
  wall, compiled = time.perf_counter() - t0, clock.seconds - c0
  print(f"sweep batch: {wall:.1f} s", flush=True)
  iso = generation_iso(probe, None, repeats)
  rows = rollout_rows(probe.s, probe.n, iso)
  details = rollout_details(probe.n, probe.s, iso)
  rows["collector_host"] = wall - probe.s["agent_call"]
  details.update(warmup_wall=warm_wall, warmup_compile=warm_compile, documents_s=generate, compile_in_batch=compiled,
                 accuracy=summary["score"], doc_tokens=summary["mean_document_tokens"])
  return dict(rows=rows, total=wall, wall=wall, details=details)


def markdown(rl: dict | None, sweep: dict | None, *, command: str, sweep_desc: str) -> str:
  cols = [("RL step", rl), ("sweep batch", sweep)]
  fmt = lambda res, k: "-" if res is None or k not in res["rows"] else f"{res['rows'][k]:.2f}"
  share = lambda res, k: "-" if res is None or k not in res["rows"] else f"{100 * res['rows'][k] / res['total']:.1f}%"
  lines = ["| phase | row | " + " | ".join(f"{name} s | {name} %" for name, _ in cols) + " | how measured |",
           "|---|---|" + "---|---|" * len(cols) + "---|"]
  for key, phase, label, how in ROWS:
    lines.append(f"| {phase} | {label} | " + " | ".join(f"{fmt(r, key)} | {share(r, key)}" for _, r in cols)
                 + f" | {how} |")
  lines.append("| evaluation | held-out evaluation in the step | " + ("0.00 | 0% (eval.every=0)" if rl else "- | -")
               + " | " + ("all of the column | 100%" if sweep else "- | -") + " | the sweep batch is evaluation |")
  summed = lambda r: sum(r["rows"].get(k, 0) for k, *_ in ROWS)
  tot = lambda r: "-" if r is None else f"**{r['total']:.2f}** | {100 * summed(r) / r['total']:.1f}%"
  lines.append("| total | measured wall (step_seconds / run_eval) | " + " | ".join(tot(r) for _, r in cols)
               + " | rows sum to the share shown |")
  out = [f"Command: `{command}`", "", "\n".join(lines), ""]
  if rl:
    d = rl["details"]
    out.append(f"RL step: mean of {d['measured']} step(s) after the first; {d['rows']} trajectories per agent call, "
               f"{d['memory_blocks']} memory block(s) with {d['mem_steps']} active scan steps and {d['mem_iters']} "
               f"decode iterations, final answer {d['answer_iters']} iterations; prompts {d['memory_prompt']} "
               f"(memory update) and {d['answer_prompt']} (answer); update batch {d['update_batch']}; "
               f"{d['rollout_tokens']:.0f} rollout tokens. Compile: the first step took "
               f"{d['compile_step_wall']:.1f} s, "
               f"{d['compile_seconds']:.1f} s of it tracing and compiling (jax.monitoring), not in the table.")
  if sweep:
    d = sweep["details"]
    out.append(f"\nSweep batch: {sweep_desc}; {d['rows']} documents of {d['doc_tokens']} tokens, "
               f"{d['memory_blocks']} memory blocks, {d['mem_steps']} active scan steps, {d['mem_iters']} decode "
               f"iterations, answer {d['answer_iters']}; prompts {d['memory_prompt']} and {d['answer_prompt']}; "
               f"accuracy {100 * d['accuracy']:.1f}%. Not in the table: the warm-up batch (1x documents) "
               f"{d['warmup_wall']:.1f} s, {d['warmup_compile']:.1f} s of it compiling; generating the documents "
               f"{d['documents_s']:.1f} s; compiling inside the batch {d['compile_in_batch']:.2f} s.")
  return "\n".join(out) + "\n"


def plot(rl: dict | None, sweep: dict | None, path: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  parts = [(name, r) for name, r in (("one RL step", rl), ("one sweep batch", sweep)) if r]
  fig, axes = plt.subplots(1, len(parts), figsize=(6.5 * len(parts), 5.5), squeeze=False)
  for ax, (name, r) in zip(axes[0], parts):
    keys = [(k, label) for k, _, label, _ in ROWS if k in r["rows"]]
    vals = [r["rows"][k] for k, _ in keys]
    colors = ["tab:blue" if ph == "rollout" else "tab:orange" if ph == "update" else "tab:gray"
              for k, ph, *_ in ROWS if k in r["rows"]]
    ax.barh(range(len(keys)), vals, color=colors)
    ax.set_yticks(range(len(keys)), [SHORT[k] for k, _ in keys], fontsize=8)
    ax.invert_yaxis()
    for y, v in enumerate(vals):
      ax.text(max(v, 0), y, f" {v:.2f} s ({100 * v / r['total']:.0f}%)", va="center", fontsize=7)
    ax.set_xlabel("seconds")
    ax.set_title(f"{name}: {r['total']:.1f} s (blue rollout, orange update)", fontsize=9)
    ax.set_xlim(min(0, min(vals)), 1.35 * max(vals))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  compile_clock()
  rl = sweep = None
  if "rl" in _PARTS.value:
    rl = profile_rl(_CONFIG.value, measured_steps=_MEASURED.value, repeats=_REPEATS.value)
  sweep_cfg = toy_memagent.get_config(f"rl,full,{_SWEEP_WORLD.value}")
  length = toy.TRAIN_TOKENS * _SWEEP_MULTIPLE.value
  if "sweep" in _PARTS.value:
    sweep = profile_sweep(sweep_cfg, _SWEEP_SOURCE.value, length=length, batch=_SWEEP_BATCH.value,
                          seed=_SWEEP_SEED.value, repeats=_REPEATS.value)
  command = "python -m experiments.benchmarks.profile_step " + " ".join(
      a + '""' if a.endswith("=") else shlex.quote(a) for a in sys.argv[1:])
  desc = (f"{_SWEEP_MULTIPLE.value}x ({length} tokens), {_SWEEP_WORLD.value} world, reader {_SWEEP_SOURCE.value} "
          f"with configs/toy_memagent.py:rl,full,{_SWEEP_WORLD.value}'s agent and evaluation sampling")
  text = markdown(rl, sweep, command=command, sweep_desc=desc)
  print(text)
  if _OUT.value:
    png = os.path.splitext(_OUT.value)[0] + ".png"
    with atomic_write(_OUT.value) as f:
      f.write(text + f"\n![where the time goes]({os.path.basename(png)})\n")
    plot(rl, sweep, png)
    print(f"wrote {_OUT.value} and {png}")


if __name__ == "__main__":
  app.run(main)
