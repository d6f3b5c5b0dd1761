"""Outputs are complete or absent: a failure inside the block leaves the old file or directory
byte for byte, success replaces it, and no temporary file is left behind."""

import os
import stat

import pytest

from memagent_jax.runtime.atomic_io import atomic_directory, atomic_write, save_figure


def _listing(d):
  return sorted(os.listdir(d))


def test_atomic_write_replaces_on_success(tmp_path):
  path = tmp_path / "out.txt"
  path.write_text("old results\n")
  with atomic_write(str(path)) as f:
    f.write("new")
    assert path.read_text() == "old results\n"  # not visible before the block ends
  assert path.read_text() == "new"
  assert _listing(tmp_path) == ["out.txt"]


def test_atomic_write_keeps_old_file_on_error(tmp_path):
  path = tmp_path / "out.txt"
  path.write_text("old results\n")
  with pytest.raises(KeyboardInterrupt):
    with atomic_write(str(path)) as f:
      f.write("partial")
      raise KeyboardInterrupt
  assert path.read_text() == "old results\n"
  assert _listing(tmp_path) == ["out.txt"]


def test_atomic_write_creates_parents_and_plain_permissions(tmp_path):
  path = tmp_path / "a" / "b" / "out.bin"
  with atomic_write(str(path), "wb") as f:
    f.write(b"\x00\x01")
  assert path.read_bytes() == b"\x00\x01"
  mask = os.umask(0)
  os.umask(mask)
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~mask


def test_atomic_directory_swaps_whole_directory(tmp_path):
  out = tmp_path / "export"
  out.mkdir()
  (out / "old.txt").write_text("old")
  with pytest.raises(RuntimeError):
    with atomic_directory(str(out)) as tmp:
      open(os.path.join(tmp, "half.txt"), "w").write("half")
      raise RuntimeError("export failed")
  assert _listing(out) == ["old.txt"] and _listing(tmp_path) == ["export"]
  with atomic_directory(str(out)) as tmp:
    open(os.path.join(tmp, "new.txt"), "w").write("new")
  assert _listing(out) == ["new.txt"] and _listing(tmp_path) == ["export"]


def test_atomic_directory_refuses_a_file(tmp_path):
  target = tmp_path / "export"
  target.write_text("a file")
  with pytest.raises(NotADirectoryError, match="export"):
    with atomic_directory(str(target)):
      pass
  assert target.read_text() == "a file"


def test_save_figure_is_a_png(tmp_path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots()
  ax.plot([0, 1], [1, 0])
  path = save_figure(fig, str(tmp_path / "plot.png"), dpi=50)
  plt.close(fig)
  assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  assert _listing(tmp_path) == ["plot.png"]
