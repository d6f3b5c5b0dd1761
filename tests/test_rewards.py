"""Rewards and metrics against hand-computed expectations (never re-derived from the code)."""

import pytest

from memagent_jax.rl import rewards


# --- extract_boxed -----------------------------------------------------------------------


def test_extract_boxed_keeps_nested_braces():
  assert rewards.extract_boxed("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"


def test_extract_boxed_last_wins():
  assert rewards.extract_boxed("\\boxed{1} no wait \\boxed{2}.") == "2"


def test_extract_boxed_unbalanced_or_missing_is_none():
  assert rewards.extract_boxed("\\boxed{1} then \\boxed{\\frac{2}{3}") is None
  assert rewards.extract_boxed("the answer is 4") is None


def test_extract_boxed_space_form_empty_box_and_no_fbox():
  assert rewards.extract_boxed("$\\boxed 5$ ok") == "5"
  assert rewards.extract_boxed("\\boxed{}") == ""
  assert rewards.extract_boxed("\\fbox{7}") is None  # the released reward never scored fbox
  assert rewards.extract_boxed("\\boxed{1} and \\boxedx") is None  # last box is malformed


def test_answer_after_marker_takes_last_and_trims():
  text = "First the answer is 3? Therefore, The Answer Is  Paris France. "
  assert rewards.answer_after_marker(text) == "Paris France"
  assert rewards.answer_after_marker("no marker here") is None
  assert rewards.answer_after_marker("Final: 12", marker="final:") == "12"


# --- memagent_verifier -------------------------------------------------------------------


def test_verifier_nested_frac_and_wrong_answer():
  assert rewards.memagent_verifier("thus \\boxed{\\frac{1}{2}}", ["\\frac{1}{2}"]) == 1.0
  assert rewards.memagent_verifier("thus \\boxed{\\frac{1}{3}}", ["\\frac{1}{2}"]) == 0.0


def test_verifier_reads_only_last_300_chars():
  inside = "\\boxed{42}" + "." * 290  # 300 chars: the box is fully inside the tail
  outside = "\\boxed{42}" + "." * 291  # 301 chars: the leading backslash falls off
  assert len(inside) == 300
  assert rewards.memagent_verifier(inside, "42") == 1.0
  assert rewards.memagent_verifier(outside, "42") == 0.0
  assert rewards.memagent_verifier("\\boxed{42}" + "x" * 1000, "42") == 0.0


def test_verifier_case_insensitive():
  assert rewards.memagent_verifier("\\boxed{PARIS}", ["Paris"]) == 1.0


def test_verifier_ignores_spaces_and_newlines():
  assert rewards.memagent_verifier("\\boxed{New\n York}", ["newyork"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{1, 2,\n3}", ["1,2,3"]) == 1.0


def test_verifier_frac_spellings():
  assert rewards.memagent_verifier("\\boxed{\\dfrac{3}{4}}", ["\\frac{3}{4}"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{\\tfrac34}", ["\\frac{3}{4}"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{3/4}", ["\\frac{3}{4}"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{0.5}", ["\\frac12"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{.5}", ["\\frac{1}{2}"]) == 1.0


def test_verifier_left_right_and_degrees():
  assert rewards.memagent_verifier("\\boxed{\\left( 1, 2 \\right)}", ["(1,2)"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{90^\\circ}", ["90"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{90^{\\circ}}", ["90"]) == 1.0


def test_verifier_misc_math_stripping():
  assert rewards.memagent_verifier("\\boxed{x = 5}", ["5"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{5 \\text{ cm}}", ["5"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{\\$5}", ["5"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{\\sqrt2}", ["\\sqrt{2}"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{1\\!000}", ["1000"]) == 1.0


def test_verifier_percent_only_escaped_form_is_removed():
  assert rewards.memagent_verifier("\\boxed{50\\%}", ["50"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{50%}", ["50"]) == 0.0  # bare % kept, as in MATH


def test_verifier_falls_back_to_raw_equality_when_stripping_fails():
  assert rewards.memagent_verifier("\\boxed{\\frac}", ["\\frac"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{\\frac}", ["\\frac "]) == 0.0


def test_verifier_no_box_is_zero():
  assert rewards.memagent_verifier("The answer is 42.", ["42"]) == 0.0


def test_verifier_multiple_truths_takes_max():
  assert rewards.memagent_verifier("\\boxed{Lyon}", ["Paris", "lyon"]) == 1.0
  assert rewards.memagent_verifier("\\boxed{Nice}", ["Paris", "lyon"]) == 0.0


# --- SQuAD / HotpotQA metrics ------------------------------------------------------------


def test_normalize_answer_examples():
  assert rewards.normalize_answer("The  Cat!") == "cat"
  assert rewards.normalize_answer("An apple, a DAY.") == "apple day"
  assert rewards.normalize_answer("theater") == "theater"  # articles only as whole words


def test_exact_match():
  assert rewards.exact_match("The Cat.", ["dog", "cat"]) == 1.0
  assert rewards.exact_match("cats", "cat") == 0.0
  assert rewards.exact_match(None, "cat") == 0.0


def test_sub_em_containment_both_ways():
  assert rewards.sub_em("Paris, France", ["Paris"]) == 1.0
  assert rewards.sub_em("Paris", ["Paris, France"]) == 1.0
  assert rewards.sub_em("Berlin", ["Paris"]) == 0.0


def test_sub_em_uses_only_first_gold():
  assert rewards.exact_match("Lyon", ["Paris", "Lyon"]) == 1.0  # the 2nd gold does match
  assert rewards.sub_em("Lyon", ["Paris", "Lyon"]) == 0.0


def test_sub_em_empty_normalized_prediction_is_zero():
  assert rewards.sub_em("The.", ["the cat"]) == 0.0


def test_f1_hand_computed():
  # "big red dog" vs "red dog": P = 2/3, R = 1, F1 = 2 * (2/3) / (5/3) = 0.8.
  assert rewards.f1("the big red dog", "red dog") == pytest.approx(0.8)
  # {red:2, dog:1} vs {red:1, dog:1, cat:1}: overlap 2, P = R = 2/3.
  assert rewards.f1("red red dog", "red dog cat") == pytest.approx(2 / 3)
  assert rewards.f1("blue cat", "red dog") == 0.0


def test_f1_max_over_truths():
  assert rewards.f1("red dog", ["cat", "a red dog"]) == pytest.approx(1.0)


def test_f1_yes_no_rule():
  # Token overlap would give P = 1/3, R = 1, F1 = 0.5; the HotpotQA rule zeroes it.
  assert rewards.f1("yes it is", "yes") == 0.0
  assert rewards.f1("no", "no answer here") == 0.0
  assert rewards.f1("Yes.", "yes") == 1.0


# --- RULER metrics -----------------------------------------------------------------------


def test_string_match_all_fraction():
  pred = "The keys are ABC-1 and xyz."
  assert rewards.string_match_all(pred, ["abc-1", "XYZ", "qqq"]) == pytest.approx(2 / 3)
  assert rewards.string_match_all(pred, "xyz") == 1.0


def test_string_match_part():
  assert rewards.string_match_part("Answer: Lyon", ["paris", "LYON"]) == 1.0
  assert rewards.string_match_part("Answer: Nice", ["paris", "lyon"]) == 0.0


# --- input validation --------------------------------------------------------------------


@pytest.mark.parametrize("fn", [rewards.exact_match, rewards.sub_em, rewards.f1,
                                rewards.string_match_all, rewards.string_match_part,
                                rewards.memagent_verifier])
def test_empty_truths_raise(fn):
  with pytest.raises(ValueError, match="empty"):
    fn("\\boxed{1}", [])


def test_bare_string_is_one_truth():
  assert rewards.exact_match("cat", "Cat") == 1.0
  assert rewards.memagent_verifier("\\boxed{12}", "12") == 1.0
