"""The top of the library (layer 8): the only package below cli.py that reads a config file.

  assembly       `build_experiment` / `build_trainer` / `load_reader`: a config turned into the
                 parts of a run (mesh, policy, reader, data, collector, evaluator, trainer), once,
                 for every entry point
  tfds_builders  TFDS builders (`Ruler`, `LongQA`, `ToyKV`) written as array_record, without TensorFlow
"""
