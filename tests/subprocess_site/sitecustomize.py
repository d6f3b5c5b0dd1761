"""Started before every Python a test spawns through `_clean_env` (its folder leads PYTHONPATH there):
in a multi-process CPU run, every process writes its compiled programs to the test run's XLA cache.

jax writes cache entries from process 0 alone, and on CPU a program's cache key names its devices, so
process 1's keys are never process 0's: without this, every process but 0 compiled every program
afresh in each multi-process test (22.5 of a 3-step tiny run's 27 s), with process 0 waiting for it in
the first collective. The entries are the same executables a compile gives, under the keys that
process asks for (on CPU its own)."""

import os

if os.environ.get("MEMAGENT_TEST_XLA_CACHE"):
  from jax._src import compiler, distributed

  # private to jax (pinned in setup.py): where it is gone, tests only run slower, as before
  _cache_write = getattr(compiler, "_cache_write", None)

  def _cache_write_from_any_process(*args, **kwargs):
    """jax's _cache_write, with this process taken for process 0 while it writes."""
    pid = distributed.global_state.process_id
    distributed.global_state.process_id = 0
    try:
      return _cache_write(*args, **kwargs)
    finally:
      distributed.global_state.process_id = pid

  if _cache_write is not None and hasattr(distributed.global_state, "process_id"):
    compiler._cache_write = _cache_write_from_any_process
