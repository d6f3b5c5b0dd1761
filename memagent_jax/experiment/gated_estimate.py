"""What a gated memory saves at pod scale: the compiled rollout's decode loop re-costed for a keep rate.

`memagent compile --assume.keep_rate=K` compiles the rollout as every memory turn writes (the decode loop
runs its full token cap) and then re-costs that loop from its compiled per-iteration FLOPs, HBM bytes and
collective bytes: a turn first decodes `form_tokens + 1` tokens with every row (a keep form and its stop
token), then, with the rows still writing (a share 1 - K) compacted into the smallest of the config's
agent.decode_buckets batch sizes that holds them (policy/compaction.py), the rest of the cap with that
bucket. The weights are read once per decode step whatever the batch; the KV cache, FLOPs and collectives
scale with the rows that run. A model, stated as such: the rows that write are taken to write the whole cap
(the worst case the report assumes everywhere), stop forms (halted rows) and the prefill are not re-costed.
"""

from __future__ import annotations

import dataclasses

from memagent_jax.policy.compaction import bucket_sizes


@dataclasses.dataclass(frozen=True)
class GatedAssumption:
  keep_rate: float  # share of memory turns that reply with the keep form
  form_tokens: int  # tokens of the keep form in the model's tokenizer
  buckets: int  # agent.decode_buckets of the config (1: no compaction)

  def __post_init__(self):
    if not 0.0 <= self.keep_rate <= 1.0:
      raise ValueError(f"--assume.keep_rate={self.keep_rate}: a share of memory turns, in [0, 1]")
    if self.form_tokens < 1:
      raise ValueError(f"--assume.form_tokens={self.form_tokens}: must be >= 1")


def bucket_share(keep_rate: float, group_rows: int, buckets: int) -> float:
  """The share of a device's rows the second decode phase runs: the smallest bucket that holds the writing
  rows (1 - keep_rate of them, rounded up); 0 when every turn keeps (the loop ends after the form)."""
  writing = (1.0 - keep_rate) * group_rows
  if writing <= 0:
    return 0.0
  sizes = bucket_sizes(group_rows, buckets)
  return min(s for s in sizes if s >= writing) / group_rows


def decode_loop(program: dict, memory_tokens: int) -> dict:
  """The rollout's decode loop: its innermost loop of memory_tokens iterations."""
  loops = [l for l in program["loops"] if l["innermost"] and l["trip_count"] == memory_tokens]
  if not loops or "bytes_per_iteration" not in loops[0]:
    raise ValueError(f"the rollout has no innermost loop of {memory_tokens} iterations with per-iteration bytes "
                     "(a report from this version of memagent compile is needed)")
  return loops[0]


def gated_rollout(program: dict, *, assume: GatedAssumption, memory_tokens: int, turns: int, group_rows: int,
                  weight_bytes: float, chip) -> dict:
  """The rollout program's totals and roofline with its `turns` decode loops re-costed (see the module)."""
  loop = decode_loop(program, memory_tokens)
  first = min(assume.form_tokens + 1, memory_tokens)  # every row: the form and its stop token
  rest = memory_tokens - first
  share = bucket_share(assume.keep_rate, group_rows, assume.buckets)
  flops_it, bytes_it = loop["flops_per_iteration"], loop["bytes_per_iteration"]
  coll_it = loop["collective_bytes_per_iteration"]
  per_row_bytes = max(bytes_it - weight_bytes, 0.0)  # KV cache and activations: scale with the rows
  saved = dict(flops=turns * rest * flops_it * (1 - share), bytes_accessed=turns * rest * per_row_bytes * (1 - share),
               collective_bytes=turns * rest * coll_it * (1 - share))
  if share == 0.0:  # nothing writes: the loop also skips reading the weights for its remaining steps
    saved["bytes_accessed"] = turns * rest * bytes_it
  totals = {k: program[k] - v for k, v in saved.items()}
  times = {"compute": totals["flops"] / chip.peak_flops, "hbm": totals["bytes_accessed"] / chip.hbm_bandwidth,
           "ici": totals["collective_bytes"] / chip.ici_bandwidth}
  return dict(totals, keep_rate=assume.keep_rate, form_tokens=assume.form_tokens, buckets=assume.buckets,
              bucket_share=share, roofline_s=max(times.values()), bound_by=max(times, key=times.get),
              overwrite_roofline_s=program["roofline_s"])
