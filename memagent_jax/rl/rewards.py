"""Rule-based rewards and answer metrics for MemAgent (arXiv 2507.02259).

Three families live here, because training and evaluation score answers differently:
  * `memagent_verifier`: the released RL training reward, a MATH-style string match of the
    last `\\boxed{}` in the final response against every ground truth (binary).
  * SQuAD/HotpotQA metrics (`exact_match`, `sub_em`, `f1`) used by the paper's QA tables.
  * RULER metrics (`string_match_all`, `string_match_part`, paper Eq. 7).

Every metric takes `truths` as one string or a list of strings; an empty list is a
`ValueError`, since a score against nothing is meaningless. A `None` prediction (what
`extract_boxed` returns when there is no answer) scores 0.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Optional, Sequence, Union

from memagent_jax.text.answers import answer_after_marker, extract_boxed  # noqa: F401 (public API: rewards.extract_boxed)

Truths = Union[str, Sequence[str]]

VERIFIER_TAIL_CHARS = 300
_HOTPOT_SPECIAL = frozenset({"yes", "no", "noanswer"})
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _as_list(truths: Truths, name: str = "truths") -> list[str]:
  """A bare string is one truth; an empty list would silently score 0, so refuse it."""
  items = [truths] if isinstance(truths, str) else list(truths)
  if not items:
    raise ValueError(f"{name} is empty: need at least one reference answer to score against")
  for item in items:
    if not isinstance(item, str):
      raise TypeError(f"{name} must hold strings, got {type(item).__name__}: {item!r}")
  return items


# ---------------------------------------------------------------------------------------
# MATH-style string normalization (the classic hendrycks `strip_string`, rewritten).


class _StripError(ValueError):
  """Where the reference `strip_string` raises; `_math_equiv` then compares raw strings."""


def _drop_right_units(s: str) -> str:
  """`5 \\text{ cm}` -> `5 `; MATH only writes `\\text{ ` for units, and only once."""
  parts = s.split("\\text{ ")
  if len(parts) > 2:
    raise _StripError("more than one '\\text{ ' unit")
  return parts[0]


def _fix_sqrt(s: str) -> str:
  """`\\sqrt3` -> `\\sqrt{3}` so both spellings compare equal."""
  parts = s.split("\\sqrt")
  out = parts[0]
  for part in parts[1:]:
    if not part:
      raise _StripError("dangling \\sqrt")
    out += "\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
  return out


def _fix_fracs(s: str) -> str:
  """`\\frac12` -> `\\frac{1}{2}` and `\\frac1{72}` -> `\\frac{1}{72}` (not `\\frac{72}1`)."""
  parts = s.split("\\frac")
  out = parts[0]
  for part in parts[1:]:
    out += "\\frac"
    if not part:
      raise _StripError("dangling \\frac")
    if part[0] == "{":
      out += part
      continue
    if len(part) < 2:
      return s
    num, second, rest = part[0], part[1], part[2:]
    if second == "{":
      out += "{" + num + "}" + second + rest
    else:
      out += "{" + num + "}{" + second + "}" + rest
  return out


def _fix_a_slash_b(s: str) -> str:
  """A plain integer ratio `3/4` -> `\\frac{3}{4}`; anything else is left alone."""
  parts = s.split("/")
  if len(parts) != 2:
    return s
  try:
    num, den = int(parts[0]), int(parts[1])
  except ValueError:
    return s
  if s != f"{num}/{den}":
    return s
  return "\\frac{" + str(num) + "}{" + str(den) + "}"


def _strip_math(s: str) -> str:
  """Canonical form of a LaTeX answer, in the reference's step order (order matters).

  Only `\\%` is removed, not a bare `%`: the classic code's two percent lines both remove
  the two-character `\\%` (one is an invalid-escape spelling of the other), so we keep that.
  Likewise only `\\$` is removed, not a bare `$`.
  """
  s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
  s = s.replace("tfrac", "frac").replace("dfrac", "frac")
  s = s.replace("\\left", "").replace("\\right", "")
  s = s.replace("^{\\circ}", "").replace("^\\circ", "")
  s = s.replace("\\$", "")
  s = _drop_right_units(s)
  s = s.replace("\\%", "")
  s = s.replace(" .", " 0.").replace("{.", "{0.")
  if not s:
    return s
  if s[0] == ".":
    s = "0" + s
  sides = s.split("=")
  if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 5" / "k=5" -> "5"
    s = sides[1]
  s = _fix_sqrt(s)
  s = s.replace(" ", "")
  s = _fix_fracs(s)
  if s == "0.5":
    s = "\\frac{1}{2}"
  return _fix_a_slash_b(s)


def _math_equiv(answer: str, truth: str) -> bool:
  """Equality after stripping; raw equality where stripping fails, as in MATH `is_equiv`."""
  try:
    return _strip_math(answer) == _strip_math(truth)
  except _StripError:
    return answer == truth


def memagent_verifier(response: str, truths: Truths) -> float:
  """The released training reward: 1.0 iff the last box in the tail matches any truth.

  Only the last 300 characters of the final response are read (so an answer boxed early and
  followed by rambling earns nothing), lowercased, and the last `\\boxed{}` is compared with
  each lowercased ground truth after MATH-style stripping. No box -> 0.0.
  """
  truths = _as_list(truths)
  answer = extract_boxed(response[-VERIFIER_TAIL_CHARS:].lower())
  if answer is None:
    return 0.0
  return max(float(_math_equiv(answer, truth.lower())) for truth in truths)


# ---------------------------------------------------------------------------------------
# SQuAD / HotpotQA metrics.


def normalize_answer(text: str) -> str:
  """SQuAD normalization: lowercase, drop punctuation, drop articles, collapse whitespace."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(pred: Optional[str], truths: Truths) -> float:
  """1.0 if the normalized prediction equals any normalized truth."""
  truths = _as_list(truths)
  if pred is None:
    return 0.0
  norm = normalize_answer(pred)
  return max(float(norm == normalize_answer(t)) for t in truths)


