"""The policy model: configs, the NNX decoder, and weight loading/export."""
from memagent_jax.models.config import PRESETS, ModelConfig, get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.loading import EMBEDDED_DEFAULT, embedded_gguf_path, load_policy
from memagent_jax.models.safetensors_io import WeightsError
