"""`canaryd bench`: warm up, climb the concurrency ladder, store the run, write results.json."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    Progress,
    TaskID,
)

from canaryd.bench.resources import ResourceMonitor
from canaryd.bench.run import (
    DEFAULT_CONCURRENCY,
    Bench,
    BenchParams,
    BenchPlan,
    BenchProgress,
    bench_results,
    default_requests,
    store_bench,
)
from canaryd.cli.common import fail, handle_errors, load_arms, progress_bar
from canaryd.cli.options import ConfigOption
from canaryd.config import load_settings
from canaryd.logs import configure_logging
from canaryd.pairs.plan import (
    configured_suites,
    new_run,
    prompt_sampler,
    resolve_prompts,
    speculative_engines,
)
from canaryd.report import bench_markdown
from canaryd.store import SqlStore
from engine.base import Engine


def parse_rates(text: str) -> tuple[float, ...]:
    """`0.5,2` → (0.5, 2.0); every rate a positive number of requests per second."""
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a comma-separated list of numbers", param_hint="--rate"
        ) from None
    if not rates or any(rate <= 0 for rate in rates) or len(set(rates)) != len(rates):
        raise typer.BadParameter(
            f"{text!r}: rates must be distinct numbers > 0", param_hint="--rate"
        )
    return rates


def parse_concurrency(text: str) -> tuple[int, ...]:
    """`1,4,16` → (1, 4, 16); every level a positive integer, listed once."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a comma-separated list of integers", param_hint="--concurrency"
        ) from None
    if not levels or any(level < 1 for level in levels) or len(set(levels)) != len(levels):
        raise typer.BadParameter(
            f"{text!r}: levels must be distinct integers ≥ 1", param_hint="--concurrency"
        )
    return levels


class _RichProgress(BenchProgress):
    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: TaskID | None = None

    def phase(self, description: str, total: int | None) -> None:
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(description, total=total)

    def advance(self) -> None:
        if self._task is not None:
            self._progress.advance(self._task)


@handle_errors
def bench(
    config: ConfigOption = None,
    concurrency: Annotated[
        str | None,
        typer.Option(
            help="comma-separated concurrency ladder (default "
            + ",".join(map(str, DEFAULT_CONCURRENCY))
            + " unless --rate is given)"
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="comma-separated open-loop request rates per second (Poisson)"),
    ] = None,
    burstiness: Annotated[
        float,
        typer.Option(min=0.001, help="gamma shape of the open-loop gaps (1: Poisson)"),
    ] = 1.0,
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo", help="goodput limits per request, e.g. ttft=0.5,itl=0.1,e2e=10 (seconds)"
        ),
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            "--dataset",
            help="a FastChat/Spec-Bench question.jsonl to send instead of the suites, or "
            "spec_bench: Spec-Bench's 480 questions (bundled)",
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            min=0.001,
            help="seconds per level for the first arm; the other arm then sends the same requests",
        ),
    ] = None,
    requests: Annotated[
        int | None,
        typer.Option(
            "--requests", "-n", min=1, help="requests per level and arm (default 2×top level)"
        ),
    ] = None,
    warmup: Annotated[
        int, typer.Option(min=0, help="warm-up requests per arm, excluded from figures")
    ] = 2,
    out: Annotated[
        Path,
        typer.Option("--out", help="results file (*.json), or a directory for results.json"),
    ] = Path("bench-results"),
    as_json: Annotated[bool, typer.Option("--json", help="print results.json on stdout")] = False,
) -> None:
    """Run the one-shot evaluation: warm-up, concurrency ladder, acceptance, consistency."""
    from canaryd.bench.datasets import dataset_path, question_prompts
    from canaryd.bench.serving import Slo, parse_slo

    configure_logging(level="WARNING")
    rates = parse_rates(rate) if rate is not None else ()
    if concurrency is None:
        levels = () if rates else DEFAULT_CONCURRENCY
    else:
        levels = parse_concurrency(concurrency)
    if duration is not None and requests is not None:
        raise fail("give --duration or --requests, not both")
    if rates and duration is not None:
        raise fail("--rate sends a number of requests (--requests), not a --duration")
    try:
        limits = parse_slo(slo) if slo else Slo()
    except ValueError as exc:
        raise fail(f"--slo {exc}") from None
    plan = BenchPlan(
        concurrency=levels,
        requests=None if duration is not None else (requests or default_requests(levels or (16,))),
        duration_s=duration,
        warmup=warmup,
        rates=rates,
        burstiness=burstiness,
        slo=limits,
    )
    settings = load_settings(config)
    suites = configured_suites(settings)
    if dataset is not None:
        try:
            prompts = question_prompts(dataset_path(dataset), settings.prompts.max_tokens or 128)
        except (OSError, ValueError) as exc:
            raise fail(f"--dataset {dataset}: {exc}") from None
        suites = []
    else:
        prompts = resolve_prompts(settings, None, suites)
    sampler = prompt_sampler(settings, prompts)
    # The same prompts, in the same order, at every level and on both arms.
    sequence = sampler.take(plan.requests or len(prompts))
    store = SqlStore.open(settings.storage.resolved_url(), create=True)
    err = Console(stderr=True)
    engines: dict[str, Engine] = {}
    try:
        for suite in suites:
            store.record_suite(suite.name, suite.sha256, str(suite.path))
        engines = load_arms(settings, err)
        started_at = datetime.now(UTC)
        with progress_bar(err, 22) as progress:
            runner = Bench(
                engines["baseline"],
                speculative_engines(engines),
                prompts=sequence,
                plan=plan,
                params=BenchParams(
                    temperature=settings.prompts.temperature,
                    top_p=settings.prompts.top_p,
                    max_tokens=settings.prompts.max_tokens,
                    timeout_s=settings.prompts.timeout_s,
                    seed=settings.prompts.seed,
                ),
                progress=_RichProgress(progress),
            )
            runner.run_warmup()
            records, level_records = [], []
            with ResourceMonitor() as monitor:
                for level in plan.concurrency:
                    level_record, level_pairs = runner.run_level(level)
                    level_records.append(level_record)
                    records.extend(level_pairs)
                for level_rate in plan.rates:
                    level_record, level_pairs = runner.run_level(rate=level_rate)
                    level_records.append(level_record)
                    records.extend(level_pairs)
        run = new_run(
            settings,
            "bench",
            engines,
            run_id=runner.run_id,
            started_at=started_at,
            extra_config={"bench": runner.section(level_records, monitor.summary())},
        )
        store_bench(store, run, records, datetime.now(UTC))
        stored = store.runs_by_id([run.run_id])[run.run_id]
        stored_pairs = store.pairs(run_id=run.run_id)
        results = bench_results(stored, stored_pairs)
    finally:
        for engine in engines.values():  # an HTTP arm's event-loop thread stops here
            engine.close()
        store.close()
    path = out if out.suffix == ".json" else out / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    if as_json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    sys.stdout.write(bench_markdown(stored, stored_pairs))
    sys.stdout.write(
        f"\nrun {results['run_id']} stored; results in {path}; "
        f"`canaryd report --run {results['run_id']}` draws it\n"
    )
