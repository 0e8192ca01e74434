"""Repetition-loop detection on token ids and on word units."""

from __future__ import annotations

import pytest

from canaryd.scoring import RepetitionLoop, find_repetition_loop, has_repetition_loop
from canaryd.scoring.text import word_units

DISTINCT = list(range(1000, 1200))  # 200 tokens that never repeat


class TestFindRepetitionLoop:
    def test_single_token_loop(self) -> None:
        """One token repeated to the end of the output is a period-1 loop."""
        assert find_repetition_loop([*DISTINCT[:20], *[5] * 40]) == RepetitionLoop(1, 20, 40)

    def test_trigram_loop_at_the_tail(self) -> None:
        """A 3-token unit repeated 10 times after 60 normal tokens covers 33 %: a loop."""
        loop = find_repetition_loop([*DISTINCT[:60], *[7, 8, 9] * 10])
        assert loop == RepetitionLoop(period=3, start=60, span=30)

    def test_last_copy_cut_short(self) -> None:
        """A loop stopped by max_tokens mid-unit still counts, with fractional repeats."""
        loop = find_repetition_loop([*DISTINCT[:20], *[1, 2, 3, 4, 5] * 6, 1, 2])
        assert loop is not None
        assert (loop.period, loop.span) == (5, 32)
        assert loop.repeats == pytest.approx(6.4)

    def test_sentence_length_unit(self) -> None:
        """A 20-token sentence repeated 4 times is a loop (units up to 32 tokens)."""
        assert find_repetition_loop([*DISTINCT[:30], *DISTINCT[100:120] * 4]) is not None

    def test_text_loop_on_word_units(self) -> None:
        """A sentence the model keeps repeating is a loop over words and punctuation."""
        text = "Here is my answer. " + "I am sorry, I cannot help. " * 8
        assert has_repetition_loop(word_units(text))

    def test_distinct_tokens(self) -> None:
        """An output without repetition has no loop."""
        assert find_repetition_loop(DISTINCT) is None

    def test_empty_output(self) -> None:
        """An empty output has no loop."""
        assert find_repetition_loop([]) is None

    def test_long_number_is_not_a_loop(self) -> None:
        """Nine zero digits (tokenizers split digits) are shorter than the 16-token minimum."""
        assert find_repetition_loop([*DISTINCT[:20], 1, *[0] * 9]) is None

    def test_loop_followed_by_normal_text(self) -> None:
        """A repetition the model leaves again is not a degeneration loop."""
        assert find_repetition_loop([*DISTINCT[:20], *[7, 8] * 10, *DISTINCT[50:80]]) is None

    def test_loop_below_coverage(self) -> None:
        """A 20-token periodic tail on a 220-token output covers 9 %, under 30 %."""
        assert find_repetition_loop([*DISTINCT, *[7, 8] * 10]) is None

    def test_three_copies_are_not_enough(self) -> None:
        """A 10-token unit repeated 3 times is under the 4-repeat minimum."""
        assert find_repetition_loop([*DISTINCT[:10], *DISTINCT[100:110] * 3]) is None

    def test_common_words_repeat(self) -> None:
        """Normal text that reuses 'the' and 'and' many times is not a loop."""
        text = (
            "The cat and the dog and the bird sat on the mat, and the man saw the cat "
            "and the dog and the bird, and the woman saw the man and the cat."
        )
        assert not has_repetition_loop(word_units(text))

    def test_code(self) -> None:
        """Code with similar lines is not a loop."""
        code = (
            "def f(x):\n    a = x + 1\n    b = x + 1\n    c = x + 1\n    d = x + 1\n"
            "    return a + b + c + d\n\nprint(f(1))\nprint(f(2))\nprint(f(3))\n"
        )
        assert not has_repetition_loop(word_units(code))

    def test_numbered_list(self) -> None:
        """A numbered list of similar items is not a loop: the numbers change."""
        items = "\n".join(f"{i}. Add one cup of water and stir." for i in range(1, 12))
        assert not has_repetition_loop(word_units(items))
