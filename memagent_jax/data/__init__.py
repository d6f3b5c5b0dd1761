"""Evaluation and training data: RULER-style synthetic tasks, long-document QA, TFDS, grain.

Submodules stay import-light (no TFDS or grain import here) so that generating a
synthetic sample does not pay for the input-pipeline stack:

  haystack        noise and offline "essay" filler text
  ruler           RULER-style task generators fitted to a token length (`generate`, `TASKS`)
  longqa          SQuAD / HotpotQA loaders and MemAgent's padded long-document QA
  tfds_builders   TFDS builders (`Ruler`, `LongQA`) written as array_record, without TensorFlow
  pipeline        grain input pipeline with a checkpointable position
"""
