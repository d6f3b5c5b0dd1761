"""RULER-style generators: fitting, determinism, needles, vt chains, fwe counts, errors."""

import collections
import dataclasses
import re
import time

import pytest

from memagent_jax.data import haystack, ruler
from memagent_jax.data.fitting import fit_size
from memagent_jax.policy.loading import load_tokenizer

NEEDLE_RE = re.compile(r"One of the special magic (numbers|uuids|words) for (\S+) is: (\S+)\.")
NIAH = [t for t in ruler.TASKS if t.startswith("niah")]


@pytest.fixture(scope="module")
def tok():
  """The embedded SmolLM2 tokenizer (`load_tokenizer()`, cached once per process)."""
  return load_tokenizer()


def _queried_keys(question: str) -> list[str]:
  keys = re.search(r" for (.+) mentioned in the provided text\?$", question).group(1)
  return [k for k in re.split(r", and |, | and ", keys) if k]


def _needles(context: str) -> list[tuple[str, str, str]]:
  return NEEDLE_RE.findall(context)


@pytest.mark.parametrize("task", list(ruler.TASKS))
@pytest.mark.parametrize("length", [1024, 4096])
def test_fits_length_exactly_counted(tok, task, length):
  for s in ruler.generate(task, length, n=2, seed=0, tokenizer=tok):
    n = len(tok.encode(s["context"]))
    assert s["num_tokens"] == n
    assert 0.9 * length <= n <= length
    assert s["task"] == task and s["length"] == length
    assert s["question"] and s["answers"] and all(isinstance(a, str) for a in s["answers"])


def test_128k_sample_is_fast_and_fitted(tok):
  t = time.perf_counter()
  s = ruler.generate("niah_single_2", 131072, n=1, seed=3, tokenizer=tok)[0]
  elapsed = time.perf_counter() - t
  assert 0.99 * 131072 <= len(tok.encode(s["context"])) <= 131072
  assert elapsed < 20, elapsed


@pytest.mark.parametrize("task", list(ruler.TASKS))
def test_deterministic_and_seeded(tok, task):
  a = ruler.generate(task, 1024, n=2, seed=7, tokenizer=tok)
  assert a == ruler.generate(task, 1024, n=2, seed=7, tokenizer=tok)
  b = ruler.generate(task, 1024, n=2, seed=8, tokenizer=tok)
  for x, y in zip(a, b):
    assert x["context"] != y["context"] and x["answers"] != y["answers"]
  assert a[0]["answers"] != a[1]["answers"]  # samples within a set differ too
  # A sample does not depend on how many were generated.
  assert ruler.generate(task, 1024, n=1, seed=7, tokenizer=tok)[0] == a[0]


@pytest.mark.parametrize("task", NIAH)
def test_needles_hold_exactly_the_answers(tok, task):
  spec = ruler.NIAH_SPECS[task]
  for s in ruler.generate(task, 2048, n=3, seed=1, tokenizer=tok):
    keys = _queried_keys(s["question"])
    assert len(keys) == spec.num_queries
    found = _needles(s["context"])
    assert all(kind == spec.value_kind for kind, _, _ in found)
    values_of = collections.defaultdict(list)
    for _, k, v in found:
      values_of[k].append(v)
    per_key = spec.num_values  # answers: each queried key's values, in question order
    assert [set(s["answers"][i * per_key:(i + 1) * per_key]) for i in range(len(keys))] == [
        set(values_of[k]) for k in keys]
    assert sorted(v for k in keys for v in values_of[k]) == sorted(s["answers"])
    assert len(s["answers"]) == spec.num_queries * spec.num_values
    for k in keys:  # each answer needle appears exactly once, verbatim
      for v in values_of[k]:
        sentence = f"One of the special magic {spec.value_kind} for {k} is: {v}."
        assert s["context"].count(sentence) == 1
    if spec.haystack == "needle":  # the haystack is made of other needles
      lines = s["context"].split("\n")
      assert len(lines) > 10 and all(NEEDLE_RE.fullmatch(line) for line in lines)
      assert all(len(values_of[k]) == spec.num_values for k in keys)  # fillers avoid real keys
      value_counts = collections.Counter(v for _, _, v in found)
      assert all(value_counts[a] == 1 for a in s["answers"])  # ... and real values
    else:
      assert len(found) == spec.num_keys * spec.num_values
      assert len({k for _, k, _ in found}) == spec.num_keys  # distractor keys (multikey_1)
    if spec.haystack == "noise":
      assert haystack.NOISE_SENTENCE in s["context"]


def test_single_question_wording(tok):
  s = ruler.generate("niah_single_3", 1024, tokenizer=tok)[0]
  assert re.fullmatch(r"What is the special magic uuid for [a-z]+-[a-z]+ mentioned in the "
                      r"provided text\?", s["question"])
  assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                      s["answers"][0])
  m = ruler.generate("niah_multiquery", 1024, tokenizer=tok)[0]["question"]
  assert m.startswith("What are all the special magic numbers for ") and ", and " in m


