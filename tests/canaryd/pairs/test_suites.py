"""Loading, validating and selecting prompt suites (canaryd.pairs.suites)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import pytest
from jsonschema.validators import validator_for

from canaryd.errors import PromptFileError, UnknownCategoryError
from canaryd.pairs.suites import (
    Suite,
    load_default_suites,
    load_suite,
    load_suites,
    sanitise_category,
    select,
    validate_path,
)
from canaryd.paths import prompts_dir
from canaryd.scoring.pair import task_score
from engine.types import Message
from gates.records import Check

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompts"
BROKEN = FIXTURES / "broken"
SHIPPED_CATEGORIES = {
    "multi_turn",
    "translation",
    "summarisation",
    "qa",
    "math",
    "rag",
    "code",
    "structured",
    "extraction",
}


@pytest.fixture(scope="module")
def shipped() -> list[Suite]:
    return load_default_suites()


class TestShippedSuites:
    def test_validate_cleanly(self) -> None:
        """Every shipped suite file validates without a single problem."""
        assert validate_path(prompts_dir()) == []

    def test_size_and_coverage(self, shipped: list[Suite]) -> None:
        """The shipped suites hold at least 150 prompts over every category, 17+ each."""
        prompts = select(shipped, None)
        per_category = {c: len(select(shipped, c)) for c in SHIPPED_CATEGORIES}
        assert len(prompts) >= 150
        assert {p.category for p in prompts} == SHIPPED_CATEGORIES
        assert min(per_category.values()) >= 17, per_category

    def test_one_file_per_category(self, shipped: list[Suite]) -> None:
        """Each shipped file is named after the single category it holds."""
        for suite in shipped:
            assert suite.categories == [suite.name]
            assert all(p.id.startswith(f"{suite.name}-") for p in suite.prompts)

    def test_max_tokens_fit_the_embedded_model(self, shipped: list[Suite]) -> None:
        """Shipped prompts ask for 48 to 128 new tokens, which the 2-core model can afford."""
        assert all(48 <= p.max_tokens <= 128 for p in select(shipped, None))

    def test_numeric_checks_parse(self, shipped: list[Suite]) -> None:
        """Every numeric check's value is a finite float with a non-negative tolerance."""
        checks = [p.check for p in select(shipped, None) if p.check and p.check.kind == "numeric"]
        assert len(checks) >= 17
        for check in checks:
            assert isinstance(check.value, float) and math.isfinite(check.value)
            assert check.tolerance >= 0

    def test_json_schema_checks_are_valid_and_match_references(self, shipped: list[Suite]) -> None:
        """Every json_schema check is a valid schema that its own reference answer satisfies."""
        prompts = [p for p in select(shipped, None) if p.check and p.check.kind == "json_schema"]
        assert len(prompts) >= 17
        for prompt in prompts:
            assert prompt.check is not None and prompt.reference is not None
            validator = validator_for(prompt.check.value)
            validator.check_schema(prompt.check.value)
            assert validator(prompt.check.value).is_valid(json.loads(prompt.reference)), prompt.id

    def test_regex_and_contains_checks_accept_their_references(self, shipped: list[Suite]) -> None:
        """A regex or contains check passes on the prompt's own reference answer."""
        for prompt in select(shipped, None):
            if prompt.check is None or prompt.reference is None:
                continue
            if prompt.check.kind == "regex":
                assert re.search(prompt.check.value, prompt.reference), prompt.id
            elif prompt.check.kind == "contains":
                assert prompt.check.value.lower() in prompt.reference.lower(), prompt.id

    def test_numeric_checks_match_the_last_number_of_references(self, shipped: list[Suite]) -> None:
        """A numeric check's value equals the last number in the reference answer."""
        for prompt in select(shipped, None):
            if prompt.check is None or prompt.check.kind != "numeric" or not prompt.reference:
                continue
            numbers = re.findall(r"-?\d+(?:\.\d+)?", prompt.reference.replace(",", ""))
            assert abs(float(numbers[-1]) - prompt.check.value) <= prompt.check.tolerance

    def test_multi_turn_prompts_carry_prior_turns(self, shipped: list[Suite]) -> None:
        """Multi-turn prompts include at least one earlier assistant answer."""
        for prompt in select(shipped, "multi_turn"):
            assert any(m.role == "assistant" for m in prompt.messages), prompt.id

    def test_rag_prompts_are_long_context(self, shipped: list[Suite]) -> None:
        """Retrieval-augmented prompts hold 300 to 700 words of passages and question."""
        for prompt in select(shipped, "rag"):
            words = len(prompt.messages[-1].content.split())
            assert 300 <= words <= 700, (prompt.id, words)


