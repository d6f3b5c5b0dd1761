"""The bottom layer (0): what any part of a run stands on and that knows nothing of models or agents.

  registry      name -> function registries that configs select from
  atomic_io     files and plots written under a temporary name, renamed on success
  orbax_quiet   orbax's log noise silenced, its errors on one line
  parallel      device mesh, logical-axis sharding rules, batch sharding, multi-host start
  checkpointing orbax checkpoints: async, keep-N, atomic, damaged steps skipped
  preemption    SIGTERM / SIGINT -> a flag the training loop reads between steps, agreed by all processes
  process_gather host arrays of every process concatenated in process order (rows, rewards, counters)
  device_clock  seconds in compiled programs, so a step's host seconds are the rest
  workdir_lock  one run per workdir: <workdir>/run.lock names the holder; a dead holder's lock is taken over
"""
