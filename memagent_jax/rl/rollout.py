"""Rollouts for Multi-Conv DAPO: G trajectories per question through the agent, rewards on the
final answers, overlong shaping, dynamic sampling, advantages broadcast to every conversation.

The conversations stay on device as the reader's slots; the host sees counts and the final answers'
text, scores them, and plans which slot becomes which training row (`device_rows.SlotRows`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from memagent_jax.agent import gates
from memagent_jax.agent.results import AgentResult, RolloutSlots
from memagent_jax.data.tasks import QuestionBatch
from memagent_jax.policy.decode_spec import DecodeSpec
from memagent_jax.runtime.process_gather import gather_rows, this_process_share
from memagent_jax.runtime.registry import Registry
from memagent_jax.rl import advantages as adv_lib
from memagent_jax.rl import gate_signals, rewards
from memagent_jax.rl.device_rows import SlotRows

# reward name -> fn(answer text, prediction, gold answers) -> float in [0, 1]: the final answer only.
# prediction is what the answer claims (its \boxed{} or "the answer is" part), None when it has no format.
REWARD_FNS: Registry[Callable[[str, "str | None", list[str]], float]] = Registry("reward")
REWARD_FNS.register("memagent_verifier", lambda answer, pred, gold: rewards.memagent_verifier(answer, gold))  # released
REWARD_FNS.register("sub_em", lambda answer, pred, gold: rewards.sub_em(pred, gold))
for _name in ("exact_match", "string_match_all", "string_match_part"):
  REWARD_FNS.register(_name, lambda answer, pred, gold, fn=getattr(rewards, _name): fn(answer if pred is None else pred,
                                                                                      gold))
get_reward_fn = REWARD_FNS.get


def overlong_penalty(lengths, *, max_tokens: int, cache_tokens: int) -> np.ndarray:
  """DAPO's soft overlong punishment, in tokens: 0 up to Lmax - Lcache, then a linear ramp
  ((Lmax - Lcache) - L) / Lcache down to -1 at Lmax, and -1 beyond. lengths [N] -> [N]."""
  if not 0 < cache_tokens <= max_tokens:
    raise ValueError(f"overlong shaping needs 0 < cache_tokens <= max_tokens; got "
                     f"cache_tokens={cache_tokens}, max_tokens={max_tokens}")
  lengths = np.asarray(lengths, np.float64)
  free = max_tokens - cache_tokens
  ramp = (free - lengths) / cache_tokens
  return np.where(lengths <= free, 0.0, np.where(lengths <= max_tokens, ramp, -1.0)).astype(np.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OverlongSpec:
  """DAPO's soft overlong punishment of the final answer (see `overlong_penalty`)."""
  max_tokens: int
  cache_tokens: int

  def __post_init__(self):
    if not 0 < self.cache_tokens <= self.max_tokens:
      raise ValueError(f"overlong shaping needs 0 < cache_tokens <= max_tokens; got {self}")


