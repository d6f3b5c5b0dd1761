"""Text-level pieces shared by the data, the agent and the rewards (layer 1; no JAX here).

  tokenizer   the `Tokenizer` interface (HF tokenizer + chat template + stop tokens)
  templates   MemAgent's prompt templates, byte for byte, and their pre-tokenised segments
  chat_templates  chat templates of models whose tokenizer files are not shipped (Qwen3)
  answers     answer extraction (\\boxed{...}, "the answer is ...")
"""
