"""The live sampler: per-minute bounds held exactly, overall and per category, fair
across categories, dedup within a window, long prompts and extra categories counted."""

from __future__ import annotations

from canaryd.traffic.requests import LiveRequest, prompt_hash
from canaryd.traffic.reservoir import OUTCOMES, LiveSampler, SamplingBounds
from engine.types import Message

KEY = b"k" * 32


def request(text: str, category: str = "live") -> LiveRequest:
    messages = (Message(role="user", content=text),)
    return LiveRequest(
        category=category,
        messages=messages,
        temperature=0.7,
        top_p=1.0,
        max_tokens=64,
        stop=(),
        prompt_hash=prompt_hash(KEY, messages),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def bounds(**changes: float) -> SamplingBounds:
    values: dict[str, float] = {
        "per_minute": 6,
        "per_category": 2,
        "queue_size": 1000,
        "dedup_window_s": 3600.0,
        "max_prompt_chars": 1000,
        "max_categories": 32,
    }
    values.update(changes)
    return SamplingBounds(**values)  # type: ignore[arg-type]


def drain(sampler: LiveSampler) -> list[LiveRequest]:
    taken = []
    while (item := sampler.take()) is not None:
        taken.append(item)
    return taken


def accounted(sampler: LiveSampler) -> int:
    return sum(sampler.counts[outcome] for outcome in OUTCOMES)


class TestBounds:
    def test_per_minute_and_per_category_bounds_hold_exactly(self) -> None:
        """A burst of 10 categories x 50 requests in one minute yields exactly 6 sampled,
        none of a category more than 2, and every other request counted rate_limited."""
        clock = Clock()
        sampler = LiveSampler(bounds(), seed=1, clock=clock)
        for i in range(500):
            clock.now = i * 0.1
            sampler.offer(request(f"q{i}", category=f"c{i % 10}"))
        clock.now = 60.0
        taken = drain(sampler)
        assert len(taken) == 6
        per_category: dict[str, int] = {}
        for item in taken:
            per_category[item.category] = per_category.get(item.category, 0) + 1
        assert max(per_category.values()) <= 2
        assert sampler.counts["sampled"] == 6
        assert sampler.counts["rate_limited"] == 494
        assert accounted(sampler) == sampler.counts["received"] == 500

    def test_one_category_is_capped_and_others_still_sampled(self) -> None:
        """A burst of 1000 in one category cannot crowd out a quiet one: the quiet
        category's single request is sampled."""
        clock = Clock()
        sampler = LiveSampler(bounds(per_minute=3, per_category=2), seed=2, clock=clock)
        for i in range(1000):
            sampler.offer(request(f"busy{i}", category="busy"))
        sampler.offer(request("quiet", category="quiet"))
        clock.now = 61.0
        taken = drain(sampler)
        assert sorted(item.category for item in taken) == ["busy", "busy", "quiet"]

    def test_reservoir_keeps_late_requests_as_likely_as_early_ones(self) -> None:
        """Over many windows, the second half of a minute's burst is sampled about as
        often as the first half (Algorithm R, not first come first served)."""
        clock = Clock()
        sampler = LiveSampler(bounds(per_minute=1, per_category=1), seed=3, clock=clock)
        late = 0
        for window in range(400):
            for i in range(10):
                sampler.offer(request(f"{window}-{i}"))
            clock.now = (window + 1) * 60.0
            (taken,) = drain(sampler)
            late += int(taken.messages[0].content.split("-")[1]) >= 5
        assert 140 <= late <= 260

    def test_full_queue_counts_what_it_cannot_hold(self) -> None:
        """With a queue of 4 and nobody taking, the fifth and later chosen requests are
        counted queue_full, never queued."""
        clock = Clock()
        sampler = LiveSampler(bounds(queue_size=4), seed=4, clock=clock)
        for window in range(2):
            for i in range(6):
                sampler.offer(request(f"{window}-{i}", category=f"c{i}"))
            clock.now = (window + 1) * 60.0
            sampler.flush()
        assert len(sampler) == 4
        assert sampler.counts["sampled"] == 4
        assert sampler.counts["queue_full"] == 8
        assert list(sampler.sampled_by_window) == [6, 6]


class TestFilters:
    def test_duplicates_within_the_window_are_counted_once_seen(self) -> None:
        """The same prompt again within dedup_window_s is a duplicate; after it, new."""
        clock = Clock()
        sampler = LiveSampler(bounds(dedup_window_s=100.0), seed=5, clock=clock)
        assert sampler.offer(request("same")) == "candidate"
        assert sampler.offer(request("same")) == "duplicate"
        clock.now = 101.0
        assert sampler.offer(request("same")) == "candidate"
        assert sampler.counts["duplicate"] == 1

    def test_long_prompts_and_extra_categories_are_counted_not_sampled(self) -> None:
        """A prompt over max_prompt_chars is too_long; a third category in a window of
        max_categories 2 is counted under categories."""
        clock = Clock()
        sampler = LiveSampler(bounds(max_prompt_chars=10, max_categories=2), clock=clock)
        assert sampler.offer(request("x" * 11)) == "too_long"
        assert sampler.offer(request("a", category="a")) == "candidate"
        assert sampler.offer(request("b", category="b")) == "candidate"
        assert sampler.offer(request("c", category="c")) == "categories"
        sampler.flush()
        assert sorted(item.category for item in drain(sampler)) == ["a", "b"]
        assert accounted(sampler) == sampler.counts["received"] == 4