ON_INSUFFICIENT = ("fail", "proceed")
# What dynamic sampling keeps a group for: "score", DAPO's (its trajectories' scores differ: a group of equal
# scores has no advantage); "score_or_gates" also keeps one of equal scores whose weighed gate terms differ
# (per trajectory, or in a turn-level advantage mode per turn position): those terms are an advantage of their own
DYNAMIC_SAMPLING_FILTERS = ("score", "score_or_gates")
GATE_SIGNAL_TOL = 1e-6  # gate terms (and turn advantages) closer than this are equal: float32 rounding is not a signal


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutSpec:
  """How one step's rollouts are drawn, scored and kept; checks itself on construction."""
  group_size: int  # G trajectories per question
  questions_per_step: int
  rollout_batch: int  # trajectories per agent call over all processes (a multiple of group_size)
  temperature: float = 1.0
  top_p: float = 1.0
  reward: str = "memagent_verifier"  # a REWARD_FNS name
  advantage: str = "mean_centred"  # an advantages.ADVANTAGES name
  eps: float = 1e-6
  dynamic_sampling: bool = False  # keep only groups with a signal, as dynamic_sampling_filter says
  dynamic_sampling_filter: str = "score"  # DYNAMIC_SAMPLING_FILTERS
  max_extra_gen_batches: int = 0
  on_insufficient: str = "fail"  # ON_INSUFFICIENT: when dynamic sampling runs out of batches
  mask_truncated: bool = False  # drop conversations that hit their token cap from the loss
  overlong: OverlongSpec | None = None  # None: no overlong shaping
  gate_weights: tuple[tuple[str, float], ...] = ()  # (gate_signals.GATE_TERMS name, weight): gated readers
  advantage_mode: str = "trajectory"  # a gate_signals.ADVANTAGE_MODES name
  turn_advantage_weight: float = 0.0  # "turn_mix": the turn-level advantages' share, in [0, 1]

  def __post_init__(self):
    for name in ("group_size", "questions_per_step", "rollout_batch"):
      if getattr(self, name) < 1:
        raise ValueError(f"RolloutSpec.{name}={getattr(self, name)} must be >= 1")
    if self.rollout_batch % self.group_size:
      raise ValueError(f"rl.rollout_batch={self.rollout_batch} must be a multiple of "
                       f"rl.group_size={self.group_size} (a group is never split)")
    if not (self.temperature > 0 and 0 < self.top_p <= 1 and self.eps >= 0 and self.max_extra_gen_batches >= 0):
      raise ValueError(f"RolloutSpec needs temperature > 0, 0 < top_p <= 1, eps >= 0, "
                       f"max_extra_gen_batches >= 0; got {self}")
    if self.on_insufficient not in ON_INSUFFICIENT:
      raise ValueError(f"RolloutSpec.on_insufficient={self.on_insufficient!r}; choose one of {ON_INSUFFICIENT}")
    if self.dynamic_sampling_filter not in DYNAMIC_SAMPLING_FILTERS:
      raise ValueError(f"RolloutSpec.dynamic_sampling_filter={self.dynamic_sampling_filter!r}; choose one of "
                       f"{DYNAMIC_SAMPLING_FILTERS}")
    REWARD_FNS.get(self.reward)  # an unknown name raises, listing the known ones
    adv_lib.get_advantage(self.advantage)
    gate_signals.ADVANTAGE_MODES.get(self.advantage_mode)
    for name, _ in self.gate_weights:
      gate_signals.GATE_TERMS.get(name)
    if not 0.0 <= self.turn_advantage_weight <= 1.0:
      raise ValueError(f"RolloutSpec.turn_advantage_weight={self.turn_advantage_weight} must lie in [0, 1]")


class DynamicSamplingError(RuntimeError):
  """Dynamic sampling ran out of extra generation batches before the step was full."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutMetrics:
  """What one step's rollouts report, over every trajectory generated (kept or not)."""
  reward_mean: float  # the shaped reward (what the advantages see)
  accuracy: float  # the reward function's raw score
  kept_group_frac: float  # groups with a reward or gate signal / groups generated (1 without dynamic sampling)
  memory_tokens: float  # mean tokens of a memory update, stop token excluded
  chunks_per_doc: float
  rollout_tokens: float  # prompt + response tokens of every conversation
  rollout_seconds: float
  kept_groups: int = 0
  gen_batches: int = 1  # generation batches drawn this step
  answer_tokens: float | None = None  # mean final-answer tokens, stop token included (as DAPO's overlong shaping)
  truncated_frac: float | None = None  # conversations that hit their token cap (None: a teacher, never)
  rows_per_process: float = 0.0  # trajectories each process generated
  teacher_accuracy: float | None = None  # a teacher's rollouts: the teacher's own score
  decoded_tokens_per_doc: float | None = None  # generated tokens per trajectory (memory updates and answer)
  seconds_per_doc: float | None = None  # rollout wall seconds per trajectory
  keep_frac: float | None = None  # gated readers: shares of memory turns that kept / stopped / were invalid
  stop_frac: float | None = None
  invalid_frac: float | None = None
  evidence_agree_frac: float | None = None  # the "evidence" term's rollouts: memory turns whose gate agrees with it
  gate_signal_groups: int | None = None  # "score_or_gates" with gate terms: groups kept for those alone (equal scores)

  def scalars(self) -> dict[str, float]:
    """The logged names (a field that is None is not logged)."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
           if f.name != "rows_per_process" and getattr(self, f.name) is not None}
    return dict(out, **{"perf/rollout_rows_per_process": self.rows_per_process})


@dataclasses.dataclass(kw_only=True)
class StepRollout:
  """The kept groups of one rollout step as training rows, plus what to log."""
  rows: SlotRows | None  # None when no group was kept
  num_questions: int  # kept groups
  metrics: RolloutMetrics
  results: list[AgentResult] | None = None  # a teacher's trajectories, for inspection


@dataclasses.dataclass(kw_only=True)
class _Call:
  """One reader call of a generation batch: its slots, and its counts over every process's rows."""
  slots: RolloutSlots  # this process's view (answers of its own rows)
  active: np.ndarray  # [B, T] bool, global rows in process order
  prompt_len: np.ndarray  # [B, T]
  response_len: np.ndarray  # [B, T]
  truncated: np.ndarray  # [B, T]
  is_final: np.ndarray  # [B, T]
  num_chunks: np.ndarray  # [B]
  gate: np.ndarray | None = None  # [B, T] gated readers' gates
  doc_chunks: np.ndarray | None = None  # [B] chunks of each document (read or not)
  evidence: np.ndarray | None = None  # [B, T] turn t's chunk holds a gold answer (the "evidence" gate term's)

  @classmethod
  def gather(cls, slots: RolloutSlots) -> "_Call":
    optional = {k: gather_rows(getattr(slots, k)) for k in ("gate", "doc_chunks", "evidence")
                if getattr(slots, k) is not None}
    return cls(slots=slots, **optional, **{k: gather_rows(getattr(slots, k)) for k in
                                           ("active", "prompt_len", "response_len", "truncated", "is_final",
                                            "num_chunks")})


