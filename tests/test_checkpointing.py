"""Checkpoints: bit-exact resume, keep-N, interrupted saves never loaded, clear errors, HF export."""

import dataclasses
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from orbax.checkpoint.path import atomicity

from conftest import torch_logits
from memagent_jax.runtime import checkpointing as ck
from memagent_jax import cli
from memagent_jax.models.config import get_preset
from memagent_jax.models.decoder import Decoder, forward_logits


def params_to_tree(model: nnx.Module) -> dict:
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def load_params_into(model: nnx.Module, tree: dict) -> None:
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, tree)
  nnx.update(model, state)


def make_state(preset="tiny-llama", seed=0, step=7):
  """(model, state, meta) after one adamw step, so params, mu and nu are all non-trivial."""
  cfg = get_preset(preset)
  model = Decoder(cfg, jnp.float32, rngs=nnx.Rngs(seed))
  params = params_to_tree(model)
  tx = optax.adamw(1e-2)
  opt_state = tx.init(params)
  grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(seed + 1), p.shape, p.dtype), params)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  load_params_into(model, params)
  state = {"params": params, "opt_state": opt_state, "step": jnp.int32(step),
           "rng": jax.random.key_data(jax.random.key(seed + 2))}
  meta = {"data_position": {"epoch": 1, "index": 42 + step}, "model_config": dataclasses.asdict(cfg),
          "model_source": f"random:{preset}", "tokenizer_source": None, "train_config": {"lr": 1e-2}}
  return model, state, meta