class TestLoadSuite:
    def test_native_file(self) -> None:
        """A native file loads into prompts with messages, checks, suite name and source."""
        path = FIXTURES / "valid" / "small.jsonl"
        suite = load_suite(path)
        assert suite.name == "small"
        assert [p.id for p in suite.prompts] == ["small-001", "small-002", "small-003"]
        math_prompt = suite.prompts[1]
        assert math_prompt.messages == (
            Message("system", "Answer with a number."),
            Message("user", "What is 6 times 7?"),
        )
        assert math_prompt.check == Check(kind="numeric", value=42.0, tolerance=0.5)
        assert math_prompt.source == f"{path}:3"  # line 2 is blank
        assert suite.prompts[0].check == Check(kind="contains", value="Au")

    def test_sha256_identifies_content(self) -> None:
        """The suite's sha256 is the digest of the file's bytes."""
        path = FIXTURES / "valid" / "small.jsonl"
        assert load_suite(path).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()

    def test_categories_and_by_category(self) -> None:
        """`categories` is sorted and `by_category` keeps file order."""
        suite = load_suite(FIXTURES / "valid" / "small.jsonl")
        assert suite.categories == ["math", "multi_turn", "qa"]
        assert [p.id for p in suite.by_category("qa")] == ["small-001"]
        assert suite.by_category("code") == []

    def test_invalid_file_raises_with_every_problem(self) -> None:
        """An invalid file raises PromptFileError carrying all its problems."""
        path = BROKEN / "keys.jsonl"
        with pytest.raises(PromptFileError) as caught:
            load_suite(path)
        assert caught.value.problems == validate_path(path)
        assert str(caught.value).startswith(f"{path}:1: unknown key 'prompt' (and 4 more")

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing file is a PromptFileError naming the path."""
        with pytest.raises(PromptFileError, match="no such file"):
            load_suite(tmp_path / "absent.jsonl")


class TestMtBenchImport:
    def test_first_turns_become_user_prompts(self) -> None:
        """Each question becomes `mtbench-<id>` with its first turn as the user message."""
        suite = load_suite(FIXTURES / "question.jsonl")
        by_id = {p.id: p for p in suite.prompts}
        writing = by_id["mtbench-81"]
        assert writing.category == "writing"
        assert writing.messages == (Message("user", writing.messages[0].content),)
        assert writing.messages[0].content.startswith("Compose an engaging travel blog post")
        assert writing.reference is None
        assert writing.max_tokens == 128

    def test_second_turn_needs_a_reference(self) -> None:
        """A second turn becomes `-t2` only when a first-turn reference answer exists."""
        suite = load_suite(FIXTURES / "question.jsonl")
        assert [p.id for p in suite.prompts] == [
            "mtbench-81",
            "mtbench-111",
            "mtbench-111-t2",
            "mtbench-125",
            "mtbench-131",
            "mtbench-131-t2",
        ]

    def test_second_turn_conditions_on_the_reference(self) -> None:
        """The `-t2` prompt is turn 1, the reference as the assistant, then turn 2."""
        by_id = {p.id: p for p in load_suite(FIXTURES / "question.jsonl").prompts}
        first, second = by_id["mtbench-111"], by_id["mtbench-111-t2"]
        assert first.reference == "Area is 3"
        assert [m.role for m in second.messages] == ["user", "assistant", "user"]
        assert second.messages[1] == Message("assistant", "Area is 3")
        assert (
            second.messages[2].content == "What's area of the circle circumscribing the triangle?"
        )
        assert second.reference == "5pi"
        assert by_id["mtbench-131-t2"].reference is None

    def test_categories_are_sanitised_and_max_tokens_set(self) -> None:
        """Free-form categories become label-safe ids; max_tokens comes from the caller."""
        suite = load_suite(FIXTURES / "question.jsonl", mtbench_max_tokens=64)
        assert suite.categories == ["coding", "extraction_rewriting", "math", "writing"]
        assert {p.max_tokens for p in suite.prompts} == {64}

    @pytest.mark.parametrize(
        ("raw", "label"),
        [
            ("Writing", "writing"),
            ("Math Reasoning", "math_reasoning"),
            ("3-D art", "d_art"),
            ("!!!", "uncategorised"),
            ("x" * 40, "x" * 32),
        ],
    )
    def test_sanitise_category(self, raw: str, label: str) -> None:
        """A sanitised category always matches the metric label pattern."""
        assert sanitise_category(raw) == label


class TestPublicQuestionFiles:
    """FastChat-format files as published (MT-Bench, Spec-Bench): "" for a turn without a
    reference, a list of acceptable answers, and categories beyond MT-Bench's eight."""

    PATH = FIXTURES / "question_public.jsonl"

    def test_loads_as_it_is(self) -> None:
        """The file has no problems, and all thirteen categories survive as labels."""
        assert validate_path(self.PATH) == []
        suite = load_suite(self.PATH)
        assert suite.categories == [
            "coding",
            "extraction",
            "humanities",
            "math",
            "math_reasoning",
            "qa",
            "rag",
            "reasoning",
            "roleplay",
            "stem",
            "summarization",
            "translation",
            "writing",
        ]

    def test_empty_string_means_no_reference(self) -> None:
        """An empty reference is none for that turn: no reference, no check, and a first
        turn without one gives no second-turn prompt."""
        by_id = {p.id: p for p in load_suite(self.PATH).prompts}
        coding = by_id["mtbench-121"]
        assert (coding.reference, coding.check) == (None, None)
        assert "mtbench-121-t2" not in by_id
        assert (by_id["mtbench-131"].reference, by_id["mtbench-131"].check) == (None, None)
        reasoning, second = by_id["mtbench-101"], by_id["mtbench-101-t2"]
        assert reasoning.reference == "You are in second place."
        assert second.messages[1] == Message("assistant", "You are in second place.")
        assert (second.reference, second.check) == (None, None)

    def test_list_means_any_answer_passes(self) -> None:
        """A list of acceptable answers: the first is the reference text, and the task
        check passes on any of them, case-insensitively, and on nothing else."""
        by_id = {p.id: p for p in load_suite(self.PATH).prompts}
        orwell = by_id["mtbench-321"]
        assert orwell.reference == "George Orwell"
        assert orwell.check is not None and orwell.check.kind == "regex"
        for answer in ("It was George Orwell.", "eric arthur  blair", "ORWELL, of course"):
            assert task_score(orwell, answer) == 1.0, answer
        assert task_score(orwell, "Aldous Huxley") == 0.0
        canberra = by_id["mtbench-322"]
        assert canberra.reference == "Canberra" and canberra.check is not None
        assert task_score(canberra, "The capital is Canberra.") == 1.0
        assert task_score(canberra, "Sydney") == 0.0

    def test_list_answers_are_matched_literally(self) -> None:
        """Answers are text, not patterns: punctuation in them matches only itself, and
        blank alternatives inside a list are dropped (they would match anything)."""
        nile = {p.id: p for p in load_suite(self.PATH).prompts}["mtbench-481"]
        assert nile.reference == "6650 km"
        assert task_score(nile, "It is 6,650 kilometres long.") == 1.0
        assert task_score(nile, "It is 6x650 kilometres long.") == 0.0
        assert task_score(nile, "It is very long.") == 0.0

    def test_single_string_reference_is_scored_by_similarity(self) -> None:
        """A plain string reference keeps its similarity score: no check is attached."""
        area = {p.id: p for p in load_suite(self.PATH).prompts}["mtbench-111"]
        assert (area.reference, area.check) == ("Area is 3", None)


