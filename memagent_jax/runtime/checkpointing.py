"""Orbax checkpoints of the full training state (async, keep-N, atomic) and export to HF.

A step directory `<dir>/<step>/` holds two orbax items: `state` (a pytree of arrays saved
with StandardSave: params, optimizer state, ref params, step, PRNG key data) and `meta`
(a JSON dict: data position, model config, sources, training config). nnx.State values
are stored as pure dicts (`nnx.to_pure_dict`), so a checkpoint is plain nested dicts and
lists of arrays that restore without flax's Variable classes.

Finalized: orbax 0.12.8 on a local filesystem writes into `<step>.orbax-checkpoint-tmp`,
writes `commit_success.txt` into it last, then renames it to `<step>`; on GCS it writes in
place and `commit_success.txt` last. Orbax's own listing only checks the name on local
disks, so a copied or half-synced `<step>/` would load. We count a step as complete only if
its name is a plain integer AND it holds `commit_success.txt`; every other step directory
is skipped with a warning, and the writer removes such leftovers before its next save.
A complete step that does not read back (damaged files) is skipped by the trainer's restore
with one warning, and renamed `<step>.unreadable` before the next save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from memagent_jax.runtime.orbax_quiet import one_line, quiet_orbax
from memagent_jax.runtime.save_errors import CheckpointWriteError, drop_orbax_save_reports, write_error

log = logging.getLogger(__name__)

COMMIT_FILE = "commit_success.txt"  # orbax.checkpoint._src.path.atomicity_types.COMMIT_SUCCESS_FILE
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax.checkpoint._src.path.atomicity_types.TMP_DIR_SUFFIX
_STEP_RE = re.compile(r"^(0|[1-9]\d*)$")


class CheckpointMismatchError(ValueError):
  """The stored checkpoint does not fit what the caller wants to restore it into."""


class CheckpointCorruptError(RuntimeError):
  """A committed step could not be read back (truncated or garbled files)."""


def _to_pure(tree):
  """Replaces nnx.State / nnx.Variable nodes by pure dicts / raw values."""
  def conv(x):
    if isinstance(x, nnx.State):
      return nnx.to_pure_dict(x)
    if isinstance(x, nnx.Variable):
      return x.get_value()
    return x
  return jax.tree.map(conv, tree, is_leaf=lambda x: isinstance(x, (nnx.State, nnx.Variable)))


# --- tree comparison -------------------------------------------------------------------
def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def leaf_name(path) -> str:
  """'params/layers/0/attn/q/kernel' for a jax tree path."""
  return "/".join(_key_name(k) for k in path)


def _flat_shapes(tree) -> dict[str, tuple]:
  """'a/b/0/c' -> shape for every leaf; int, str, attribute and index keys all print alike,
  so a target with namedtuples and int keys matches orbax's metadata (dicts, lists, str keys)."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {leaf_name(path): tuple(v.shape) if hasattr(v, "shape") else np.shape(v) for path, v in flat}


def _check_tree(stored: dict[str, tuple], target, where: str):
  """Raises CheckpointMismatchError naming the first target leaf missing from or shaped
  differently in `stored`, then any stored leaf the target lacks."""
  expected = _flat_shapes(target)
  diffs = []
  for name, shape in expected.items():
    if name not in stored:
      diffs.append(f"leaf {name!r} (expected shape {shape}) is not in the checkpoint")
    elif tuple(stored[name]) != tuple(shape):
      diffs.append(f"leaf {name!r} has shape {tuple(stored[name])} in the checkpoint but the "
                   f"target expects {tuple(shape)}")
  diffs += [f"leaf {n!r} (shape {tuple(s)}) is in the checkpoint but not in the target"
            for n, s in stored.items() if n not in expected]
  if diffs:
    more = f" (and {len(diffs) - 1} more differing leaves)" if len(diffs) > 1 else ""
    raise CheckpointMismatchError(f"{where} does not fit the restore target: {diffs[0]}{more}; "
                                  "is this a checkpoint of another model shape?")


def _check_model_config(stored, expected, where: str):
  if dataclasses.is_dataclass(expected):
    expected = dataclasses.asdict(expected)
  expected = json.loads(json.dumps(expected))  # tuples -> lists, as stored
  if stored is None:
    raise CheckpointMismatchError(f"{where}: meta has no 'model_config' to compare")
  fields = sorted(set(stored) | set(expected))
  diff = [f"{f}: checkpoint {stored.get(f, '<missing>')!r} vs expected {expected.get(f, '<missing>')!r}"
          for f in fields if stored.get(f, "<missing>") != expected.get(f, "<missing>")]
  if diff:
    raise CheckpointMismatchError(f"{where}: model_config differs from the expected one in "
                                  f"{len(diff)} field(s): " + "; ".join(diff))


