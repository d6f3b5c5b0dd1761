"""RL pieces of MemAgent: rule-based rewards and evaluation metrics for the final answer."""
from memagent_jax.rl import rewards