def sub_em(pred: Optional[str], truths: Truths) -> float:
  """The paper's test metric: truth within prediction or prediction within truth.

  Deliberately scored against the FIRST gold answer only (`truths[0]`), as the released
  evaluation does (`item["answers"][0]`); later aliases never count. A prediction that
  normalizes to "" scores 0 (it is trivially inside every truth; the release skips empties).
  """
  truth = normalize_answer(_as_list(truths)[0])
  if pred is None:
    return 0.0
  norm = normalize_answer(pred)
  if not norm:
    return 0.0
  return float(truth in norm or norm in truth)


def _f1_one(pred: str, truth: str) -> float:
  """HotpotQA token F1; a yes/no/noanswer mismatch is 0 even with token overlap."""
  norm_pred, norm_truth = normalize_answer(pred), normalize_answer(truth)
  if (norm_pred in _HOTPOT_SPECIAL or norm_truth in _HOTPOT_SPECIAL) and norm_pred != norm_truth:
    return 0.0
  pred_tokens, truth_tokens = norm_pred.split(), norm_truth.split()
  common = collections.Counter(pred_tokens) & collections.Counter(truth_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_tokens)
  recall = num_same / len(truth_tokens)
  return 2 * precision * recall / (precision + recall)


def f1(pred: Optional[str], truths: Truths) -> float:
  """SQuAD/HotpotQA token F1, max over truths."""
  truths = _as_list(truths)
  if pred is None:
    return 0.0
  return max(_f1_one(pred, t) for t in truths)


# ---------------------------------------------------------------------------------------
# RULER metrics.


def string_match_all(pred: Optional[str], refs: Truths) -> float:
  """RULER (paper Eq. 7): fraction of refs found case-insensitively in the prediction."""
  refs = _as_list(refs, "refs")
  if pred is None:
    return 0.0
  low = pred.lower()
  return sum(ref.lower() in low for ref in refs) / len(refs)


def string_match_part(pred: Optional[str], refs: Truths) -> float:
  """RULER QA variant: 1.0 if any ref is found case-insensitively in the prediction."""
  refs = _as_list(refs, "refs")
  if pred is None:
    return 0.0
  low = pred.lower()
  return float(any(ref.lower() in low for ref in refs))
