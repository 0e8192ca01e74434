"""The text metrics (ROUGE-L, chrF, token edit similarity): values, agreement with
rouge-score, loading without network, missing packages."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from rouge_score import rouge_scorer

from canaryd.scoring import CHRF, ROUGE_L, TOKEN_EDIT_SIMILARITY, ScoringMetrics, load_metrics
from canaryd.scoring.text_metrics import TOKENIZER

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def metrics() -> ScoringMetrics:
    return load_metrics()


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter at the repository root (imports start from nothing)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class TestRougeL:
    def test_hand_computed_lcs(self, metrics: ScoringMetrics) -> None:
        """'the cat sat' vs reference 'the cat sat down': LCS 3, P 1, R 3/4, F 6/7."""
        assert metrics.rouge_l("the cat sat", "the cat sat down") == pytest.approx(6 / 7)

    def test_substitution_in_the_middle(self, metrics: ScoringMetrics) -> None:
        """One word of six replaced: LCS 5 of 6 on both sides, F 5/6."""
        score = metrics.rouge_l("the cat sat on the mat", "The cat lay on the mat.")
        assert score == pytest.approx(5 / 6)

    def test_identical_chinese_scores_one(self, metrics: ScoringMetrics) -> None:
        """Identical Chinese text scores 1.0 (rouge-score's own tokenizer would give 0)."""
        assert metrics.rouge_l("我喜欢猫和狗", "我喜欢猫和狗") == 1.0

    def test_different_chinese_scores_below_one(self, metrics: ScoringMetrics) -> None:
        """Chinese characters are single tokens: 我喜欢猫 vs 我喜欢狗 shares 3 of 4, F 0.75."""
        assert metrics.rouge_l("我喜欢猫", "我喜欢狗") == pytest.approx(0.75)

    def test_japanese_mixed_with_latin(self, metrics: ScoringMetrics) -> None:
        """Kana and kanji are one token each and Latin words stay whole words."""
        tokenizer = TOKENIZER
        assert tokenizer.tokenize("東京はTokyo 2024です") == [
            "東",
            "京",
            "は",
            "tokyo",
            "2024",
            "で",
            "す",
        ]

    def test_empty_side_scores_zero(self, metrics: ScoringMetrics) -> None:
        """A text without tokens scores 0 against anything, as in rouge-score."""
        assert metrics.rouge_l("", "the cat") == 0.0
        assert metrics.rouge_l("...", "the cat") == 0.0

    def test_agrees_with_rouge_score(self, metrics: ScoringMetrics) -> None:
        """The rapidfuzz LCS gives rouge-score's RougeScorer values on random texts."""
        tokenizer = TOKENIZER
        scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=tokenizer)
        rng = random.Random(7)
        words = ["a", "b", "c", "d", "e", "f", "g", "h", "the", "cat", "dog", "sat", "猫", "狗"]
        for _ in range(200):
            prediction = " ".join(rng.choices(words, k=rng.randint(0, 30)))
            reference = " ".join(rng.choices(words, k=rng.randint(0, 30)))
            expected = scorer.score(reference, prediction)["rougeL"].fmeasure
            assert metrics.rouge_l(prediction, reference) == pytest.approx(expected)


class TestChrf:
    def test_identical_scores_hundred(self, metrics: ScoringMetrics) -> None:
        """A text scores 100 against itself."""
        assert metrics.chrf("the cat sat", "the cat sat") == pytest.approx(100.0)

    def test_hand_computed_equal_lengths(self, metrics: ScoringMetrics) -> None:
        """'abcdefg' vs 'abcdefh': per order n, P = R = (7-n)/(8-n); chrF2 is their mean."""
        mean = sum(Fraction(7 - n, 8 - n) for n in range(1, 7)) / 6
        assert metrics.chrf("abcdefg", "abcdefh") == pytest.approx(100 * float(mean))

    def test_hand_computed_prefix(self, metrics: ScoringMetrics) -> None:
        """'abcdef' vs 'abcdefgh': P = 1, R = mean((7-n)/(9-n)), F2 = 5PR / (4P + R)."""
        recall = sum(Fraction(7 - n, 9 - n) for n in range(1, 7)) / 6
        f2 = 5 * recall / (4 + recall)
        assert metrics.chrf("abcdef", "abcdefgh") == pytest.approx(100 * float(f2))

    def test_chinese(self, metrics: ScoringMetrics) -> None:
        """chrF works on characters, so different Chinese strings score strictly between."""
        assert 0.0 < metrics.chrf("我喜欢猫", "我喜欢狗") < 100.0


