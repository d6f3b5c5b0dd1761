"""Reading the answer out of a response: the last `\\boxed{...}`, or the text after "the answer is".

The agent, the rewards and the CLI all read answers the same way, so it lives below all of them.
"""

from __future__ import annotations

from typing import Optional


def _match_brace(text: str, open_idx: int) -> Optional[int]:
  """Index of the `}` closing the `{` at `open_idx`, or None when the braces never balance."""
  depth = 0
  for i in range(open_idx, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return i
  return None


def extract_boxed(text: str) -> Optional[str]:
  """Content of the last `\\boxed{...}` (brace-matched), so nested `\\frac{1}{2}` survives.

  Like MATH's `last_boxed_only_string`, the `\\boxed 5$` form (up to the next `$`) is
  accepted. Unlike it, an earlier `\\boxed ` never overrides a later `\\boxed{}` (the last
  occurrence always wins), and `\\fbox` is ignored (the released reward never scored it).
  None when there is no box, the last box is unbalanced, or it is followed by neither `{`
  nor a space.
  """
  idx = text.rfind("\\boxed")
  if idx < 0:
    return None
  start = idx + len("\\boxed")
  if text.startswith("{", start):
    end = _match_brace(text, start)
    return None if end is None else text[start + 1:end]
  if text.startswith(" ", start):
    return text[start + 1:].split("$")[0]
  return None


def answer_after_marker(text: str, marker: str = "the answer is") -> Optional[str]:
  """Text after the last case-insensitive `marker` ("Therefore, the answer is X.") or None."""
  idx = text.lower().rfind(marker.lower())
  if idx < 0:
    return None
  answer = text[idx + len(marker):].strip()
  if answer.endswith("."):
    answer = answer[:-1].rstrip()
  return answer
