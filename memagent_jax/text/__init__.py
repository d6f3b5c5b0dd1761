"""Text-level pieces shared by the data, the agent and the rewards (layer 1; no JAX here).

  tokenizer   the `Tokenizer` interface (HF tokenizer + chat template + stop tokens)
  templates   MemAgent's prompt templates, byte for byte, and their pre-tokenised segments
  answers     answer extraction (\\boxed{...}, "the answer is ...")
"""