class RolloutCollector:
  """Generates the rows of one step from an iterator of question batches."""

  def __init__(self, agent, spec: RolloutSpec, *, prompt_width: int, response_width: int):
    self.agent, self.spec = agent, spec
    self.prompt_width, self.response_width = prompt_width, response_width
    self.reward_fn = get_reward_fn(spec.reward)
    self.advantage_fn = adv_lib.get_advantage(spec.advantage)

  def _generate(self, samples: QuestionBatch, seed: int) -> tuple[list[_Call], slice]:
    """G trajectories for this process's share of the batch's questions, in reader calls of
    rl.rollout_batch trajectories over all processes. Trajectory g of question q samples with
    row id q * G + g under `seed`, so it is the same on any number of devices or processes."""
    g = self.spec.group_size
    mine = this_process_share(len(samples), "questions of a rollout batch")
    questions = [samples.question[q] for q in range(mine.start, mine.stop) for _ in range(g)]
    documents = [samples.context[q] for q in range(mine.start, mine.stop) for _ in range(g)]
    gold = [samples.answers[q] for q in range(mine.start, mine.stop) for _ in range(g)]
    row_ids = [q * g + k for q in range(mine.start, mine.stop) for k in range(g)]
    calls, decode = [], DecodeSpec(temperature=self.spec.temperature, top_p=self.spec.top_p)
    for start in range(0, len(questions), self._call_rows()):
      part = slice(start, start + self._call_rows())
      slots = self.agent.rollout_slots(
          questions[part], documents[part], decode=decode, seed=seed, row_ids=row_ids[part],
          prompt_width=self.prompt_width, response_width=self.response_width)
      if slots.gate is not None and dict(self.spec.gate_weights).get("evidence"):
        slots = dataclasses.replace(slots, evidence=self._evidence(documents[part], gold[part], slots.turns))
      calls.append(_Call.gather(slots))
    return calls, mine

  def _evidence(self, documents: list[str], gold: list[tuple[str, ...]], turns: int) -> np.ndarray:
    """[b, turns] the "evidence" gate term's labels: each row's chunks (each distinct document chunked once)
    against its gold answers."""
    distinct = list(dict.fromkeys(documents))
    chunks = dict(zip(distinct, self.agent.chunk_texts(distinct)))
    return gate_signals.answer_in_chunks([chunks[d] for d in documents], [list(a) for a in gold], turns)

  def _call_rows(self) -> int:
    """Trajectories per reader call on each process."""
    return max(1, self.spec.rollout_batch // jax.process_count())

  def _gate_weights(self, calls: list[_Call]) -> dict[str, float]:
    """The nonzero gate term weights, when the reader is gated (an overwrite reader has no gates)."""
    weights = {k: w for k, w in self.spec.gate_weights if w}
    return weights if weights and all(c.slots.gate is not None for c in calls) else {}

  def _rewards(self, calls: list[_Call], answers) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(reward, raw score, final answer tokens, shaped final reward) of this process's trajectories; shaping
    (DAPO's overlong penalty) applies to the final answer's length only, memory updates are capped by the
    agent; the reward adds the weighted gate terms (gate_signals) to the shaped final reward."""
    g = self.spec.group_size
    texts = [(a, p) for c in calls for a, p in zip(c.slots.answers, c.slots.predictions)]
    scores = np.asarray([self.reward_fn(a, p, list(answers[i // g])) for i, (a, p) in enumerate(texts)], np.float32)
    lengths = np.concatenate([(c.slots.response_len * c.slots.is_final).sum(1) for c in calls])  # stop token included, as DAPO
    shaped = scores.copy()
    ov = self.spec.overlong
    if ov is not None:
      shaped += overlong_penalty(lengths, max_tokens=ov.max_tokens, cache_tokens=ov.cache_tokens)
    weights = self._gate_weights(calls)
    if not weights:
      return shaped, scores, lengths, shaped
    terms, start = [], 0
    for c in calls:
      n = len(c.slots.answers)
      terms.append(gate_signals.weighted_terms(_outcome(c.slots, scores[start:start + n]), weights)[0])
      start += n
    return (shaped + np.concatenate(terms)).astype(np.float32), scores, lengths, shaped

  def collect(self, batches: Iterator[QuestionBatch], seed_of: Callable[[int, int], int]) -> StepRollout:
    """Draws question batches until `questions_per_step` groups are kept (dynamic sampling) or
    the first batch is used as is; seed_of(gen_batch, 0) seeds generation batch gen_batch.

    Each process generates its share of every batch; rewards are shared so that every process
    keeps the same groups, and the rows are planned in question order on every process."""
    spec, g = self.spec, self.spec.group_size
    t0 = time.perf_counter()
    kept, kept_rewards, gens = [], [], []  # kept (gen, q); rewards [G] each; per gen: (calls, share)
    all_scores, all_rewards, all_lengths, finals = [], [], [], []  # finals: per gen (shaped final reward, score)
    groups_seen = gen = gate_only = 0  # gate_only: groups kept for their gate terms alone (equal scores)
    while True:
      samples = next(batches)
      calls, mine = self._generate(samples, seed_of(gen, 0))
      answers = samples.answers[mine]
      shaped, scores, lengths, final = map(gather_rows, self._rewards(calls, answers))  # every process's
      gens.append((calls, mine.stop - mine.start))
      finals.append((final, scores))
      gate_filter = spec.dynamic_sampling_filter == "score_or_gates" and bool(self._gate_weights(calls))
      all_scores.append(scores), all_rewards.append(shaped), all_lengths.append(lengths)
      nq = len(samples)
      groups_seen += nq
      for q in range(nq):
        acc = scores[q * g:(q + 1) * g]
        if spec.dynamic_sampling and np.all(acc == acc[0]):
          # DAPO filters on accuracy; "score_or_gates": weighed gate terms are a signal of their own
          if not (gate_filter and self._gate_signal(gen, q, gens, finals, shaped - final)):
            continue
          gate_only += 1
        kept.append((gen, q))
        kept_rewards.append(shaped[q * g:(q + 1) * g])
      gen += 1
      full = len(kept) >= spec.questions_per_step
      if not spec.dynamic_sampling or full:
        break
      if gen > spec.max_extra_gen_batches:
        if spec.on_insufficient == "fail":
          raise DynamicSamplingError(
              f"dynamic sampling kept {len(kept)} of the {spec.questions_per_step} groups a step "
              f"needs after {gen} generation batches (rl.max_extra_gen_batches={spec.max_extra_gen_batches}):"
              " every other group had equal rewards; raise max_extra_gen_batches, or set "
              "rl.on_insufficient='proceed' to train on the kept groups")
        break
    informative = len(kept)  # groups with a reward or gate signal, before trimming to the step size
    kept, kept_rewards = kept[:spec.questions_per_step], kept_rewards[:spec.questions_per_step]
    scores, shaped, lengths = map(np.concatenate, (all_scores, all_rewards, all_lengths))
    calls = [c for cs, _ in gens for c in cs]
    metrics = RolloutMetrics(
        reward_mean=float(shaped.mean()), accuracy=float(scores.mean()),
        kept_group_frac=informative / max(1, groups_seen), gen_batches=gen, kept_groups=len(kept),
        answer_tokens=float(lengths.mean()), **_call_metrics(calls),
        gate_signal_groups=(gate_only if spec.dynamic_sampling and spec.dynamic_sampling_filter == "score_or_gates"
                            and self._gate_weights(calls) else None),
        rows_per_process=float(len(scores) / jax.process_count()), rollout_seconds=time.perf_counter() - t0,
        seconds_per_doc=(time.perf_counter() - t0) / max(1, len(scores)))
    rows = self._rows(kept, kept_rewards, gens, finals) if kept else None
    return StepRollout(rows=rows, num_questions=len(kept), metrics=metrics)

  def _rows(self, kept: list[tuple[int, int]], kept_rewards: list[np.ndarray], gens, finals) -> SlotRows:
    """The kept groups' rows, planned identically on every process: group k's trajectories in order,
    each trajectory's conversations in order, as slots of the concatenated slot tables of the calls
    that hold them."""
    g, per_call = self.spec.group_size, self._call_rows()
    traj_adv = self.advantage_fn(np.concatenate(kept_rewards), np.repeat(np.arange(len(kept)), g),
                                 eps=self.spec.eps)  # [K * G]
    turn_adv = self._turn_advantages(kept, traj_adv, gens, finals) if self.spec.advantage_mode != "trajectory" else None
    tables, offsets, slot, question, advantages, tokens, prompt_len = [], {}, [], [], [], [], []
    for k, (gen, q) in enumerate(kept):
      calls, share = gens[gen]
      process, local_q = divmod(q, share)
      for j in range(g):
        call, row = divmod(local_q * g + j, per_call)  # this trajectory's call and row within it (per process)
        c = calls[call]
        local_rows = len(c.active) // jax.process_count()
        r = process * local_rows + row  # global row of the call's slots
        if (gen, call) not in offsets:
          offsets[(gen, call)] = sum(len(t.prompt_len) for t in tables)
          tables.append(c.slots.slots)
        turns = np.flatnonzero(c.active[r])
        slot.append(offsets[(gen, call)] + r * c.active.shape[1] + turns)
        question.append(np.full(len(turns), k))
        advantages.append(np.full(len(turns), traj_adv[k * g + j]) if turn_adv is None else turn_adv[k][j][turns])
        tokens.append(c.prompt_len[r, turns] + c.response_len[r, turns])
        prompt_len.append(c.prompt_len[r, turns])
    slots = tables[0] if len(tables) == 1 else jax.tree.map(lambda *x: jnp.concatenate(x), *tables)
    cat = lambda parts, dtype: np.concatenate(parts).astype(dtype)
    return SlotRows(slots=slots, slot=cat(slot, np.int32), question=cat(question, np.int32),
                    advantages=cat(advantages, np.float32), tokens=cat(tokens, np.int64),
                    prompt_len=cat(prompt_len, np.int64), pad_id=self.agent.pad_id,
                    mask_truncated=self.spec.mask_truncated)


  def _locate(self, gen: int, q: int, j: int, gens) -> tuple[_Call, int]:
    """The call holding trajectory j of question q of generation batch gen, and its global row there."""
    calls, share = gens[gen]
    process, local_q = divmod(q, share)
    call, row = divmod(local_q * self.spec.group_size + j, self._call_rows())
    c = calls[call]
    return c, process * (len(c.active) // jax.process_count()) + row

  def _gate_signal(self, gen: int, q: int, gens, finals, terms: np.ndarray) -> bool:
    """Whether group q of generation batch gen has an advantage from its weighed gate terms alone (its
    scores agree): its trajectories' terms [N] differ, or (turn-level modes) its turns' at one position."""
    g = self.spec.group_size
    if np.ptp(terms[q * g:(q + 1) * g]) > GATE_SIGNAL_TOL:
      return True
    return (self.spec.advantage_mode != "trajectory"
            and bool(np.any(np.abs(self._group_turn_advantages(gen, q, gens, finals)) > GATE_SIGNAL_TOL)))

  def _turn_advantages(self, kept, traj_adv, gens, finals) -> list[np.ndarray]:
    """Per kept group, the advantage mode's [G, T] advantages: the trajectory advantages mixed with the
    turn-level ones."""
    g, mode = self.spec.group_size, gate_signals.ADVANTAGE_MODES.get(self.spec.advantage_mode)
    return [mode(traj_adv[k * g:(k + 1) * g], self._group_turn_advantages(gen, q, gens, finals),
                 weight=self.spec.turn_advantage_weight) for k, (gen, q) in enumerate(kept)]

  def _group_turn_advantages(self, gen: int, q: int, gens, finals) -> np.ndarray:
    """[G, T] turn-level advantages of group q of generation batch gen: each turn's final reward + weighted
    gate terms, centred over the group's turns at the same position."""
    g = self.spec.group_size
    weights = {k: w for k, w in self.spec.gate_weights if w}
    rows = [self._locate(gen, q, j, gens) for j in range(g)]
    t = max(c.active.shape[1] for c, _ in rows)
    pad = lambda x: np.pad(x, (0, t - len(x)))
    active = np.stack([pad(c.active[r]) for c, r in rows])  # [G, T]
    final = np.stack([pad(c.is_final[r]) for c, r in rows])
    gate = np.stack([pad(c.gate[r]) if c.gate is not None else np.zeros(t, np.int32) for c, r in rows])
    base, score = (finals[gen][0][q * g:(q + 1) * g], finals[gen][1][q * g:(q + 1) * g])
    doc = np.asarray([c.doc_chunks[r] if c.doc_chunks is not None else c.num_chunks[r] for c, r in rows])
    evidence = np.stack([pad(c.evidence[r]) for c, r in rows]) if rows[0][0].evidence is not None else None
    outcome = gate_signals.GateOutcome(score=score, gate=gate, memory_turn=active & ~final, doc_chunks=doc,
                                       evidence=evidence)
    turn_terms = gate_signals.weighted_terms(outcome, weights)[1] if weights and rows[0][0].gate is not None \
        else np.zeros((g, t))
    turn_rewards = np.asarray(base, np.float64)[:, None] + turn_terms  # [G, T]
    return gate_signals.turn_advantages(turn_rewards, active, final, np.zeros(g, np.int64))


def _outcome(slots: RolloutSlots, scores) -> gate_signals.GateOutcome:
  """The gate terms' view of one call's trajectories (this process's rows)."""
  doc = slots.doc_chunks if slots.doc_chunks is not None else slots.num_chunks
  return gate_signals.GateOutcome(score=np.asarray(scores), gate=slots.gate, memory_turn=slots.active & ~slots.is_final,
                                  doc_chunks=np.asarray(doc), evidence=slots.evidence)


def _call_metrics(calls: list[_Call]) -> dict[str, float]:
  """Means over every process's trajectories of memory length, chunks, truncation, tokens, decoded
  tokens, and (gated readers) the shares of memory turns that kept, stopped or were invalid."""
  memory = np.concatenate([(c.active & ~c.is_final).ravel() for c in calls])
  stop = np.concatenate([(c.response_len - (~c.truncated).astype(np.int32)).ravel() for c in calls])  # memory tokens: no stop token
  active = np.concatenate([c.active.ravel() for c in calls])
  truncated = np.concatenate([c.truncated.ravel() for c in calls])
  tokens = np.concatenate([(c.prompt_len + c.response_len).ravel() for c in calls])
  chunks = np.concatenate([c.num_chunks for c in calls])
  decoded = np.concatenate([c.response_len.ravel() for c in calls])
  out = {"memory_tokens": float(stop[memory].sum()) / max(1, memory.sum()),
         "chunks_per_doc": float(chunks.mean()),
         "truncated_frac": float(truncated[active].sum()) / max(1, active.sum()),
         "rollout_tokens": float(tokens[active].sum()),
         "decoded_tokens_per_doc": float(decoded[active].sum()) / max(1, len(chunks))}
  if all(c.gate is not None for c in calls):
    gate = np.concatenate([c.gate.ravel() for c in calls])[memory]
    for name, code in (("keep_frac", gates.KEEP), ("stop_frac", gates.STOP), ("invalid_frac", gates.INVALID)):
      out[name] = float((gate == code).sum()) / max(1, gate.size)
    if all(c.evidence is not None for c in calls):  # writes from evidence, keeps past none
      evidence = np.concatenate([c.evidence.ravel() for c in calls])[memory]
      out["evidence_agree_frac"] = float(gate_signals.agrees_with_evidence(gate, evidence).sum()) / max(1, gate.size)
  return out
