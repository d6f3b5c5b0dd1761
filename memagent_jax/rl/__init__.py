"""RL pieces of MemAgent: rewards and metrics, group advantages, and token-level losses."""
from memagent_jax.rl import advantages
from memagent_jax.rl import losses
from memagent_jax.rl import rewards
