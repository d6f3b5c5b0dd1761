"""The readers (layer 5; imports runtime, text, policy): MemAgent and the direct-reading baseline.

  memagent    `MemAgent`: the host loop and API (answer, answer_batch, rollout)
  recurrence  the jitted `lax.scan` over chunks that rewrites the memory
  chunking    streamed tokenisation of documents of any size, centre truncation
  placement   rows over the mesh's (data, fsdp) axes and over processes
  direct      `DirectReader`: the whole document in one prompt (full-attention baseline)
  results     `AgentResult`, `Conversation`, `ConversationBatch` (what RL trains on)
"""
from memagent_jax.agent.direct import DirectReader
from memagent_jax.agent.memagent import ContextBudgetError, MemAgent, ReaderSpec
from memagent_jax.agent.results import AgentResult, Conversation, ConversationBatch
