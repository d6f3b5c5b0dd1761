"""The model: configs, the NNX decoder, attention backends, and weight reading/writing."""
from memagent_jax.models.config import PRESETS, ModelConfig, get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.safetensors_io import WeightsError
