"""The extrapolation sweep's statistics and measurements."""

import numpy as np
import pytest

from memagent_jax.evaluation.length_sweep import PeakRSS, SweepRow, SweepSpec, sweep_lengths, wilson_interval


def test_wilson_interval_matches_hand_computed_values():
  # z = 1.96: 5/10 -> 0.2366..0.7634 and 0/10 -> 0..0.2775 (closed form worked by hand).
  np.testing.assert_allclose(wilson_interval(5, 10), (0.2366, 0.7634), atol=1e-4)
  np.testing.assert_allclose(wilson_interval(0, 10), (0.0, 0.2775), atol=1e-4)
  lo, hi = wilson_interval(200, 200)
  assert hi == 1.0 and 0.98 < lo < 0.985
  assert wilson_interval(0, 0) == (0.0, 1.0)


def test_peak_rss_sees_a_transient_allocation():
  import time
  from memagent_jax.evaluation.length_sweep import _rss_bytes
  with PeakRSS() as mem:
    block = np.ones(300 * 2 ** 20 // 8)  # 300 MiB, touched
    during = _rss_bytes()
    time.sleep(0.05)  # several sampling intervals
    del block
  assert mem.peak >= during  # the high-water mark survives the free
  assert during > 250 * 2 ** 20


class _Oracle:
  """A reader that answers right on documents up to `limit` words: a known curve."""

  def __init__(self, limit):
    from memagent_jax.data.toy_tokenizer import toy_tokenizer
    self.tokenizer, self.limit, self.calls = toy_tokenizer(), limit, 0

  def answer_batch(self, questions, documents, temperature=0.0, top_p=1.0, seed=0):
    from memagent_jax.agent.results import AgentResult
    from memagent_jax.rl.toy_teacher import asked_key, facts_in
    self.calls += 1
    self.lengths = getattr(self, "lengths", []) + [max(len(d.split(" ")) for d in documents)]
    out = []
    for q, d in zip(questions, documents):
      told = [v for k, v in facts_in(d) if k == asked_key(q)]
      v = told[-1] if len(d.split(" ")) <= self.limit else "nothing"
      out.append(AgentResult(question=q, answer=f"\\boxed{{ {v} }}", boxed=f" {v} ", prediction=f" {v} ",
                             memories=[], conversations=[], num_chunks=1, document_tokens=len(d.split(" ")),
                             decoded_tokens=4, seconds=0.0))
    return out


@pytest.mark.parametrize("each", [True, False])
def test_sweep_rows_follow_the_reader(each):
  reader = _Oracle(limit=200)
  spec = SweepSpec(task="toy_kv", lengths=(128, 256, 512), n=8, seed=3, batch_size=4, temperature=0.0, top_p=1.0,
                   chunk_tokens=64, warmup_each_length=each)
  rows = sweep_lengths(reader, "oracle", spec, progress=False)
  assert [r.accuracy for r in rows] == [1.0, 0.0, 0.0]
  assert [r.doc_tokens for r in rows] == [128, 256, 512]
  assert all(r.n == 8 and r.seconds_per_doc >= 0 and r.peak_rss_mib > 10 and r.method == "oracle" for r in rows)
  assert rows[0].ci_low < 1.0 == rows[0].ci_high and SweepRow.from_json(rows[0].to_json()) == rows[0]
  assert reader.calls == 3 * 2 + (3 if each else 1)  # 2 batches per length + warm-ups


def test_finished_lengths_are_reused_only_for_the_same_reader_and_settings(tmp_path):
  reader = _Oracle(limit=200)
  spec = SweepSpec(task="toy_kv", lengths=(128, 256), n=4, seed=3, batch_size=4, temperature=0.0, top_p=1.0,
                   chunk_tokens=64, warmup_each_length=False)
  sweep = lambda **kw: sweep_lengths(reader, "oracle", spec, progress=False, out_dir=str(tmp_path), **kw)
  first = sweep(reader_id="weights-a")
  assert reader.calls == 1 + 2  # one warm-up, one batch per length
  assert sweep(reader_id="weights-a") == first and reader.calls == 3  # read back, nothing run
  sweep(reader_id="weights-b")  # other weights: every length runs again
  assert reader.calls == 3 + 3
  sweep()  # no reader identity: nothing is reused
  assert reader.calls == 6 + 3
  (tmp_path / "oracle_256.row.json").write_text("{not json")  # a torn row is run again, not trusted
  sweep(reader_id="weights-b")
  assert reader.calls == 9 + 2  # the warm-up and length 256 only
  assert reader.lengths[-2:] == [128, 256]  # the warm-up read the shortest documents, not a 256 batch twice


def test_a_sweep_of_long_lengths_only_warms_up_on_the_given_length():
  """A sweep split into pool tasks (toy_reproduction.sweep_parts) compiles on short documents, not
  by reading one batch of its longest length twice."""
  reader = _Oracle(limit=200)
  spec = SweepSpec(task="toy_kv", lengths=(512,), n=4, seed=3, batch_size=4, temperature=0.0, top_p=1.0,
                   chunk_tokens=64, warmup_each_length=False, warmup_length=128)
  rows = sweep_lengths(reader, "oracle", spec, progress=False)
  assert reader.lengths == [128, 512] and [r.length for r in rows] == [512]