class TestTokenEditSimilarity:
    def test_one_deletion_in_four(self, metrics: ScoringMetrics) -> None:
        """[1,2,3,4] vs [1,2,4]: distance 1 over length 4, similarity 0.75."""
        assert metrics.token_edit_similarity([1, 2, 3, 4], [1, 2, 4]) == pytest.approx(0.75)

    def test_both_empty_is_one(self, metrics: ScoringMetrics) -> None:
        """Two empty outputs are identical."""
        assert metrics.token_edit_similarity([], []) == 1.0

    def test_one_empty_is_zero(self, metrics: ScoringMetrics) -> None:
        """Against an empty output every token must be inserted."""
        assert metrics.token_edit_similarity([], [1, 2, 3]) == 0.0


class TestLoadMetrics:
    def test_loaded_once(self) -> None:
        """Repeated calls return the same loaded modules, not fresh loads."""
        assert load_metrics() is load_metrics()

    def test_loads_offline_without_network(self) -> None:
        """With every socket connect failing, all metrics load and score."""
        code = (
            "import socket\n"
            "def refuse(*args, **kwargs):\n"
            "    raise OSError('network disabled by the test')\n"
            "socket.socket.connect = refuse\n"
            "socket.create_connection = refuse\n"
            "from canaryd.scoring import load_metrics\n"
            "m = load_metrics()\n"
            "print(m.rouge_l('a b', 'a b c'), m.chrf('abc', 'abc'), "
            "m.token_edit_similarity([1], [1]))\n"
        )
        done = _python(code, HF_HUB_OFFLINE="1")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["0.8", "100.0", "1.0"]

    @pytest.mark.parametrize(
        ("package", "metric"),
        [
            ("sacrebleu", CHRF),
            ("rapidfuzz", ROUGE_L),
        ],
    )
    def test_missing_package_raises(self, package: str, metric: str) -> None:
        """A package that cannot be imported raises MetricUnavailableError naming it."""
        code = (
            "import sys\n"
            f"sys.modules[{package!r}] = None\n"
            "from canaryd.errors import MetricUnavailableError\n"
            "from canaryd.scoring import load_metrics\n"
            "try:\n"
            "    load_metrics()\n"
            "except MetricUnavailableError as exc:\n"
            "    print(exc)\n"
            "    sys.exit(3)\n"
        )
        done = _python(code)
        assert done.returncode == 3, done.stderr
        assert f"scoring metric {metric!r} needs {package!r}" in done.stdout

    def test_score_pair_raises_when_package_missing(self) -> None:
        """score_pair fails loudly instead of scoring 0 when a metric package is missing."""
        code = (
            "import sys\n"
            "sys.modules['sacrebleu'] = None\n"
            "from canaryd.errors import MetricUnavailableError\n"
            "from gates.records import Prompt\n"
            "from canaryd.scoring import score_pair\n"
            "from engine.types import GenerationResult\n"
            "r = GenerationResult(text='a', token_ids=(1,), finish_reason='stop', "
            "prompt_tokens=1, output_tokens=1, ttft_s=None, tpot_s=None, e2e_s=1.0)\n"
            "try:\n"
            "    score_pair(Prompt(id='p', category='qa', messages=(), max_tokens=8), r, r)\n"
            "except MetricUnavailableError as exc:\n"
            "    print(exc)\n"
            "    sys.exit(3)\n"
        )
        done = _python(code)
        assert done.returncode == 3, done.stderr
        assert "needs 'sacrebleu'" in done.stdout
        assert CHRF in done.stdout
        assert TOKEN_EDIT_SIMILARITY not in done.stdout