BROKEN_EXPECTATIONS: dict[str, list[str]] = {
    "syntax.jsonl": [
        "2: invalid JSON: Expecting ',' delimiter (column 34)",
        "3: not a JSON object but an array",
        "4: not a JSON object but a string",
    ],
    "empty.jsonl": ["1: empty file: no prompts"],
    "keys.jsonl": [
        "1: unknown key 'prompt'",
        "2: missing key 'id'",
        "3: missing key 'max_tokens'",
        "4: duplicate id 'k-001' (first defined at line 1)",
        "5: id must be a non-empty string",
    ],
    "fields.jsonl": [
        "1: category 'Question-Answering' must match ^[a-z][a-z0-9_]{0,31}$ "
        "(it becomes a metric label)",
        "2: messages is empty: a prompt needs at least one user message",
        "3: messages[0].role 'bot' is not one of system, user, assistant",
        "4: messages[0].content is empty",
        "5: last message is from 'assistant': it must be from the user",
        "6: max_tokens must be an integer in 1..8192, not 0",
        "7: max_tokens must be an integer in 1..8192, not '64'",
        "8: max_tokens must be an integer in 1..8192, not 9000",
        "9: unknown key 'messages[0].text'",
        "9: missing key 'messages[0].content'",
    ],
    "checks.jsonl": [
        "1: check.kind 'fuzzy' is not one of exact, contains, regex, json_schema, numeric",
        "2: check.value: regex does not compile: missing ), unterminated subpattern at position 4",
        "3: check.value is not a valid JSON schema: at $.type: 'dictionary' is not valid "
        "under any of the given schemas",
        "4: check.value of a 'numeric' check must be a number, not 'forty-two'",
        "5: check.tolerance must be a number >= 0, not -1",
        "6: check.tolerance applies to numeric checks only, not 'contains'",
        "7: missing key 'check.kind'",
        "8: reference must be a non-empty string",
    ],
    "mtbench.jsonl": [
        "1: turns must be a non-empty list of non-empty strings",
        "2: reference must be a list (one entry per turn), not a string",
        "3: duplicate id 'mtbench-81' (first defined at line 1)",
        "4: unknown key 'model'",
        "4: missing key 'question_id'",
        "5: reference[0] must be a string or a list of strings, not a number",
        "6: reference[1] must be a string or a list of strings, not an array",
        "7: reference[0] must be a string or a list of strings, not null",
        "8: category must be a string",
    ],
}


