"""experiments/benchmarks/bench_row_groups.py: the sampler's CPU row groups timed on a sweep batch."""

from experiments.benchmarks import bench_row_groups, sweep_batch
from memagent_jax.policy import sampling

MIB = bench_row_groups.MIB


def test_budgets_are_timed_in_turn_and_a_group_budget_reads_the_documents_as_all_rows():
  """8 short documents with the shipped base reader, all rows at once and in groups of 4 (a 5 MiB budget
  holds its 4.5 MB of weights and 6 rows' caches, 4 evenly): one time per round for each, the same
  answers and memories, and the table names both."""
  cfg, reader, questions, docs = sweep_batch.sweep_reader(1, 8, "experiments/data/toy_base_lookup")
  slots = bench_row_groups.memory_update_slots(reader, questions)
  assert slots == reader.prompt_tokens(8)["memory update"] + reader.memory_tokens  # toy questions: 8 wide
  groups = {}
  for budget in (0, 5 * MIB):
    sweep_batch.set_sample_group_bytes(reader, budget)
    groups[budget] = sampling.row_group(reader.policy.model, 8, slots)
  assert groups == {0: 8, 5 * MIB: 4}
  call = lambda: reader.answer_batch(questions, docs, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p, seed=1)
  rows = bench_row_groups.time_budgets(reader, call, [0, 5 * MIB], rounds=2)
  assert [len(r["seconds"]) for r in rows.values()] == [2, 2]
  assert rows[0]["digests"][0] == rows[5 * MIB]["digests"][0]  # answers and memories
  text = bench_row_groups.table(rows, groups)
  assert "| 0 (all rows) | 8 |" in text and "| 5 MiB | 4 |" in text and "1.00x" in text
