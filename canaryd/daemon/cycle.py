"""The daemon's scheduled jobs, as the `CycleJobs` mixin of `Daemon`: the pair cycle
(retry the buffered pairs, then draw `pairs_per_cycle` prompts — live requests for
`traffic.live_share` of them while any wait — run them on every arm and store them; during
a rollout burst `rollout.concurrency` prompts at once), the gate job (after which the pace
is set again: `canaryd.daemon.pace`), the capability probe between cycles, retention, and
the heartbeat that feeds the watchdogs while the soak progresses. A mixin over
`DaemonState` (see there why): these are the bound methods APScheduler calls."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import structlog

from canaryd.daemon.plan import Plan
from canaryd.daemon.state import DaemonState
from canaryd.errors import CannotJudgeError, DatabaseError
from canaryd.pairs.runner import OwnSampling, PairGroup
from canaryd.traffic.live import live_prompt, own_sampling, stored_record
from gates.records import PairSource, Prompt

__all__ = ["CycleJobs"]

log = structlog.get_logger(__name__)


class CycleJobs(DaemonState):
    """The pair cycle, gate, probe, retention and heartbeat jobs."""

    def run_cycle(self) -> None:
        """One pair cycle: retry the buffered pairs, then run and store `pairs_per_cycle`."""
        self._burst.refresh()  # a burst whose hold expired ends here
        with self._cycle_lock:
            self._idle.clear()
            started = self._progress.mark()
            try:
                if self._stopping.is_set() or self._plan is None:
                    return
                interval = self._pace.interval_s
                ok = self._cycle(self._plan)
            except Exception:
                # A bug in one cycle must not stop the soak; it is logged and counted.
                log.exception("cycle.failed")
                ok, interval = False, self._pace.interval_s
            finally:
                self._idle.set()
            finished = self._progress.cycle_finished()
            self.cycles += 1
            self.metrics.liveness.cycle_finished(time.time(), ok)
            took = finished - started
            if took > interval:
                # APScheduler skips (coalesces) the runs this one overlapped; say so once.
                log.warning(
                    "cycle.overrun",
                    took_s=round(took, 3),
                    pair_interval_s=interval,
                    reason="a cycle took longer than the pair interval; cycles run back to "
                    "back, fewer than configured",
                )

    def _next_pair(self, plan: Plan) -> tuple[Prompt, OwnSampling | None, PairSource]:
        """The next prompt, its own sampling (live requests') and its source: a live
        request for `traffic.live_share` of the pairs while any wait, else a suite's."""
        live = self._traffic
        share = plan.settings.traffic.live_share
        if live is not None and self._mix.next_is_live(share, live.waiting() > 0):
            request = live.take()
            self.metrics.traffic.queue.set(len(live))
            if request is not None:
                return live_prompt(request), own_sampling(request), "live"
        return plan.sampler.next(), None, "control"

    def _cycle(self, plan: Plan) -> bool:
        db_away = not self._pairs.flush()
        ok = not db_away
        if self._burst.active():
            return self._burst_cycle(plan, db_away)
        for _ in range(plan.settings.schedule.pairs_per_cycle):
            if self._stopping.is_set():
                break  # stop scheduling new pairs; the one that finished is stored
            prompt, sampling, source = self._next_pair(plan)
            group = plan.runner.run_group(prompt, sampling=sampling, source=source)
            db_away = self._store_group(plan, prompt, source, group, db_away)
            ok = ok and not db_away
        return ok

    def _burst_cycle(self, plan: Plan, db_away: bool) -> bool:
        """`rollout.concurrency` pairs at once (each on every arm), counted as burst pairs."""
        ok = not db_away
        drawn = [self._next_pair(plan) for _ in range(plan.settings.rollout.concurrency)]
        with ThreadPoolExecutor(len(drawn), thread_name_prefix="canaryd-burst") as pool:
            running = [
                (
                    prompt,
                    source,
                    pool.submit(plan.runner.run_group, prompt, sampling=own, source=source),
                )
                for prompt, own, source in drawn
            ]
            for prompt, source, future in running:
                group = future.result()
                self.metrics.liveness.burst_pair(self._burst.counted(group.records))
                db_away = self._store_group(plan, prompt, source, group, db_away)
                ok = ok and not db_away
        return ok

    def _store_group(
        self, plan: Plan, prompt: Prompt, source: PairSource, group: PairGroup, db_away: bool
    ) -> bool:
        """Count and store one group's records (buffered while the database is away);
        returns whether the database is away after it."""
        include_text = plan.settings.logging.include_text
        store_text = plan.settings.traffic.store_text
        self._progress.mark()
        try:
            self.metrics.pairs.observe_group(group.records)
        except Exception:
            # Nothing an engine sends may cost the pair: it is stored all the same.
            log.exception("pair.metrics_failed", group_id=group.group_id)
        for measured in group.records:
            # A live pair keeps no text unless traffic.store_text says so; its
            # scores were computed on the whole pair already.
            record = stored_record(measured, store_text=store_text)
            if include_text and source == "control":  # a live pair's text: never
                log.info(
                    "pair.text",
                    pair_id=record.pair_id,
                    arm=record.arm,
                    prompt_text=[m.content for m in prompt.messages],
                    baseline_text=record.baseline.text,
                    speculative_text=record.speculative.text,
                )
            if db_away:
                self._pairs.buffer(record)  # keep the order: after the pairs waiting
                continue
            if not self._pairs.save(record):
                db_away = True
        return db_away

    def evaluate_gates(self) -> None:
        """The gate job: hand the gates the current time (they read everything else).

        A run that raises judged nothing and confirmed nothing: it is counted, and after
        `GATE_FAILURES_NOT_READY` in a row /readyz answers 503 (the state file's
        `confirmed_at` ages meanwhile, so a router turns speculation off)."""
        try:
            self.gates.evaluate(datetime.now(UTC))
        except Exception as exc:
            self.gate_failures += 1
            self.metrics.liveness.gate_run_finished(time.time(), ok=False)
            log.exception(
                "gates.failed",
                consecutive_failures=self.gate_failures,
                reason=f"{type(exc).__name__}: {exc}",
            )
        else:
            self.gate_failures = 0
            self.metrics.liveness.gate_run_finished(time.time(), ok=True)
            self._judge_burst()
        self._pace.repace()

    def _judge_burst(self) -> None:
        """While a rollout tool is judging a revision, its verdict after this gate run:
        the burst stops as soon as it decides, not at the tool's next poll."""
        query = self._burst.query
        if query is None or self._verdicts is None:
            return
        try:
            self._burst.judged(self._verdicts.judge(query))
        except CannotJudgeError as exc:
            log.warning("rollout.burst_unjudged", revision=query.revision, reason=exc.reason)

    def run_probe(self) -> None:
        """The probe job (canaryd.daemon.parity): between cycles, so that its burst and
        long prompts never weigh on a pair's latency; each capability counts as progress."""
        with self._cycle_lock:
            if self._stopping.is_set() or self._plan is None:
                return
            try:
                self._parity.run(
                    self._plan.settings, self._engines, self.store, on_progress=self._progressed
                )
            except Exception:
                log.exception("probe.crashed")  # a bug in the probe must not stop the soak

    def _progressed(self) -> None:
        self._progress.mark()

    def apply_retention(self) -> None:
        """The retention job: roll up and remove old rows; erase live text older than
        `retention.live_text_days` (kept only with `traffic.store_text`)."""
        settings = self.settings
        storage = settings.storage
        now = datetime.now(UTC)
        try:
            report = self.store.apply_retention(
                now, storage.raw_retention_days, storage.rollup_retention_days
            )
            erased = self.store.erase_live_text(
                now - timedelta(days=settings.retention.live_text_days)
            )
        except DatabaseError as exc:
            self.metrics.store.error("retention")
            log.error("retention.failed", reason=str(exc))
            return
        log.info("retention.done", report=repr(report), live_generations_erased=erased)

    def heartbeat(self) -> None:
        """The heartbeat job: proves the scheduler is alive to metrics and, while cycles
        progress, to the watchdogs (`heartbeat_hooks`)."""
        now = time.time()
        self.last_heartbeat = now
        self._progress.beat()
        self.metrics.liveness.heartbeat(now)
        if not self._progress.progressing():
            return
        for hook in self.heartbeat_hooks:
            try:
                hook(now)
            except Exception:
                log.exception("heartbeat.hook_failed")