class TestValidatePath:
    @pytest.mark.parametrize("name", sorted(BROKEN_EXPECTATIONS))
    def test_broken_fixture_reports_exact_problems(self, name: str) -> None:
        """Each broken fixture yields exactly the expected `file:line: reason` messages."""
        path = BROKEN / name
        assert validate_path(path) == [f"{path}:{tail}" for tail in BROKEN_EXPECTATIONS[name]]

    def test_valid_files_have_no_problems(self) -> None:
        """Valid native and MT-Bench files report nothing."""
        assert validate_path(FIXTURES / "valid") == []
        assert validate_path(FIXTURES / "question.jsonl") == []

    def test_directory_reports_problems_of_every_file(self) -> None:
        """A directory is validated file by file, in name order, never stopping early."""
        problems = validate_path(BROKEN)
        files = [p.split(":", 1)[0] for p in problems]
        assert files == sorted(files)
        assert len(problems) == sum(len(v) for v in BROKEN_EXPECTATIONS.values())

    def test_missing_path(self, tmp_path: Path) -> None:
        """A path that does not exist is one problem naming it."""
        missing = tmp_path / "nope.jsonl"
        assert validate_path(missing) == [f"{missing}: no such file or directory"]

    def test_directory_without_suites(self, tmp_path: Path) -> None:
        """A directory with no .jsonl files is a problem, not a silent empty suite."""
        assert validate_path(tmp_path) == [f"{tmp_path}: no *.jsonl suite files in this directory"]

    def test_not_utf8(self, tmp_path: Path) -> None:
        """A file that is not UTF-8 is reported instead of raising."""
        path = tmp_path / "latin1.jsonl"
        path.write_bytes('{"id": "caf\xe9"}\n'.encode("latin-1"))
        assert validate_path(path) == [
            f"{path}:1: not UTF-8 text: invalid continuation byte at byte 11"
        ]

    def test_non_finite_numeric_value(self, tmp_path: Path) -> None:
        """NaN, which Python's json accepts, is not a usable numeric check value."""
        path = tmp_path / "nan.jsonl"
        record = (
            '{"id": "n-1", "category": "math", "max_tokens": 8, '
            '"messages": [{"role": "user", "content": "1/0?"}], '
            '"check": {"kind": "numeric", "value": NaN}}'
        )
        path.write_text(record + "\n", encoding="utf-8")
        assert validate_path(path) == [
            f"{path}:1: check.value of a 'numeric' check must be a number, not nan"
        ]


