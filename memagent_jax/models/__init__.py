"""The model (layer 2; imports runtime): configs and presets, the NNX decoder, attention backends,
and weight reading/writing (HF safetensors, GGUF). Loading a policy from a source is policy/loading.py."""
from memagent_jax.models.config import PRESETS, ModelConfig, get_preset
from memagent_jax.models.decoder import Decoder
from memagent_jax.models.safetensors_io import WeightsError