def _abstract(target, keep_sharding: bool = True):
  """Arrays / ShapeDtypeStructs / orbax ArrayMetadata -> ShapeDtypeStructs with a sharding
  (the leaf's own if `keep_sharding`, else the first local device), so orbax restores jax
  arrays of exactly those shapes, dtypes and shardings."""
  default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

  def one(x):
    dtype = getattr(x, "dtype", None)
    dtype = np.asarray(x).dtype if dtype is None else dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
      raise ValueError("typed PRNG keys cannot be checkpointed; store jax.random.key_data(key)")
    sharding = (getattr(x, "sharding", None) if keep_sharding else None) or default
    return jax.ShapeDtypeStruct(tuple(getattr(x, "shape", np.shape(x))), dtype, sharding=sharding)
  return jax.tree.map(one, target)


# --- the checkpointer ----------------------------------------------------------------------
class Checkpointer:
  """Async, keep-N, atomic checkpoints of (state pytree, JSON meta) per step.

  One process tree writes a directory (the trainer); any number may read it. Directories
  that are not complete (see the module docstring) are never listed nor restored.
  """

  def __init__(self, directory, keep: int = 3, async_save: bool = True, save_interval_steps: int = 1):
    self.directory = epath.Path(os.path.abspath(os.fspath(directory)))  # orbax needs absolute paths
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_interval_steps=save_interval_steps,
        enable_async_checkpointing=async_save, create=False)  # created lazily by the first save
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    with quiet_orbax():  # it reads every step's own metadata file; a damaged one is ours to report
      self._mngr = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
    self._warned: set[str] = set()
    self._unreadable: set[int] = set()  # committed steps a restore found damaged; set aside before a save
    self._writing: int | None = None  # the step of the save in flight
    self._failed: CheckpointWriteError | None = None  # raised once; later waits do not raise it again
    drop_orbax_save_reports()

  # listing
  def _scan(self, warn: bool = True) -> tuple[list[int], list[epath.Path]]:
    """(complete steps sorted, incomplete step directories) on disk right now; `warn`: log each
    incomplete one (once)."""
    if not self.directory.is_dir():
      return [], []
    complete, incomplete = [], []
    for p in self.directory.iterdir():
      if _STEP_RE.match(p.name) and p.is_dir():
        if (p / COMMIT_FILE).exists():
          complete.append(int(p.name))
        else:
          incomplete.append(p)
      elif TMP_SUFFIX in p.name:
        incomplete.append(p)
    for p in incomplete if warn else ():
      if str(p) not in self._warned:
        self._warned.add(str(p))
        log.warning("skipping checkpoint directory %s: not finalized (no %s; save in progress "
                    "or interrupted)", p, COMMIT_FILE)
    return sorted(complete), incomplete

  def all_steps(self) -> list[int]:
    return self._scan()[0]

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  # saving
  def save(self, step: int, state, meta: dict, force: bool = False) -> bool:
    """Starts saving (returns at once when async; `wait()` blocks). Returns whether orbax
    saved (False for steps off `save_interval_steps` or not after the latest step)."""
    try:
      json.dumps(meta)
    except (TypeError, ValueError) as e:
      raise TypeError(f"checkpoint meta must be JSON-serialisable: {e}") from None
    state = _to_pure(state)
    for leaf in jax.tree.leaves(state):
      if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.dtype(np.float32)), jax.dtypes.prng_key):
        raise ValueError("typed PRNG keys cannot be checkpointed; store jax.random.key_data(key)")
    self.wait()  # nothing of ours in flight while we clean up; raises the last save's error
    if self._failed is not None:  # reported already (the caller went on): orbax may still hold it
      try:
        self._mngr.wait_until_finished()
      except Exception:  # noqa: BLE001 - that same failure
        pass
      self._failed = None  # this save's own failure will be raised
    self._clean_up(step)
    self._writing = step
    with self._write_errors():
      return self._mngr.save(step, force=force, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  @contextlib.contextmanager
  def _write_errors(self):
    """An OS-level failure of the save in flight (a full disk) becomes one CheckpointWriteError line."""
    try:
      yield
    except Exception as e:  # orbax / tensorstore wrap the OSError in their own types
      saved = self._scan(warn=False)[0]
      err = write_error(e, step=self._writing, directory=str(self.directory), saved=saved[-1] if saved else None)
      if err is None:
        raise
      self._failed = err
      raise err from None

  def _clean_up(self, step: int):
    """Before a save: deletes leftovers of interrupted saves and renames damaged steps a restore
    skipped to `<step>.unreadable[-n]` (kept for inspection); else orbax counts a stale `<step>/`
    as the latest checkpoint and silently skips every save up to it."""
    _, incomplete = self._scan()
    bad = [self.step_dir(s) for s in sorted(self._unreadable)]
    if jax.process_index() == 0:
      for p in incomplete:
        log.warning("removing unfinished checkpoint directory %s", p)
        p.rmtree(missing_ok=True)
      for p in filter(lambda p: p.exists(), bad):
        dst, n = self.directory / f"{p.name}.unreadable", 1
        while dst.exists():
          dst, n = self.directory / f"{p.name}.unreadable-{n}", n + 1
        p.rename(dst)
        log.warning("moved unreadable checkpoint %s aside to %s", p, dst.name)
    if jax.process_count() > 1:
      ocp.multihost.sync_global_processes(f"memagent_checkpoint_cleanup_{step}")
    if incomplete or bad:
      self._mngr.reload()
    self._unreadable.clear()

  def wait(self):
    """Blocks until the last async save is on disk; raises its error (CheckpointWriteError for a
    full disk) once."""
    if self._failed is not None:
      return  # already raised; orbax would raise it again
    with self._write_errors():
      self._mngr.wait_until_finished()

  def close(self):
    """Waits for the last save, then releases orbax's threads."""
    try:
      self.wait()
    finally:
      try:
        self._mngr.close()
      except Exception:  # noqa: BLE001 - the failed save again, already raised by wait()
        if self._failed is None:
          raise

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # restoring
  def _resolve(self, step: int | None) -> int:
    if not self.directory.is_dir():
      raise FileNotFoundError(f"checkpoint directory not found: {self.directory}")
    steps = self.all_steps()
    if step is None:
      if not steps:
        raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
      return steps[-1]
    if step not in steps:
      raise FileNotFoundError(f"no complete checkpoint for step {step} in {self.directory}; "
                              f"complete steps: {steps or 'none'}")
    return step

  def _read(self, step: int, what: str, fn):
    try:
      with quiet_orbax():
        return fn()
    except (CheckpointMismatchError, FileNotFoundError):
      raise
    except Exception as e:  # orbax / tensorstore / json errors from a damaged step
      raise CheckpointCorruptError(f"checkpoint {self.step_dir(step)} could not be read ({what}); "
                                   f"it may be corrupt: {type(e).__name__}: {one_line(e)}") from e

  def restore_meta(self, step: int | None = None) -> tuple[int, dict]:
    """(step, meta) of a complete step (latest if None), without reading any array."""
    step = self._resolve(step)
    out = self._read(step, "meta", lambda: self._mngr.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())))
    return step, out["meta"]

  def _state_metadata(self, step: int):
    """The stored state tree with orbax ArrayMetadata leaves (shape, dtype); no array read."""
    md = self._read(step, "metadata", lambda: self._mngr.item_metadata(step)["state"])
    md = getattr(md, "tree", md)
    if not jax.tree.leaves(md):
      raise CheckpointCorruptError(f"checkpoint {self.step_dir(step)} could not be read (metadata); "
                                   "it may be corrupt: its state holds no arrays")
    return md

  def stored_shapes(self, step: int) -> dict[str, tuple]:
    """'params/layers/0/attn/k' -> shape of every stored state leaf."""
    return _flat_shapes(self._state_metadata(step))

  def restore(self, step: int | None = None, target=None, expect_model_config=None):
    """(state, meta) of a complete step (latest if None). With `target` (arrays or
    ShapeDtypeStructs, shardings honoured) the state has exactly its structure, shapes,
    dtypes and shardings; without one, nested dicts/lists on the first local device."""
    step, meta = self.restore_meta(step)
    where = f"checkpoint {self.step_dir(step)}"
    if expect_model_config is not None:
      _check_model_config(meta.get("model_config"), expect_model_config, where)
    stored = self._state_metadata(step)
    if target is None:
      abstract = _abstract(stored, keep_sharding=False)
    else:
      target = _to_pure(target)
      _check_tree(_flat_shapes(stored), target, where)
      abstract = _abstract(target)
    out = self._read(step, "state", lambda: self._mngr.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))))
    return out["state"], meta

  def restore_newest_readable(self, target=None, expect_model_config=None):
    """(step, state, meta) of the newest step that reads back: a damaged newer step is skipped
    with one warning line (and set aside before the next save); a model mismatch still raises."""
    self._resolve(None)  # FileNotFoundError when there is no complete step
    steps, errors = self.all_steps(), []
    for step in reversed(steps):
      try:
        state, meta = self.restore(step, target, expect_model_config)
      except CheckpointCorruptError as e:
        self._unreadable.add(step)
        errors.append(e)
        log.warning("skipping unreadable checkpoint step %d, trying the previous one: %s", step, one_line(e))
        continue
      return step, state, meta
    raise CheckpointCorruptError(f"no readable checkpoint in {self.directory}: every complete step "
                                 f"({', '.join(map(str, steps))}) failed to read; newest: {errors[0]}")

  def restore_params(self, target, step: int | None = None, expect_model_config=None):
    """(state["params"], meta): reads only the params arrays (orbax partial restore)."""
    step, meta = self.restore_meta(step)
    where = f"checkpoint {self.step_dir(step)}"
    if expect_model_config is not None:
      _check_model_config(meta.get("model_config"), expect_model_config, where)
    stored = {k[len("params/"):]: v for k, v in self.stored_shapes(step).items()
              if k.startswith("params/")}
    target = _to_pure(target)
    _check_tree(stored, target, f"{where} (params)")
    item = {"params": _abstract(target)}

    def read():
      args = ocp.args.PyTreeRestore(item=item, partial_restore=True,
                                    restore_args=ocp.checkpoint_utils.construct_restore_args(item))
      ckptr = ocp.PyTreeCheckpointer()
      try:
        return ckptr.restore(self.step_dir(step) / "state", args=args)
      finally:
        ckptr.close()
    return self._read(step, "params", read)["params"], meta