class TestLoadSuites:
    def test_directory_means_its_jsonl_files_sorted(self) -> None:
        """A directory loads every *.jsonl inside it in name order."""
        suites = load_suites([FIXTURES / "valid"])
        assert [s.name for s in suites] == ["other", "small"]

    def test_files_and_directories_mix(self) -> None:
        """Paths may mix files and directories."""
        suites = load_suites([FIXTURES / "question.jsonl", FIXTURES / "valid"])
        assert [s.name for s in suites] == ["question", "other", "small"]

    def test_all_problems_of_all_files(self, tmp_path: Path) -> None:
        """Loading several paths reports the problems of every one before raising."""
        with pytest.raises(PromptFileError) as caught:
            load_suites([BROKEN / "empty.jsonl", tmp_path / "gone", BROKEN / "keys.jsonl"])
        problems = caught.value.problems
        assert problems[0] == f"{BROKEN / 'empty.jsonl'}:1: empty file: no prompts"
        assert problems[1] == f"{tmp_path / 'gone'}: no such file or directory"
        assert len(problems) == 7

    def test_id_shared_by_two_suites(self) -> None:
        """A prompt id defined by two suites is an error naming both places."""
        small, clash = FIXTURES / "valid" / "small.jsonl", BROKEN / "clash.jsonl"
        with pytest.raises(PromptFileError) as caught:
            load_suites([small, clash])
        assert caught.value.problems == [
            f"{clash}:1: duplicate id 'small-001' (first defined at {small}:1)"
        ]


class TestSelect:
    def test_none_selects_everything(self) -> None:
        """No category selects every prompt of every suite, in order."""
        suites = load_suites([FIXTURES / "valid"])
        assert [p.id for p in select(suites, None)] == [
            "other-001",
            "small-001",
            "small-002",
            "small-003",
        ]

    def test_one_category(self) -> None:
        """A category selects only its prompts, across suites."""
        suites = load_suites([FIXTURES / "valid"])
        assert [p.id for p in select(suites, "structured")] == ["other-001"]

    def test_unknown_category_lists_known_ones(self) -> None:
        """An unknown category raises UnknownCategoryError listing the known categories."""
        suites = load_suites([FIXTURES / "valid"])
        with pytest.raises(UnknownCategoryError) as caught:
            select(suites, "poetry")
        assert caught.value.known == ["math", "multi_turn", "qa", "structured"]
        assert str(caught.value) == (
            "unknown category 'poetry'; known categories: math, multi_turn, qa, structured"
        )
