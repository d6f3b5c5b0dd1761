"""`DirectReader`: the no-memory baseline, the whole document in one prompt (for comparisons).

It costs quadratic attention and a KV cache that grows with the document, and stops at the
model's context window: longer documents are an error, or centre-truncated when asked.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from memagent_jax.agent import chunking
from memagent_jax.agent.memagent import ContextBudgetError, encode_question
from memagent_jax.agent.results import AgentResult, Conversation
from memagent_jax.text.templates import DIRECT_TEMPLATE, TemplateSegments, answer_text_to_prediction
from memagent_jax.text import answers
from memagent_jax.policy.decode_spec import DecodeSpec


class DirectReader:
  """Answers from the full document in context (centre-truncated to fit when `truncate`)."""

  # As MemAgent's: the answer budget is named; the question budget defaults to the released reader's,
  # the context to the model's window (trainer: configs/base.py agent section).
  def __init__(self, policy, *, answer_tokens: int, question_tokens: int = 1024, truncate: bool = False,
               context_tokens: int | None = None):
    if answer_tokens < 1:
      raise ValueError(f"answer_tokens={answer_tokens} must be >= 1")
    self.policy = policy
    self.tokenizer = policy._require_tokenizer()
    self.answer_tokens, self.question_tokens, self.truncate = answer_tokens, question_tokens, truncate
    self.context = context_tokens or policy.config.max_position_embeddings
    if self.context > policy.config.max_position_embeddings:
      raise ValueError(f"context_tokens={self.context} exceeds the model's context window of "
                       f"{policy.config.max_position_embeddings}")
    self.segments = TemplateSegments.build(self.tokenizer, DIRECT_TEMPLATE)
    self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

  def document_budget(self, question_len: int) -> int:
    """Most document tokens that fit beside the template, the question and the answer cap."""
    return self.context - self.segments.fixed_tokens - question_len - self.answer_tokens

  def prompt_ids(self, question: str, document: str, *, index: int = 0, from_file: bool = False):
    """(prompt ids, document tokens before truncation) of one question and document."""
    q = encode_question(self.tokenizer, question, index=index, budget=self.question_tokens)
    name = document if from_file else f"document {index}"
    pieces = chunking.text_pieces(self.tokenizer, document, name=name, from_file=from_file)
    doc = np.concatenate(list(chunking.token_stream(self.tokenizer, pieces, name)))
    budget = self.document_budget(len(q))
    if budget < 1:
      raise ContextBudgetError(f"question {index}: template {self.segments.fixed_tokens} + question "
                               f"{len(q)} + answer cap {self.answer_tokens} leave no room in the "
                               f"context window of {self.context} tokens")
    if len(doc) > budget:
      if not self.truncate:
        raise ContextBudgetError(
            f"{name} has {len(doc)} tokens but only {budget} fit the context window of "
            f"{self.context} tokens (template {self.segments.fixed_tokens} + question {len(q)} + "
            f"answer cap {self.answer_tokens}); pass truncate=True to centre-truncate")
      kept = chunking.centre_truncate(doc, budget)
    else:
      kept = doc
    return self.segments.assemble(prompt=q, context=kept.tolist()), len(doc)

  # The reader interface of MemAgent.answer_batch (documented public API): greedy unless asked.
  def answer_batch(self, questions: Sequence[str], documents: Sequence[str], *, temperature: float = 0.0,
                   top_p: float = 1.0, seed: int = 0, top_k: int = 0,
                   from_files: bool = False) -> list[AgentResult]:
    """Answers each question from its whole document in one prompt."""
    if len(questions) != len(documents) or not questions:
      raise ValueError(f"got {len(questions)} questions for {len(documents)} documents")
    t0 = time.perf_counter()
    built = [self.prompt_ids(q, d, index=i, from_file=from_files)
             for i, (q, d) in enumerate(zip(questions, documents))]
    prompts = [p for p, _ in built]
    longest = max(len(p) for p in prompts)
    gen = self.policy.sample(prompts, self.answer_tokens,
                             params=DecodeSpec(temperature=temperature, top_p=top_p, top_k=top_k),
                             seed=seed, cache_size=longest + self.answer_tokens)
    results = []
    seconds = (time.perf_counter() - t0) / len(built)  # the batch's wall time, shared by its documents
    for i, (prompt, n_doc) in enumerate(built):
      n = int(gen.lengths[i])
      conv = Conversation(prompt_ids=np.asarray(prompt, np.int32), response_ids=gen.tokens[i, :n],
                          response_logprobs=gen.logprobs[i, :n], sample_logprobs=gen.sample_logprobs[i, :n],
                          truncated=not bool(gen.stopped[i]), is_final=True)
      answer = self.tokenizer.decode_response(conv.response_ids)
      results.append(AgentResult(question=questions[i], answer=answer, boxed=answers.extract_boxed(answer),
                                 prediction=answer_text_to_prediction(answer, "boxed"), memories=[],
                                 conversations=[conv], num_chunks=0, document_tokens=n_doc, decoded_tokens=n,
                                 seconds=seconds))
    return results

  def answer(self, question: str, document: str, *, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, **kwargs) -> AgentResult:
    """One question about one document."""
    return self.answer_batch([question], [document], temperature=temperature, top_p=top_p, seed=seed,
                             **kwargs)[0]
