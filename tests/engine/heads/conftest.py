"""Tiny models for the draft-head tests, built in code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.testing import chaotic_llama


@pytest.fixture(scope="session")
def chaotic() -> tuple[Any, Any]:
    return chaotic_llama()


@pytest.fixture(scope="module", autouse=True)
def _one_thread_for_tiny_models() -> Iterator[None]:
    """Tiny models run fastest on one thread; on a shared machine, torch's thread pool
    spinning against other processes makes their millisecond ops take tens of ms."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