def assert_trees_equal(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_bit_exact(tmp_path):
  _, state, meta = make_state()
  with ck.Checkpointer(tmp_path / "ckpt", async_save=True) as c:
    assert c.save(7, state, meta)
    c.wait()
    assert c.all_steps() == [7]
  c = ck.Checkpointer(tmp_path / "ckpt")  # a fresh process: nothing cached
  target = jax.eval_shape(lambda: state)
  restored, restored_meta = c.restore(target=target)
  assert_trees_equal(restored, state)
  assert restored_meta == meta
  assert all(x.sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
             for x in jax.tree.leaves(restored))
  # Without a target: plain nested dicts, every leaf still exact.
  untyped, _ = c.restore(step=7)
  assert_trees_equal(nnx.restore_int_paths(untyped["params"]), state["params"])
  assert np.array_equal(untyped["rng"], state["rng"]) and int(untyped["step"]) == 7
  c.close()


def test_restore_params_only_and_into_a_model(tmp_path):
  model, state, meta = make_state()
  state["params"] = nnx.state(model, nnx.Param)  # stored as its pure dict
  with ck.Checkpointer(tmp_path) as c:
    c.save(1, state, meta)
  c = ck.Checkpointer(tmp_path)
  assert "params/layers/0/attn/k" in c.stored_shapes(1)
  fresh = Decoder(get_preset("tiny-llama"), jnp.float32, rngs=nnx.Rngs(9))
  params, _ = c.restore_params(params_to_tree(fresh), expect_model_config=get_preset("tiny-llama"))
  load_params_into(fresh, params)
  assert_trees_equal(params_to_tree(fresh), params_to_tree(model))


def test_keep_n(tmp_path):
  _, state, meta = make_state()
  with ck.Checkpointer(tmp_path, keep=2) as c:
    for step in range(1, 6):
      state["step"] = jnp.int32(step)
      assert c.save(step, state, meta)
    c.wait()
    assert c.all_steps() == [4, 5] and c.latest_step() == 5
  assert sorted(os.listdir(tmp_path)) == ["4", "5"]


@pytest.fixture
def interrupted(tmp_path, monkeypatch):
  """A directory with complete steps 1, 2 and a real snapshot of step 3 taken just before
  orbax's final rename, i.e. what a crash at that instant leaves behind."""
  d, snap = tmp_path / "ckpt", tmp_path / "snapshot_step3"
  orig, seen = atomicity.AtomicRenameTemporaryPath.finalize, []

  async def finalize(self):
    if self.get_final().name == "3":
      seen.append(self.get().name)
      shutil.copytree(self.get(), snap)
    return await orig(self)
  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", finalize)
  states = {}
  with ck.Checkpointer(d) as c:
    for step in (1, 2, 3):
      _, states[step], meta = make_state(seed=step, step=step)
      c.save(step, states[step], meta)
  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", orig)
  assert seen == ["3" + ck.TMP_SUFFIX]  # orbax 0.12.8 writes into <step>.orbax-checkpoint-tmp
  assert not (snap / ck.COMMIT_FILE).exists() and (snap / "state").is_dir()  # data, no commit yet
  shutil.rmtree(d / "3")
  return d, snap, states, meta


@pytest.mark.parametrize("how", ["tmp_dir", "no_commit_file", "missing_files"])
def test_interrupted_save_is_never_loaded(interrupted, how, caplog):
  d, snap, states, meta = interrupted
  bad = d / ("3" + ck.TMP_SUFFIX if how == "tmp_dir" else "3")
  shutil.copytree(snap, bad)
  if how == "missing_files":
    shutil.rmtree(bad / "state" / "d", ignore_errors=True)
    shutil.rmtree(bad / "meta")
  if how != "tmp_dir":  # orbax alone (name-based on a local disk) would take it as the latest
    raw = ocp.CheckpointManager(d, options=ocp.CheckpointManagerOptions(create=False))
    assert raw.latest_step() == 3
    raw.close()
  c = ck.Checkpointer(d)
  with caplog.at_level(logging.WARNING, logger=ck.__name__):
    assert c.latest_step() == 2 and c.all_steps() == [1, 2]
  assert str(bad) in caplog.text
  with pytest.raises(FileNotFoundError, match="no complete checkpoint for step 3"):
    c.restore(step=3)
  restored, restored_meta = c.restore(target=jax.eval_shape(lambda: states[2]))
  assert_trees_equal(restored, states[2])
  assert restored_meta["data_position"]["index"] == 42 + 2
  # Resuming from step 2 and saving step 3 again replaces the leftover.
  assert c.save(3, states[3], meta)
  c.wait()
  assert c.latest_step() == 3 and not (d / ("3" + ck.TMP_SUFFIX)).exists()
  assert_trees_equal(c.restore(target=jax.eval_shape(lambda: states[3]))[0], states[3])
  c.close()


def test_mismatched_model_shape_is_named_before_reading_arrays(tmp_path, monkeypatch):
  _, state, meta = make_state("tiny-llama")
  with ck.Checkpointer(tmp_path) as c:
    c.save(1, state, meta)
  _, qwen_state, _ = make_state("tiny-qwen2")
  c = ck.Checkpointer(tmp_path)
  calls = []
  real_restore = c._mngr.restore
  monkeypatch.setattr(c._mngr, "restore", lambda step, args: calls.append(list(args.keys()))
                      or real_restore(step, args=args))
  with pytest.raises(ck.CheckpointMismatchError) as e:
    c.restore(target=jax.eval_shape(lambda: qwen_state))
  msg = str(e.value)
  assert "attn/k'" in msg and "(64, 2, 16)" in msg and "(64, 1, 16)" in msg and str(tmp_path / "1") in msg
  assert calls == [["meta"]]  # the arrays were never read
  with pytest.raises(ck.CheckpointMismatchError, match=r"leaf 'layers/0/attn/k' has shape \(64, 2, 16\)"):
    c.restore_params(qwen_state["params"])
  with pytest.raises(ck.CheckpointMismatchError, match="intermediate_size: checkpoint 128 vs expected 160"):
    c.restore(expect_model_config=get_preset("tiny-qwen2"))


def test_export_cli_matches_transformers(tmp_path, capsys):
  model, state, meta = make_state("tiny-llama")
  with ck.Checkpointer(tmp_path / "ckpt") as c:
    c.save(5, state, meta)
  out = tmp_path / "hf"
  assert cli.main(["export", "--ckpt", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
  assert "exported step 5" in capsys.readouterr().err
  ids = np.random.default_rng(0).integers(0, 256, size=(2, 20))
  ours = np.asarray(forward_logits(model, jnp.asarray(ids)))
  np.testing.assert_allclose(torch_logits(str(out), ids), ours, atol=1e-4)


def cli_error(capsys, argv) -> str:
  """Runs the CLI expecting it to exit with one error line on stderr; returns that line."""
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[memagent]")]
  assert e.value.code and len(err) == 1 and "Traceback" not in err[0], err
  return err[0]


def test_clear_errors(tmp_path, capsys):
  missing = tmp_path / "nope"
  with pytest.raises(FileNotFoundError, match=f"checkpoint directory not found: {missing}"):
    ck.Checkpointer(missing).restore()
  assert not missing.exists()  # reading never creates the directory
  assert f"checkpoint directory not found: {missing}" in cli_error(
      capsys, ["export", "--ckpt", str(missing), "--out", str(tmp_path / "hf")])
  empty = tmp_path / "empty"
  (empty / ("4" + ck.TMP_SUFFIX)).mkdir(parents=True)
  c = ck.Checkpointer(empty)
  assert c.latest_step() is None and c.all_steps() == []
  with pytest.raises(FileNotFoundError, match=f"no complete checkpoint in {empty}"):
    c.restore()
  with pytest.raises(FileNotFoundError, match=f"no complete checkpoint in {empty}"):
    c.restore_newest_readable()
  assert f"no complete checkpoint in {empty}" in cli_error(
      capsys, ["export", "--ckpt", str(empty), "--out", str(tmp_path / "hf")])
  with pytest.raises(TypeError, match="JSON-serialisable"):
    c.save(1, {"x": jnp.ones(2)}, {"bad": object()})
  with pytest.raises(ValueError, match="jax.random.key_data"):
    c.save(1, {"rng": jax.random.key(0)}, {})


def _data_files(step_dir):
  return [os.path.join(r, f) for r, _, fs in os.walk(step_dir / "state") for f in fs
          if os.path.basename(r) == "d"]


def test_corrupt_checkpoint_names_the_step(tmp_path, capsys):
  _, state, meta = make_state()
  with ck.Checkpointer(tmp_path) as c:
    c.save(2, state, meta)
  data_files = _data_files(tmp_path / "2")
  assert data_files
  for f in data_files:
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)
  c = ck.Checkpointer(tmp_path)
  with pytest.raises(ck.CheckpointCorruptError, match=f"checkpoint {tmp_path / '2'} could not be read") as e:
    c.restore(target=jax.eval_shape(lambda: state))
  assert "\n" not in str(e.value)
  with pytest.raises(ck.CheckpointCorruptError, match=f"no readable checkpoint in {tmp_path}: every complete "
                     r"step \(2\) failed to read; newest: checkpoint"):
    c.restore_newest_readable(target=jax.eval_shape(lambda: state))
  assert f"checkpoint {tmp_path / '2'} could not be read" in cli_error(
      capsys, ["export", "--ckpt", str(tmp_path), "--out", str(tmp_path / "hf")])


def _garble(path):
  data = bytearray(open(path, "rb").read())
  rng = np.random.default_rng(0)
  open(path, "wb").write(bytes(rng.integers(0, 256, len(data), dtype=np.uint8)))


def _corrupt(step_dir, how):
  """What a half-written or damaged copy of a committed step looks like."""
  state_files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir / "state") for f in fs]
  if how == "truncate_all":
    for f in state_files:
      with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
  elif how == "delete_arrays":
    for f in _data_files(step_dir):
      os.remove(f)
  elif how == "garble_largest_array":
    _garble(max(_data_files(step_dir), key=os.path.getsize))
  elif how == "garble_meta_json":
    (step_dir / "meta" / "metadata").write_text('{"data_position": {"ep')
  elif how == "empty_state":
    shutil.rmtree(step_dir / "state")
    (step_dir / "state").mkdir()