def test_needle_depths_vary(tok):
  """Needles land at seeded random depths, not always at the same place."""
  fractions = set()
  for s in ruler.generate("niah_single_1", 2048, n=6, seed=0, tokenizer=tok):
    pos = s["context"].index("One of the special magic")
    fractions.add(round(pos / len(s["context"]), 1))
  assert len(fractions) >= 3


def _resolve_vt(context: str) -> dict[str, str]:
  assigned = dict(re.findall(r"^VAR ([A-Z]{5}) = (\d+|VAR [A-Z]{5})$", context, re.M))
  def value(v):
    seen = set()
    while assigned[v].startswith("VAR "):
      assert v not in seen
      seen.add(v)
      v = assigned[v][4:]
    return assigned[v]
  return {v: value(v) for v in assigned}


@pytest.mark.parametrize("num_chains", [1, 3])
def test_vt_chain_answers_hold_the_value(tok, num_chains):
  for s in ruler.generate("vt", 2048, n=3, seed=2, tokenizer=tok, num_chains=num_chains):
    target = re.search(r"assigned the value (\d+)", s["question"]).group(1)
    values = _resolve_vt(s["context"])
    assert len(values) == 5 * num_chains
    assert sorted(v for v, x in values.items() if x == target) == sorted(s["answers"])
    assert len(s["answers"]) == 5
    # Statements appear in chain order (each variable is defined before it is used).
    lines = [ln for ln in s["context"].split("\n") if ln.startswith("VAR ")]
    defined = set()
    for ln in lines:
      name, rhs = re.match(r"VAR (\w+) = (.+)", ln).groups()
      assert not rhs.startswith("VAR ") or rhs[4:] in defined
      defined.add(name)


def test_fwe_answers_are_true_top3(tok):
  for length in (1024, 8192):
    for s in ruler.generate("fwe", length, n=2, seed=4, tokenizer=tok):
      counts = collections.Counter(w for w in s["context"].split() if w != "....")
      top = counts.most_common(4)
      assert [w for w, _ in top[:3]] == s["answers"]
      assert top[2][1] > top[3][1]  # the top three are unambiguous
      assert s["context"].split().count("....") > top[0][1]  # the dots dominate, as in RULER


def test_cheap_counter_callable():
  count = lambda text: len(text.split())
  for task in ("niah_single_2", "vt", "fwe"):
    s = ruler.generate(task, 3000, n=1, seed=0, tokenizer=count)[0]
    assert s["num_tokens"] == count(s["context"])
    assert 0.95 * 3000 <= s["num_tokens"] <= 3000


def test_errors(tok):
  with pytest.raises(ValueError, match="niah_single_1.*fwe"):
    ruler.generate("niah_single_9", 1024, tokenizer=tok)
  with pytest.raises(ValueError, match="too small"):
    ruler.generate("niah_multikey_3", 20, tokenizer=tok)
  with pytest.raises(ValueError, match="too small"):
    ruler.generate("vt", 30, tokenizer=tok)
  with pytest.raises(ValueError, match="too small"):
    ruler.generate("fwe", 40, tokenizer=tok)
  with pytest.raises(ValueError, match="positive"):
    ruler.generate("vt", 0, tokenizer=tok)


@pytest.mark.parametrize("guess", [0, 3, 57, 58, 200, 10_000])
def test_fit_size_finds_the_largest_fitting_size(guess):
  calls = []
  def render(n):
    calls.append(n)
    return " ".join(["ab cd"] * n + ["end"])  # 2n + 1 words
  n, text, tokens = fit_size(render, 116, lambda t: len(t.split()), guess)
  assert (n, tokens) == (57, 115) and text == render(57)
  if guess in (57, 58):
    assert len(set(calls)) <= 4  # a good estimate needs only a few full counts


def test_essay_haystack_is_seeded_plain_text():
  a = haystack.Essay(1).sentences(300)
  assert a == haystack.Essay(1).sentences(300)
  assert a != haystack.Essay(2).sentences(300)
  assert haystack.Essay(1).sentences(20) == a[:20]  # a stable prefix for binary search
  assert len(set(a)) > 290  # varied
  text = " ".join(a)
  assert not re.search(r"[0-9\-]|magic|VAR", text)
  assert all(s[0].isupper() and s[-1] in ".?" for s in a)


def test_noise_sentence_exact():
  assert haystack.NOISE_SENTENCE == ("The grass is green. The sky is blue. The sun is yellow. "
                                     "Here we go. There and back again.")


def test_needle_haystack_never_reuses_real_keys(tok):
  """With only four possible word keys, filler needles must still avoid the queried one."""
  from memagent_jax.data.ruler_niah import make_niah
  from memagent_jax.data.tokens import TokenCounter
  spec = dataclasses.replace(ruler.NIAH_SPECS["niah_multikey_2"], words=(("red", "blue"), ("fox", "cat")))
  s = make_niah(spec, ruler.sample_rng("niah_multikey_2", 1024, 0, 0), 1024, TokenCounter(tok))
  key = _queried_keys(s["question"])[0]
  found = _needles(s["context"])
  assert len(found) > 20 and {k for _, k, _ in found} <= {"red-fox", "red-cat", "blue-fox",
                                                         "blue-cat"}
  assert [v for _, k, v in found if k == key] == s["answers"]
