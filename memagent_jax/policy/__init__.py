"""The policy (layer 4; imports runtime, text, models, data): a decoder with its tokenizer,
compiled sampling, and loading from every weight source.

  decode_spec `DecodeSpec`: temperature / top-p / top-k, translated once into the sampler's switches
  sampling    jitted prefill + decode over a `KVCache`, per-row PRNG keys
  policy      `Policy`: logits, sample, generate, export
  loading     `load_policy` / `load_tokenizer` from the embedded default, HF dirs, GGUF, hub ids
  export      a training checkpoint -> an HF directory
"""
from memagent_jax.policy.policy import Policy