@pytest.mark.parametrize("how", ["truncate_all", "delete_arrays", "garble_largest_array", "garble_meta_json",
                                 "empty_state"])
def test_unreadable_newest_step_falls_back_with_one_warning(tmp_path, how, caplog, capfd):
  states = {}
  with ck.Checkpointer(tmp_path) as c:
    for step in (1, 2):
      _, states[step], meta = make_state(seed=step, step=step)
      c.save(step, states[step], meta)
  _corrupt(tmp_path / "2", how)
  capfd.readouterr()
  c = ck.Checkpointer(tmp_path)
  with caplog.at_level(logging.INFO):
    step, restored, restored_meta = c.restore_newest_readable(target=jax.eval_shape(lambda: states[1]))
  assert step == 1 and restored_meta["data_position"]["index"] == 43
  assert_trees_equal(restored, states[1])
  records = [r for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(records) == 1 and records[0].name == ck.__name__, [r.getMessage() for r in records]
  line = records[0].getMessage()
  assert "\n" not in line and "step 2" in line and str(tmp_path / "2") in line
  assert capfd.readouterr().err == ""  # nothing from orbax or tensorstore on stderr
  # the next save of step 2 sets the damaged one aside instead of being skipped by orbax
  assert c.save(2, states[2], meta)
  c.wait()
  assert c.all_steps() == [1, 2] and (tmp_path / "2.unreadable").is_dir()
  assert_trees_equal(c.restore(target=jax.eval_shape(lambda: states[2]))[0], states[2])
  c.close()


def test_relative_directory_is_accepted(tmp_path, monkeypatch):
  """Run directories are often relative (runs/x); orbax itself only takes absolute paths."""
  import jax.numpy as jnp
  from memagent_jax.runtime.checkpointing import Checkpointer
  monkeypatch.chdir(tmp_path)
  ckpt = Checkpointer("runs/rel/checkpoints", keep=1)
  ckpt.save(1, {"x": jnp.arange(3)}, {"k": 1})
  ckpt.wait()
  state, meta = Checkpointer("runs/rel/checkpoints").restore()
  assert meta["k"] == 1 and list(state["x"]) == [0, 1, 2]


def test_unretrieved_read_errors_of_a_damaged_step_are_dropped():
  """A failed read leaves tensorstore futures whose errors asyncio reports when they are collected
  ("Task ..." or "Future exception was never retrieved", timing decides which): both are dropped,
  anything else asyncio logs is kept."""
  from memagent_jax.runtime import orbax_quiet
  noise = 'future: <Future finished exception=ValueError(\'NOT_FOUND: ... [tensorstore_spec=...]\')>'
  for head in ("Task exception was never retrieved", "Future exception was never retrieved"):
    record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, f"{head}\n{noise}", None, None)
    assert not orbax_quiet._keep_record(record)
  other = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Future exception was never retrieved\n"
                            "future: <Future finished exception=ValueError('our own bug')>", None, None)
  assert orbax_quiet._keep_record(other)
