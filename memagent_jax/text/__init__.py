"""Text-level pieces shared by the data, the agent and the rewards (no JAX here).

  tokenizer   the `Tokenizer` interface (HF tokenizer + chat template + stop tokens)
  templates   MemAgent's prompt templates and how an answer is read out of a response
  answers     answer extraction (\\boxed{...}, "the answer is ...")
"""
