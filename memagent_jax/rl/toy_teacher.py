"""Teacher policies for the toy world: teacher-forced conversations for supervised warm starts.

`toy_memory` is the deliberately imperfect memory policy of the warm start: it always writes the latest
fact about the asked key into memory, but on a chunk that holds only other keys' facts it
overwrites the memory with them with probability `overwrite_prob`. For a gated reader (agent.memory
"gated") a chunk without the asked key that it does not overwrite on is answered with the keep form
(the memory stays); it never stops early (a later override of the key may come). A model fitted to it is a
stochastic policy that RL can improve. `toy_direct` answers from the whole document, for the
full-attention baseline. `toy_recall` is the base model's pretraining: a short document and the
question as plain text, no template, answered in the boxed format; on such short rows a model
trained from scratch learns in minutes to find and copy a fact, which it cannot on 170-token rows.
Teachers read only the texts (question, chunks), never hidden labels,
and emit conversations in the exact prompt format the agents run.
"""

from __future__ import annotations

import random
import re

import numpy as np

from memagent_jax.agent import chunking, gates
from memagent_jax.agent.memagent import encode_question
from memagent_jax.agent.results import AgentResult, Conversation
from memagent_jax.text.templates import NO_MEMORY
from memagent_jax.data import toy
from memagent_jax.runtime.registry import Registry

FACT_RE = re.compile(r"the code of (\w+) is (\w+) \.")
QUESTION_RE = re.compile(r"what is the latest code of (\w+) \?")

# teacher name -> fn(agent, question, context, *, rng, **options) -> AgentResult (options: teacher.options)
TEACHERS: Registry = Registry("teacher")


def asked_key(question: str) -> str:
  m = QUESTION_RE.fullmatch(question.strip())
  if not m:
    raise ValueError(f"not a toy question: {question!r}")
  return m.group(1)


def facts_in(text: str) -> list[tuple[str, str]]:
  """(key, value) of every complete fact in a text, in order."""
  return FACT_RE.findall(text)


def memory_text(facts: list[tuple[str, str]]) -> str:
  return " ".join(toy.fact(k, v) for k, v in facts) if facts else NO_MEMORY


def answer_text(value: str) -> str:
  return f"\\boxed{{ {value} }}"


def _conversation(prompt: list[int], response_text: str, *, tokenizer, cap: int,
                  is_final: bool, end: bool = True) -> Conversation:
  """response_text's ids, then EOS unless end is False (a form that ends the turn by itself)."""
  ids = tokenizer.encode(response_text) + ([tokenizer.eos_token_id] if end else [])
  if len(ids) > cap:
    raise ValueError(f"teacher response {response_text!r} has {len(ids)} tokens, over the cap of {cap}")
  zeros = np.zeros(len(ids), np.float32)
  return Conversation(prompt_ids=np.asarray(prompt, np.int32), response_ids=np.asarray(ids, np.int32),
                      response_logprobs=zeros, sample_logprobs=zeros, truncated=False, is_final=is_final)


def guess(memory: list[tuple[str, str]], key: str, rng: random.Random) -> str:
  """The answer a reader of `memory` gives: the asked key's value, else the last remembered value,
  else a random value (the teacher answers from its memory, right or wrong)."""
  for k, v in reversed(memory):
    if k == key:
      return v
  return memory[-1][1] if memory else rng.choice(toy.VALUES)


def latest_value(context: str, key: str) -> str:
  """The value of the last fact about `key` in a document: the right answer."""
  told = [v for k, v in facts_in(context) if k == key]
  if not told:
    raise ValueError(f"the document never states the code of {key!r}")
  return told[-1]


