"""A data curriculum in one config: `data.phases` trains successive step ranges of one run on
differently generated documents (e.g. askable-key distractors first, then mixed ones); the
runner is `experiment.assembly.train_phases`, each phase's config made by
`experiment.phase_configs.phase_config`.

  data.phases = "200:distractor_keys=askable;300:distractor_keys=mixed;400:distractor_keys=mixed,late_fact_share=1.0"

Phase i runs until its step (the last one's is train.steps) with data.options updated by its
settings (each phase's relative to data.options, not to the phase before). The run is one
workdir: each phase resumes the previous one's checkpoint (params, optimizer state, data
position), so the learning-rate schedule spans train.steps and a killed run resumes in its
phase.
"""

from __future__ import annotations

import ast


def _value(text: str, current):
  """A setting's text as the type of the option it replaces (strings stay strings)."""
  if isinstance(current, str):
    return text
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def parse_phases(spec: str, options, steps: int) -> list[tuple[int, dict]]:
  """data.phases -> [(until_step, {option: value})], checked against data.options and train.steps."""
  if not spec.strip():
    return []
  phases, last = [], 0
  for part in spec.split(";"):
    head, _, body = part.strip().partition(":")
    try:
      until = int(head)
    except ValueError:
      raise ValueError(f"data.phases: {part.strip()!r} must be '<until step>:<option>=<value>,...'") from None
    if until <= last:
      raise ValueError(f"data.phases: phase ends must increase from 1; {until} follows {last}")
    settings = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
      key, eq, text = item.partition("=")
      if not eq or key not in options:
        raise ValueError(f"data.phases: {item!r} in phase ending at {until} must set an existing data.options "
                         f"key (known: {', '.join(sorted(options)) or 'none'})")
      settings[key] = _value(text, options[key])
    phases.append((until, settings))
    last = until
  if last != steps:
    raise ValueError(f"data.phases: the last phase ends at step {last}, train.steps is {steps}; make them equal")
  return phases


def with_steps(spec: str, steps: int) -> str:
  """The curriculum cut (or its last phase stretched) to end at `steps`: the phases that end
  before it, then the phase that covers it, ending there (a shortened run keeps its first steps)."""
  if not spec.strip():
    return spec
  parts = [p.strip() for p in spec.split(";")]
  out = []
  for i, part in enumerate(parts):
    head, _, body = part.partition(":")
    if int(head) >= steps or i == len(parts) - 1:
      out.append(f"{steps}:{body}")
      break
    out.append(part)
  return ";".join(out)
