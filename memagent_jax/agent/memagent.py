"""`MemAgent`: reads documents chunk by chunk through the compiled recurrence and answers.

The host streams each document's chunks into fixed-size blocks of `block_chunks` scan steps,
carrying the memory (on device) from block to block, so any length runs at constant device
memory with a single compilation. All batch rows advance together; a row whose document has
ended is inactive for the remaining steps.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from memagent_jax.agent import chunking, gates
from memagent_jax.agent.placement import RowPlacement
from memagent_jax.agent.recurrence import (ChunkBlock, MemoryRows, RecurrenceSpec, StepOutputs, answer_block,
                                           memory_block)
from memagent_jax.agent.results import AgentResult, Conversation, ConversationSlots, RolloutSlots
from memagent_jax.runtime import parallel
from memagent_jax.runtime.device_clock import DeviceClock
from memagent_jax.text.templates import (FINAL_TEMPLATES, NO_MEMORY, TemplateSegments, answer_text_to_prediction,
                                          memory_template)
from memagent_jax.text import answers
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.policy.sampling import round_up, row_keys


def question_bucket(longest: int) -> int:
  """The padded question width: a power of two from 8 to 128, then a multiple of 128. Few widths
  (12 up to 1024 tokens) bound recompiles; short questions (a toy world's 7) waste few slots."""
  if longest <= 128:
    return max(8, 1 << max(0, longest - 1).bit_length())
  return round_up(longest, 128)


PREFIX_CACHE_CHOICES = ("auto", "on", "off")
PREFIX_CACHE_SHARE = 0.1  # "auto" reuses the template's opening piece from this share of the prompt


class ContextBudgetError(ValueError):
  """A prompt plus its generation cap does not fit the model's context window."""


def encode_question(tokenizer, question: str, *, index: int, budget: int) -> list[int]:
  """Question ids; an empty question or one over the budget is an error (never truncated)."""
  if not isinstance(question, str) or not question.strip():
    raise ValueError(f"question {index} is empty")
  chunking.check_text(question, f"question {index}")
  ids = tokenizer.encode(question)
  if len(ids) > budget:
    raise ValueError(f"question {index} has {len(ids)} tokens, over the question budget of "
                     f"{budget} tokens (questions are never truncated)")
  return ids


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReaderSpec:
  """How a MemAgent reads: its token budgets, templates, blocking and memory kind, checked once.
  The defaults are the released reader's (the trainer's come from a config's agent section)."""
  chunk_tokens: int  # document tokens per memory turn
  memory_tokens: int  # the memory's cap: a memory turn's generation budget
  answer_tokens: int  # the final answer's generation budget
  question_tokens: int = 1024  # the question's budget (longer questions are refused, never truncated)
  final_template: str = "boxed"  # a key of text.templates.FINAL_TEMPLATES
  block_chunks: int = 8  # scan steps per compiled memory block
  max_chunks: int | None = None  # training rollouts: centre-truncate documents to this many chunks
  template_prefix_cache: str = "auto"  # reuse the template's opening piece: "auto" | "on" | "off"
  memory: str = "overwrite"  # "overwrite" (MemAgent) | "gated" (a reply may keep the memory or stop)
  gate_forms: str = "keep"  # gated: the forms a reply may take ("keep" | "keep_stop")
  invalid_gate: str = "as_memory"  # gated: a reply in no form becomes the memory, or keeps the old one
  decode_buckets: int = 1  # memory turns run their busy rows in the smallest of these batch sizes

  def __post_init__(self):
    for name in ("chunk_tokens", "memory_tokens", "answer_tokens", "question_tokens", "block_chunks",
                 "decode_buckets"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name}={v!r} must be a positive integer")
    if self.final_template not in FINAL_TEMPLATES:
      raise ValueError(f"final_template={self.final_template!r}; choose one of {sorted(FINAL_TEMPLATES)}")
    if self.template_prefix_cache not in PREFIX_CACHE_CHOICES:
      raise ValueError(f"template_prefix_cache={self.template_prefix_cache!r}; choose one of {PREFIX_CACHE_CHOICES}")
    if self.max_chunks is not None and self.max_chunks < 1:
      raise ValueError(f"max_chunks={self.max_chunks!r} must be None (no truncation) or >= 1")
    if self.memory not in gates.MEMORY_KINDS:
      raise ValueError(f"memory={self.memory!r}; choose one of {gates.MEMORY_KINDS}")


class MemAgent:
  """MemAgent workflow around a `Policy`: memory updates over chunks, then a final answer.

  With a `mesh`, the batch's rows (and their memories) are split over its ("data", "fsdp") axes
  and over processes: each process passes its own questions and documents and gets its own
  results, while the policy's params stay sharded as in training."""

  # the compiled memory block (agent/recurrence.py) the reader runs; an instance may wrap its own
  memory_block = staticmethod(memory_block)
  answer_block = staticmethod(answer_block)

  # the reader's settings, read from its spec (one source: `agent.spec`)
  chunk_tokens = property(lambda self: self.spec.chunk_tokens)
  memory_tokens = property(lambda self: self.spec.memory_tokens)
  answer_tokens = property(lambda self: self.spec.answer_tokens)
  question_tokens = property(lambda self: self.spec.question_tokens)
  block_chunks = property(lambda self: self.spec.block_chunks)
  max_chunks = property(lambda self: self.spec.max_chunks)
  final_template = property(lambda self: self.spec.final_template)
  decode_buckets = property(lambda self: int(self.spec.decode_buckets))  # busy rows run in the smallest of these sizes

  # The documented call `mj.MemAgent(policy, chunk_tokens=, memory_tokens=, answer_tokens=)` names the
  # three budgets; `settings` are ReaderSpec's fields (or pass a ReaderSpec); the rest default to the
  # released reader (trainer: configs/base.py agent section).
  def __init__(self, policy, spec: ReaderSpec | None = None, *, mesh=None, **settings):
    if spec is not None and settings:
      raise TypeError(f"MemAgent takes a ReaderSpec or its fields as keywords, not both (got {sorted(settings)})")
    spec = spec if spec is not None else ReaderSpec(**settings)
    self.spec = spec
    self.policy = policy
    self.tokenizer = tok = policy._require_tokenizer()
    self.mesh = mesh
    self.memory_segments = TemplateSegments.build(tok, memory_template(spec.memory, spec.gate_forms))
    self.final_segments = TemplateSegments.build(tok, FINAL_TEMPLATES[spec.final_template])
    self._memory_pieces = tuple(jnp.asarray(p) for p in self.memory_segments.pieces)  # on device once
    self._final_pieces = tuple(jnp.asarray(p) for p in self.final_segments.pieces)
    self.initial_memory = np.asarray(tok.encode(NO_MEMORY), np.int32)
    self.memory_width = max(spec.memory_tokens, len(self.initial_memory))  # M: memory buffer width
    self.stop_tokens = tuple(policy.default_stop_tokens())
    # gated memory: a reply may keep the memory (or stop reading); None: every reply overwrites it
    self.gate = (gates.GateSpec.build(tok, forms=spec.gate_forms, invalid_gate=spec.invalid_gate,
                                      eos=self.stop_tokens) if spec.memory == "gated" else None)
    self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    self.context = policy.config.max_position_embeddings
    self.check_budget(question_len=1)
    self.reuse_prefix = self._reuse_prefix(spec.template_prefix_cache)
    # programs are traced on the mesh the rows are split over (a splash kernel runs per shard)
    self._trace_mesh = lambda: parallel.trace_mesh(mesh)
    self.device_clock = DeviceClock()  # seconds in compiled blocks and their transfers (perf/host_s)

  def _reuse_prefix(self, choice: str) -> bool:
    """With "auto", reuse the template's opening piece when it is at least PREFIX_CACHE_SHARE of a
    memory update's prompt and attention runs on xla (a fused kernel takes whole rows only, so there
    it would trade a kernel for a few % fewer tokens)."""
    if choice != "auto":
      return choice == "on"
    prefix = len(self.memory_segments.pieces[0])
    backend = self.policy.model.attention.resolve(self.policy.dtype)
    prompt = self.prompt_tokens(question_bucket(1))["memory update"]
    return backend == "xla" and prefix >= PREFIX_CACHE_SHARE * prompt

  # ----- budgets -------------------------------------------------------------------------------
  def prompt_tokens(self, question_width: int) -> dict[str, int]:
    """Worst-case prompt tokens of both conversation kinds for a question width."""
    return {
        "memory update": self.memory_segments.fixed_tokens + question_width + self.memory_width
                         + self.chunk_tokens,
        "final answer": self.final_segments.fixed_tokens + question_width + self.memory_width,
    }

  def prompt_budget(self, question_width: int) -> dict[str, int]:
    """Worst-case prompt + generation tokens of both conversation kinds for a question width."""
    prompts = self.prompt_tokens(question_width)
    return {"memory update": prompts["memory update"] + self.memory_tokens,
            "final answer": prompts["final answer"] + self.answer_tokens}

  def check_budget(self, question_len: int):
    """Raises ContextBudgetError naming every part when a conversation cannot fit the context."""
    for kind, need in self.prompt_budget(question_len).items():
      if need > self.context:
        seg = self.memory_segments if kind == "memory update" else self.final_segments
        parts = (f"template {seg.fixed_tokens} + question {question_len} + memory "
                 f"{self.memory_width}" + (f" + chunk {self.chunk_tokens}" if kind == "memory update" else "")
                 + f" + generation cap {self.memory_tokens if kind == 'memory update' else self.answer_tokens}")
        raise ContextBudgetError(f"{kind} needs {need} tokens ({parts}) but the model's context "
                                 f"window is {self.context} tokens; lower chunk_tokens/memory_tokens/answer_tokens")

  def question_width(self, longest: int) -> int:
    """The padded question width of a batch whose longest question has `longest` tokens (its bucket,
    or exactly `longest` where the bucket would not fit the context)."""
    self.check_budget(longest)
    width = question_bucket(longest)
    return longest if max(self.prompt_budget(width).values()) > self.context else width

  def _question_ids(self, questions: Sequence[str], placement: RowPlacement):
    ids = [encode_question(self.tokenizer, q, index=i, budget=self.question_tokens)
           for i, q in enumerate(questions)]
    longest = placement.agree_max(max(len(q) for q in ids))  # one static width on every process
    width = self.question_width(longest)
    q = np.full((len(ids), width), self.pad_id, np.int32)
    for i, qi in enumerate(ids):
      q[i, :len(qi)] = qi
    return q, np.asarray([len(x) for x in ids], np.int32)

  def _chunk_streams(self, documents: Sequence[str], from_files: bool) -> list:
    """Each document's chunk stream, the batch tokenised together (`chunking.documents_chunks`)."""
    names = [d if from_files else f"document {i}" for i, d in enumerate(documents)]
    streams = chunking.documents_chunks(self.tokenizer, documents, chunk_tokens=self.chunk_tokens, names=names,
                                        from_files=from_files)
    if self.max_chunks is None:
      return streams
    return [self._centre_truncated(s) for s in streams]

  def chunk_texts(self, documents: Sequence[str]) -> list[list[str]]:
    """Each document's chunks as text, exactly as the reader reads them (its chunking and truncation):
    what a per-turn signal that looks at a chunk's content (the gate terms' evidence) reads."""
    return [[self.tokenizer.decode(ids) for ids in stream] for stream in self._chunk_streams(documents, False)]

  def _centre_truncated(self, stream):
    ids = np.concatenate(list(stream))  # training only: centre-truncate to max_chunks chunks
    ids = chunking.centre_truncate(ids, self.max_chunks * self.chunk_tokens)
    return iter([ids[i:i + self.chunk_tokens] for i in range(0, len(ids), self.chunk_tokens)])

  # ----- running -------------------------------------------------------------------------------
  def _spec(self, keep_prompts: bool) -> RecurrenceSpec:
    return RecurrenceSpec(memory_tokens=self.memory_tokens, answer_tokens=self.answer_tokens,
                          stop_tokens=self.stop_tokens, pad_id=self.pad_id, keep_prompts=keep_prompts,
                          reuse_prefix=self.reuse_prefix, gate=self.gate, decode_buckets=self.decode_buckets)

  @staticmethod
  def _row_keys(questions, documents, seed: int, row_ids) -> np.ndarray:
    """Each row's PRNG key [b, 2], fold_in(PRNGKey(seed), row_ids[i]), after checking the batch."""
    if isinstance(questions, str) or isinstance(documents, str):
      raise TypeError("answer_batch takes lists; use answer() for a single document")
    if len(questions) != len(documents) or not questions:
      raise ValueError(f"got {len(questions)} questions for {len(documents)} documents")
    b = len(questions)
    row_ids = np.arange(b) if row_ids is None else np.asarray(row_ids, np.int64)
    if row_ids.shape != (b,) or (b and (row_ids.min() < 0 or row_ids.max() >= 2 ** 32)):
      raise ValueError(f"row_ids must be {b} integers in [0, 2**32) (one per question); got {row_ids}")
    return np.asarray(row_keys(jax.random.PRNGKey(seed), row_ids))

  def _read(self, questions, documents, *, decode: DecodeSpec, keys: np.ndarray, from_files: bool,
            keep_prompts: bool, progress: bool, fetch: Callable):
    """Runs the recurrence over every document, row i sampling with keys[i] (`_row_keys`); yields
    ("block", fetch(outs), chunk lengths [b, K]) per block of K memory updates and ("final",
    fetch(final outs), None) last. fetch gets each program's device StepOutputs [K, B, ...] (global
    rows) and returns what the caller keeps: it runs inside the device clock's section, so any wait
    for the outputs counts as device time."""
    b = len(questions)
    spec = self._spec(keep_prompts)
    place = RowPlacement(self.mesh, b)
    question, q_len = self._question_ids(questions, place)
    streams = self._chunk_streams(documents, from_files)
    memory = np.full((b, self.memory_width), self.pad_id, np.int32)
    memory[:, :len(self.initial_memory)] = self.initial_memory
    rows = MemoryRows(question=place.put(question), q_len=place.put(q_len), memory=place.put(memory),
                      mem_len=place.put(np.full((b,), len(self.initial_memory), np.int32)),
                      keys=place.put(keys),  # keys [b, 2]
                      halted=None if self.gate is None else place.put(np.zeros((b,), bool)))
    pol = self.policy
    bar = tqdm(desc="reading", unit="tok", unit_scale=True, disable=not progress, leave=False)

    def next_block():
      """The next K chunks of every row packed [b, K, C] with lengths [b, K], or None when all have ended."""
      pending = [list(itertools.islice(s, self.block_chunks)) for s in streams]
      if not place.any_process(any(pending)):  # every process runs the same blocks
        return None
      return chunking.pack_chunks(pending, num_steps=self.block_chunks, chunk_tokens=self.chunk_tokens,
                                  pad_id=self.pad_id)

    # One block in flight ahead of the host: block k is dispatched before block k - 1 is fetched, so
    # tokenising block k + 1 and the caller's work on block k - 1 run while the device computes block k.
    first_chunk, in_flight = 0, None  # in_flight: (device outputs, lengths) of the block not yet fetched
    while (packed := next_block()) is not None:
      chunks, lengths = packed
      block = ChunkBlock(chunks=place.put(chunks), lengths=place.put(lengths), first=jnp.int32(first_chunk))
      with self._trace_mesh(), self.device_clock.section():
        rows, outs = self.memory_block(pol.graphdef, pol.state, pieces=self._memory_pieces, rows=rows, block=block,
                                       decode=decode, spec=spec)
      first_chunk += self.block_chunks
      bar.update(int(lengths.sum()))
      if in_flight is not None:
        yield "block", self._fetched(fetch, place, in_flight[0]), in_flight[1]
      in_flight = outs, lengths
    bar.close()
    with self._trace_mesh(), self.device_clock.section():
      prompt, valid, gen = self.answer_block(pol.graphdef, pol.state, pieces=self._final_pieces, rows=rows,
                                        decode=decode, spec=spec)
      # every row answers (an elementwise op keeps the row split)
      final = StepOutputs.of(gen, valid, gen.lengths >= 0, prompt if keep_prompts else None)
      final = jax.tree.map(lambda x: x[None], final)  # as one more step: [1, B, ...]
    if in_flight is not None:  # the last memory block, fetched while the answers are computed
      yield "block", self._fetched(fetch, place, in_flight[0]), in_flight[1]
    yield "final", self._fetched(fetch, place, final), None

  def rollout_programs(self, rows: int, *, decode: DecodeSpec, keep_prompts: bool = True) -> dict:
    """{"rollout": memory_block, "answer": answer_block} as (fn, args, kwargs) of what one call on `rows`
    rows of this process passes them, abstract (shapes, dtypes, shardings) at the worst case: the
    longest question this reader takes, every chunk full (`memagent compile` lowers these)."""
    place, i32 = RowPlacement(self.mesh, rows), np.int32
    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=None if self.mesh is None else
                                                jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()))
    q = self.question_width(self.question_tokens)
    state = MemoryRows(question=place.abstract((rows, q), i32), q_len=place.abstract((rows,), i32),
                       memory=place.abstract((rows, self.memory_width), i32), mem_len=place.abstract((rows,), i32),
                       keys=place.abstract((rows, 2), np.uint32),
                       halted=None if self.gate is None else place.abstract((rows,), bool))
    block = ChunkBlock(chunks=place.abstract((rows, self.block_chunks, self.chunk_tokens), i32),
                       lengths=place.abstract((rows, self.block_chunks), i32), first=scalar(jnp.int32))
    pieces = lambda ps: tuple(jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=scalar(p.dtype).sharding) for p in ps)
    common = dict(rows=state, decode=jax.tree.map(lambda x: scalar(np.asarray(x).dtype), decode),
                  spec=self._spec(keep_prompts))
    args = (self.policy.graphdef, self.policy.state)
    return {"rollout": (self.memory_block, args, dict(common, pieces=pieces(self._memory_pieces), block=block)),
            "answer": (self.answer_block, args, dict(common, pieces=pieces(self._final_pieces)))}

  def _fetched(self, fetch: Callable, place: RowPlacement, outs):
    """fetch(outs) inside the device clock's section: a wait for the outputs counts as device time."""
    with self._trace_mesh(), self.device_clock.section():
      return fetch(outs, place)

  # Documented public API (DESIGN.md): greedy unless asked, as `Policy.generate`.
  def answer_batch(self, questions: Sequence[str], documents: Sequence[str], *, temperature: float = 0.0,
                   top_p: float = 1.0, seed: int = 0, top_k: int = 0, from_files: bool = False,
                   keep_prompts: bool = True, progress: bool = False,
                   row_ids: Sequence[int] | None = None) -> list[AgentResult]:
    """Reads documents (texts, or file paths with from_files=True) and answers each question.

    Row i samples with the key fold_in(PRNGKey(seed), row_ids[i]) (default: i), so a trajectory
    is the same whichever batch, device or process generates it."""
    t0 = time.perf_counter()
    b = len(questions)
    conversations = [[] for _ in range(b)]
    memories = [[] for _ in range(b)]
    gate_names = [[] for _ in range(b)]
    doc_tokens = np.zeros(b, np.int64)
    decode = DecodeSpec(temperature=temperature, top_p=top_p, top_k=top_k)
    to_host = lambda outs, place: place.local(outs, row_axis=1)  # every output to the host: waits for the block
    keys = self._row_keys(questions, documents, seed, row_ids)
    for kind, outs, lengths in self._read(questions, documents, decode=decode, keys=keys, from_files=from_files,
                                          keep_prompts=keep_prompts, progress=progress, fetch=to_host):
      self._collect(outs, conversations, memories=memories if kind == "block" else None, is_final=kind == "final",
                    gate_names=gate_names)
      if lengths is not None:
        doc_tokens += lengths.sum(axis=1)
    results = []
    seconds = (time.perf_counter() - t0) / b  # the batch's wall time, shared by its documents
    for i in range(b):
      answer = self.tokenizer.decode_response(conversations[i][-1].response_ids)
      results.append(AgentResult(
          question=questions[i], answer=answer, boxed=answers.extract_boxed(answer),
          prediction=answer_text_to_prediction(answer, self.final_template), memories=memories[i],
          conversations=conversations[i], num_chunks=len(memories[i]), document_tokens=int(doc_tokens[i]),
          decoded_tokens=int(sum(len(c.response_ids) for c in conversations[i])), seconds=seconds,
          gates=gate_names[i] if self.gate is not None else None))
    return results

  def rollout_slots(self, questions: Sequence[str], documents: Sequence[str], *, decode: DecodeSpec, seed: int,
                    prompt_width: int, response_width: int, row_ids: Sequence[int] | None = None) -> RolloutSlots:
    """Sampled trajectories for RL (row ids and keys as `answer_batch`): every conversation stays on
    device as a slot of prompt_width / response_width columns; only counts and the final answers'
    tokens come to the host."""
    need_p = max(self.prompt_tokens(self.question_tokens).values())
    need_n = max(self.memory_tokens, self.answer_tokens)
    if prompt_width < need_p or response_width < need_n:
      raise ValueError(f"slots of prompt width {prompt_width} / response width {response_width} cannot hold this "
                       f"reader's conversations (up to {need_p} / {need_n} tokens)")
    steps = []  # per program: the slot fields, device arrays [K, B, ...]

    def fetch(outs: StepOutputs, place):
      steps.append(outs._replace(sample_logprobs=None, active=None))
      is_answer = outs.active.shape[0] == 1
      return place.local(outs.counts()._replace(response=outs.response if is_answer else None),  # answers: for rewards
                         row_axis=1)

    keys = self._row_keys(questions, documents, seed, row_ids)
    doc_chunks = np.zeros(len(questions), np.int32)  # chunks of each document, read or not
    counts = []
    for _, c, lengths in self._read(questions, documents, decode=decode, keys=keys, from_files=False,
                                    keep_prompts=True, progress=False, fetch=fetch):
      counts.append(c)
      if lengths is not None:
        doc_chunks += (lengths > 0).sum(axis=1).astype(np.int32)
    joined = lambda field: np.concatenate([getattr(c, field) for c in counts]).swapaxes(0, 1)  # [b, T]
    active, prompt_len, response_len, stopped = map(joined, ("active", "prompt_len", "response_len", "stopped"))
    gate = None if self.gate is None else np.concatenate([c.gate for c in counts[:-1]] + [
        np.full_like(counts[-1].active, gates.MEMORY, np.int32)]).swapaxes(0, 1)  # [b, T]; the answer: no gate
    with self._trace_mesh(), self.device_clock.section():
      slots = _slot_table(tuple(steps), prompt_width=prompt_width, response_width=response_width, pad_id=self.pad_id)
    b, t = active.shape
    final_ids = counts[-1].response[0]  # [b, N]
    texts = [self.tokenizer.decode_response(final_ids[i, :response_len[i, -1]]) for i in range(b)]
    is_final = np.zeros((b, t), bool)
    is_final[:, -1] = True
    return RolloutSlots(slots=slots, active=active, is_final=is_final, prompt_len=prompt_len,
                        response_len=response_len, truncated=~stopped, answers=texts,
                        predictions=[answer_text_to_prediction(a, self.final_template) for a in texts],
                        num_chunks=active[:, :-1].sum(1).astype(np.int32), gate=gate,
                        doc_chunks=None if gate is None else doc_chunks)

  def _collect(self, outs: StepOutputs, conversations, *, memories, is_final: bool, gate_names=None):
    """Per-step stacked outputs [K, B, ...] (on the host) -> Conversations of the active rows, in order;
    with a gate, each memory turn's gate name, and the memory after a kept turn is the one before it."""
    k_steps, b = outs.active.shape
    for k in range(k_steps):
      for i in range(b):
        if not outs.active[k, i]:
          continue
        n, p = int(outs.response_len[k, i]), int(outs.prompt_len[k, i])
        conv = Conversation(
            prompt_ids=None if outs.prompt is None else outs.prompt[k, i, outs.prompt.shape[2] - p:],
            response_ids=outs.response[k, i, :n], response_logprobs=outs.logprobs[k, i, :n],
            sample_logprobs=outs.sample_logprobs[k, i, :n],
            truncated=not bool(outs.stopped[k, i]), is_final=is_final)
        conversations[i].append(conv)
        if memories is None:
          continue
        reply = self.tokenizer.decode_response(conv.response_ids)
        if outs.gate is not None:
          code = int(outs.gate[k, i])
          gate_names[i].append(gates.GATE_NAMES[code])
          if bool(gates.kept(np.asarray(code), self.gate)):
            reply = memories[i][-1] if memories[i] else NO_MEMORY
        memories[i].append(reply)

  def answer(self, question: str, document: str, *, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, **kwargs) -> AgentResult:
    """Reads one document (text; a path with from_files=True) and answers the question about it."""
    return self.answer_batch([question], [document], temperature=temperature, top_p=top_p, seed=seed,
                             **kwargs)[0]