@TEACHERS.register("toy_memory")
def memory_teacher(agent, question: str, context: str, *, rng: random.Random,
                   overwrite_prob: float, askable_overwrite_prob: float | None = None) -> AgentResult:
  """One trajectory of the imperfect memory policy through `agent`'s chunking and templates.

  askable_overwrite_prob: the overwrite probability instead on chunks holding a fact about another
  askable key (toy.ASKED_KEYS); None: overwrite_prob. At 0 the teacher's memory tells the asked key
  from the other askable ones, which a student can only copy by matching fact and question keys (at
  0.5 a fitted model took the shortcut "keep any askable key")."""
  askable_p = overwrite_prob if askable_overwrite_prob is None else askable_overwrite_prob
  for name, p in (("overwrite_prob", overwrite_prob), ("askable_overwrite_prob", askable_p)):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"{name}={p} must lie in [0, 1]")
  tok, key = agent.tokenizer, asked_key(question)
  q = encode_question(tok, question, index=0, budget=agent.question_tokens)
  memory: list[tuple[str, str]] = []
  conversations, memories, doc_tokens = [], [], 0
  gate = getattr(agent, "gate", None)  # a gated reader: unchanged memories are the keep form
  turn_gates = [] if gate is not None else None
  for chunk in chunking.document_chunks(tok, context, chunk_tokens=agent.chunk_tokens):
    prompt = agent.memory_segments.assemble(prompt=q, memory=tok.encode(memory_text(memory)), chunk=chunk)
    found = facts_in(tok.decode(chunk))
    asked = [f for f in found if f[0] == key]
    before = memory
    if asked:
      memory = [asked[-1]]
    elif found and rng.random() < (askable_p if any(k in toy.ASKED_KEYS for k, _ in found) else overwrite_prob):
      memory = found[-2:]  # the chunk's facts replace the memory (two fit in 16 tokens)
    if gate is not None and not asked and memory is before:
      # a single-token form ends the turn itself (the recurrence stops on it); a longer one ends with EOS
      conversations.append(_conversation(prompt, gates.KEEP_FORM, tokenizer=tok, cap=agent.memory_tokens,
                                         is_final=False, end=len(tok.encode(gates.KEEP_FORM)) > 1))
      turn_gates.append("keep")
    else:
      conversations.append(_conversation(prompt, memory_text(memory), tokenizer=tok, cap=agent.memory_tokens,
                                         is_final=False))
      if turn_gates is not None:
        turn_gates.append("memory")
    memories.append(memory_text(memory))
    doc_tokens += len(chunk)
  if not conversations:
    raise ValueError(f"empty document for question {question!r}")
  prompt = agent.final_segments.assemble(prompt=q, memory=tok.encode(memory_text(memory)))
  value = guess(memory, key, rng)
  answer = answer_text(value)
  conversations.append(_conversation(prompt, answer, tokenizer=tok, cap=agent.answer_tokens, is_final=True))
  return AgentResult(question=question, answer=answer, boxed=f" {value} ", prediction=value,
                     memories=memories, conversations=conversations, num_chunks=len(memories),
                     document_tokens=doc_tokens, decoded_tokens=sum(len(c.response_ids) for c in conversations),
                     seconds=0.0, gates=turn_gates)


@TEACHERS.register("toy_direct")
def direct_teacher(reader, question: str, context: str, *, rng: random.Random) -> AgentResult:
  """The right answer from the whole document in one prompt (the full-attention baseline)."""
  del rng
  key = asked_key(question)
  prompt, doc_tokens = reader.prompt_ids(question, context, index=0)
  return _answered(reader, question, prompt=prompt, value=latest_value(context, key), doc_tokens=doc_tokens)


@TEACHERS.register("toy_recall")
def recall_teacher(reader, question: str, context: str, *, rng: random.Random) -> AgentResult:
  """Base-model pretraining row: "<document> <question>" as plain text -> the latest value, boxed."""
  del rng
  tok, key = reader.tokenizer, asked_key(question)
  document = tok.encode(context)  # word-level: encode(a + " " + b) == encode(a) + encode(b)
  prompt = document + tok.encode(question)
  return _answered(reader, question, prompt=prompt, value=latest_value(context, key),
                   doc_tokens=len(document))


def _answered(reader, question: str, *, prompt: list[int], value: str, doc_tokens: int) -> AgentResult:
  """A one-conversation trajectory whose response is `value` boxed."""
  answer = answer_text(value)
  conv = _conversation(prompt, answer, tokenizer=reader.tokenizer, cap=reader.answer_tokens, is_final=True)
  return AgentResult(question=question, answer=answer, boxed=f" {value} ", prediction=value, memories=[],
                     conversations=[conv], num_chunks=0, document_tokens=doc_tokens,
                     decoded_tokens=len(conv.response_ids), seconds=0.0)
