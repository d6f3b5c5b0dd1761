"""memagent_jax: RL-trained long-context memory agents (MemAgent) in JAX/Flax."""
# Importing changes nothing in the process: no XLA flags, allocator settings, lowering rules or hooks.
from memagent_jax.models import ModelConfig, WeightsError, get_preset
from memagent_jax.policy import Policy
from memagent_jax.policy.loading import load_policy
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.agent import AgentResult, ContextBudgetError, DirectReader, MemAgent, ReaderSpec

__version__ = "0.1.0"