@functools.partial(jax.jit, static_argnames=("prompt_width", "response_width", "pad_id"))
def _slot_table(steps: tuple[StepOutputs, ...], *, prompt_width: int, response_width: int,
                pad_id: int) -> ConversationSlots:
  """The recurrence's per-program outputs (each [K, B, ...]: memory blocks, then the final answer)
  -> ConversationSlots [B x T, ...], row-major (slot r x T + t), so the row split over the mesh stays
  a split of slots; prompts left-padded to prompt_width, responses right-padded to response_width."""
  def widen(x, width, left, value):
    pad = [(0, 0)] * x.ndim
    pad[-1] = (width - x.shape[-1], 0) if left else (0, width - x.shape[-1])
    return jnp.pad(x, pad, constant_values=value)

  cat = lambda f: jnp.concatenate([f(s) for s in steps])  # [T, B, ...]
  fields = dict(prompt=cat(lambda s: widen(s.prompt, prompt_width, True, pad_id)),
                prompt_len=cat(lambda s: s.prompt_len),
                response=cat(lambda s: widen(s.response, response_width, False, pad_id)),
                response_len=cat(lambda s: s.response_len),
                logprobs=cat(lambda s: widen(s.logprobs, response_width, False, 0.0)),
                truncated=cat(lambda s: ~s.stopped))
  flat = lambda x: jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])
  return ConversationSlots(**{k: flat(v) for k, v in fields.items()})
