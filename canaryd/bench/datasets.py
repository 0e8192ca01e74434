"""Prompts from a benchmark's question file: FastChat's MT-Bench `question.jsonl` and
Spec-Bench's (the same format, `vllm bench serve --dataset-name spec_bench` reads it).

Each line is a JSON object with `question_id`, `category` and `turns` (a list of user
messages); the first turn becomes a one-message prompt of that category (lower-cased,
other characters than letters, digits and `_` made `_`), identified by the question id.
`dataset_path` resolves the name `spec_bench` to Spec-Bench's 480 questions, bundled
gzip-compressed (canaryd/bench/data, Apache-2.0), as `vllm bench serve --dataset-name
spec_bench` names them; any other value is a file (`.gz` read compressed).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from engine.types import Message
from gates.records import Prompt

__all__ = ["SPEC_BENCH", "dataset_path", "question_prompts"]

SPEC_BENCH = "spec_bench"
_BUNDLED = Path(__file__).parent / "data" / "spec_bench_question.jsonl.gz"

_NOT_LABEL = re.compile(r"[^a-z0-9_]")


def _category(raw: object) -> str:
    text = _NOT_LABEL.sub("_", str(raw or "question").lower()).strip("_") or "question"
    return (text if text[0].isalpha() else f"q_{text}")[:32]


def dataset_path(value: str | Path) -> Path:
    """The question file `--dataset` names: the bundled Spec-Bench questions for
    `spec_bench` (unless a file of that name exists here), else the file itself."""
    path = Path(value)
    if str(value) == SPEC_BENCH and not path.exists():
        return _BUNDLED
    return path


def _text(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as opened:
            return opened.read()
    return path.read_text(encoding="utf-8")


def question_prompts(path: Path, max_tokens: int) -> list[Prompt]:
    """The first turn of every question in `path`; ValueError naming the line of a bad
    one (not JSON, no turns)."""
    prompts = []
    for number, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            question = json.loads(line)
            turns = question["turns"]
            first = turns[0] if isinstance(turns, list) else None
            if not isinstance(first, str) or not first.strip():
                raise ValueError("no first turn")
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{path}:{number}: not a question ({exc})") from None
        prompts.append(
            Prompt(
                id=str(question.get("question_id", number)),
                category=_category(question.get("category")),
                messages=(Message("user", first),),
                max_tokens=max_tokens,
                suite=path.name.split(".")[0],
                source=f"{path}:{number}",
            )
        )
    if not prompts:
        raise ValueError(f"{path}: no questions")
    return prompts
