"""Which prompt comes next: stratified by category, weighted, seeded, reproducible.

Categories are chosen by smooth weighted round-robin (the nginx upstream algorithm):
every category with a positive weight gets its share in every window of
`sum(weights)` draws, so no category starves however unlucky a random draw would be.
Within a category, prompts are drawn in a seeded shuffled order without replacement,
reshuffled after each full pass.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from canaryd.errors import UnknownCategoryError
from gates.records import Prompt


class StratifiedSampler:
    def __init__(
        self,
        prompts: Sequence[Prompt],
        *,
        weights: Mapping[str, float] | None = None,
        seed: int = 0,
    ) -> None:
        self._rng = random.Random(seed)  # noqa: S311  (sampling, not security)
        self._by_category: dict[str, list[Prompt]] = {}
        for prompt in prompts:
            self._by_category.setdefault(prompt.category, []).append(prompt)
        weights = dict(weights or {})
        for category in weights:
            if category not in self._by_category:
                raise UnknownCategoryError(category, sorted(self._by_category))
        self._weights = {c: float(weights.get(c, 1.0)) for c in sorted(self._by_category)}
        self._weights = {c: w for c, w in self._weights.items() if w > 0}
        if not self._weights:
            raise ValueError("no prompts to sample (every category has weight 0 or no prompts)")
        self._current = dict.fromkeys(self._weights, 0.0)
        self._queues: dict[str, list[Prompt]] = {c: [] for c in self._weights}

    @property
    def categories(self) -> list[str]:
        return list(self._weights)

    def _next_category(self) -> str:
        total = sum(self._weights.values())
        for category, weight in self._weights.items():
            self._current[category] += weight
        chosen = max(self._current, key=lambda c: self._current[c])
        self._current[chosen] -= total
        return chosen

    def next(self) -> Prompt:
        category = self._next_category()
        queue = self._queues[category]
        if not queue:
            queue.extend(self._by_category[category])
            self._rng.shuffle(queue)
        return queue.pop()

    def take(self, n: int) -> list[Prompt]:
        return [self.next() for _ in range(n)]
