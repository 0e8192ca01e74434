"""Tiny models for the draft-head tests, built in code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.testing import tiny_llama


def chaotic_llama(seed: int = 0) -> tuple[Any, Any]:
    """The tiny Llama with large random weights: unlike the default initialisation
    (whose greedy output repeats one token forever) its next token depends on the
    whole context, so a KV cache holding the wrong entries changes the output."""
    import torch

    model, tokenizer = tiny_llama(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model, tokenizer


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
