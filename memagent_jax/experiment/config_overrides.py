"""Config keys named on a command line (`--config.rl.clip_high=0.28`, a sweep's `rl.clip_high`): a
mistyped key is one line naming it and the nearest valid key, exit 2, before anything is built.

Every entry point shares this: experiments/train.py, sweep.py and toy_reproduction.py parse their absl
flags through `absl_flags_parser`, and `memagent compile` and the sweep check keys with `check_key`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
from typing import Iterable, Sequence

import ml_collections
from absl import flags


class ConfigKeyError(ValueError):
  """A key the config does not have; the message names the nearest one it has."""


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`path[:variant]` -> its `get_config(variant)` (as `config_flags.DEFINE_config_file` loads it)."""
  path, *variant = spec.split(":", 1)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file not found: {path}")
  module_spec = importlib.util.spec_from_file_location("memagent_user_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(*variant)


def config_keys(cfg, prefix: str = "") -> list[str]:
  """Every dotted key of cfg, sections and fields, depth first."""
  keys = []
  for name, value in cfg.items():
    keys.append(prefix + name)
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      keys += config_keys(value, prefix + name + ".")
  return keys


def nearest_choice(word: str, choices: Iterable[str]) -> str | None:
  """The choice closest to word (difflib's ratio >= 0.6), or None."""
  found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
  return found[0] if found else None


def nearest_key(cfg, key: str) -> str | None:
  """The valid key closest to `key`: the same field in another section first, else the closest spelling."""
  keys = config_keys(cfg)
  leaf = key.rsplit(".", 1)[-1]
  same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
  return same_leaf[0] if same_leaf else nearest_choice(key, keys)


def has_key(cfg, key: str) -> bool:
  """Whether the dotted key names a field or section of cfg."""
  node = cfg
  for part in key.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      return False
    node = node[part]
  return True


def check_key(cfg, key: str, flag: str = "--config."):
  """Raises ConfigKeyError `<flag><key>: no such config key; did you mean <flag><nearest>?` unless cfg has key."""
  if has_key(cfg, key):
    return
  near = nearest_key(cfg, key)
  hint = f"did you mean {flag}{near}?" if near else "the keys and their meanings are in configs/base.py"
  raise ConfigKeyError(f"{flag}{key}: no such config key; {hint}")


def _config_flag_args(argv: Sequence[str], name: str) -> tuple[str | None, list[str]]:
  """The config flag `name`'s file spec and its override keys as written in argv."""
  spec, keys = None, []
  for i, arg in enumerate(argv):
    match = re.match(rf"^--?(?:no)?{re.escape(name)}(\.[^=]+)?(?:=(.*))?$", arg)
    if not match:
      continue
    if match.group(1):
      keys.append(match.group(1)[1:])
    elif match.group(2) is not None:
      spec = match.group(2)
    elif i + 1 < len(argv):
      spec = argv[i + 1]
  return spec, keys


def check_config_flag(argv: Sequence[str], name: str):
  """Checks every `--<name>.<key>` override of argv against the config file `--<name>` names, before
  absl parses them (ml_collections' own error is a 30-line traceback)."""
  spec, keys = _config_flag_args(argv[1:], name)
  if not keys or not spec:
    return
  try:
    cfg = load_config_file(spec)
  except Exception:  # noqa: BLE001 - a config file that does not load is absl's to report, as before
    return
  for key in keys:
    check_key(cfg, key, flag=f"--{name}.")


def absl_flags_parser(program: str, config_flag: str | None = None):
  """`app.run(main, flags_parser=absl_flags_parser("train", "config"))`: a mistyped key of the config flag,
  an unknown flag or a bad flag value is one line `<program>: error: ...` and exit 2, in place of absl's
  report or a traceback."""
  def parse(argv: list[str]) -> list[str]:
    try:
      if config_flag:
        check_config_flag(argv, config_flag)
      return flags.FLAGS(argv)
    except (ConfigKeyError, flags.Error) as e:
      print(f"{program}: error: {' '.join(str(e).split())}", file=sys.stderr)
      sys.exit(2)
  return parse
