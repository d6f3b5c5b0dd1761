"""The config of one data phase (data/curriculum.py): the run's config with that phase's
data.options, checked against their types."""

from __future__ import annotations

import copy


def phase_config(cfg, settings: dict):
  """A copy of cfg whose data.options carry one phase's settings (type-checked by ConfigDict)."""
  out = copy.deepcopy(cfg)
  with out.unlocked():
    for key, value in settings.items():
      try:
        out.data.options[key] = value
      except TypeError as e:
        raise ValueError(f"data.phases: {key}={value!r} does not fit data.options.{key}: {e}") from None
  return out
