"""MemAgent: templates, chunking, the compiled memory recurrence, and the direct-reading baseline."""
from memagent_jax.agent.direct import DirectReader
from memagent_jax.agent.memagent import ContextBudgetError, MemAgent
from memagent_jax.agent.results import AgentResult, Conversation, ConversationBatch
