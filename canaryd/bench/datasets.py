"""Prompts from a benchmark's question file: FastChat's MT-Bench `question.jsonl` and
Spec-Bench's (the same format, `vllm bench serve --dataset-name spec_bench` reads it).

Each line is a JSON object with `question_id`, `category` and `turns` (a list of user
messages); the first turn becomes a one-message prompt of that category (lower-cased,
other characters than letters, digits and `_` made `_`), identified by the question id.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from engine.types import Message
from gates.records import Prompt

__all__ = ["question_prompts"]

_NOT_LABEL = re.compile(r"[^a-z0-9_]")


def _category(raw: object) -> str:
    text = _NOT_LABEL.sub("_", str(raw or "question").lower()).strip("_") or "question"
    return (text if text[0].isalpha() else f"q_{text}")[:32]


def question_prompts(path: Path, max_tokens: int) -> list[Prompt]:
    """The first turn of every question in `path`; ValueError naming the line of a bad
    one (not JSON, no turns)."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
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
                suite=path.stem,
                source=f"{path}:{number}",
            )
        )
    if not prompts:
        raise ValueError(f"{path}: no questions")
    return prompts
