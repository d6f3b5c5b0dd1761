"""Evaluation and training data (layer 3; imports text): RULER-style synthetic tasks,
long-document QA, the toy world, grain.

Submodules stay import-light (no TFDS or grain import here) so that generating a
synthetic sample does not pay for the input-pipeline stack:

  ruler           RULER-style task generators fitted to a token length (`generate`, `TASKS`)
                  (ruler_niah, ruler_vt, ruler_fwe: the task families; needles: keys/values)
  haystack        noise and offline "essay" filler text (words: its vocabulary)
  fitting         binary search of the haystack size against a token budget
  tokens          token counters (a tokenizer or a `str -> int` callable), cached
  longqa          SQuAD / HotpotQA loaders and MemAgent's padded long-document QA
  jsonl_qa        your own QA data: a JSONL file, every line checked, padded as longqa pads HotpotQA
  toy             the toy memory world (seeded key-value documents); toy_tokenizer: its word tokenizer
  tasks           a task name -> samples (RULER, QA, toy), for training pools and evaluation alike
  pipeline        grain input pipeline with a checkpointable position

The TFDS builders live in experiment/tfds_builders.py.
"""
