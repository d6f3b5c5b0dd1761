"""Evaluation and training data: RULER-style synthetic tasks, long-document QA, TFDS, grain.

Submodules stay import-light (no TFDS or grain import here) so that generating a
synthetic sample does not pay for the input-pipeline stack:

  ruler           RULER-style task generators fitted to a token length (`generate`, `TASKS`)
                  (ruler_niah, ruler_vt, ruler_fwe: the task families; needles: keys/values)
  haystack        noise and offline "essay" filler text (words: its vocabulary)
  fitting         binary search of the haystack size against a token budget
  tokens          token counters (a tokenizer or a `str -> int` callable), cached
  longqa          SQuAD / HotpotQA loaders and MemAgent's padded long-document QA
  tfds_builders   TFDS builders (`Ruler`, `LongQA`) written as array_record, without TensorFlow
  pipeline        grain input pipeline with a checkpointable position
"""
