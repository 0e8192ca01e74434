"""SIGHUP's reload, as the `Reloading` mixin of `Daemon`: re-read the configuration file
and the suites, validate all of it, rebuild only the engines whose arm changed, start a
new run row when the configuration did, and swap the new plan in between two cycles; on
any error the running configuration stays. Settings bound at start (the store's URL and
the two listening sockets) keep their running values. A mixin over `DaemonState` (see
there why): a reload replaces the state the cycle runs on, under the cycle's lock."""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from canaryd.config import Settings, load_settings
from canaryd.daemon.plan import new_plan, publish_build_info
from canaryd.daemon.scheduling import reschedule
from canaryd.daemon.state import DaemonState
from canaryd.errors import CanarydError, DatabaseError, EngineError
from canaryd.logs import configure_logging
from canaryd.pairs.plan import suite_sampler
from engine.base import Engine

__all__ = ["Reloading"]

log = structlog.get_logger(__name__)


class Reloading(DaemonState):
    """`reload()` and its rules: what a running daemon keeps, what it rebuilds."""

    def reload(self) -> bool:
        """Re-read the config file and suites; swap them in only if all of it is valid.

        Engines are rebuilt (and warmed up) only for arms whose config changed; a changed
        configuration starts a new daemon run row so every pair names the config it ran
        under. On any error the old configuration stays and the reason is logged.
        """
        old = self._plan
        if old is None or self._stack is None:
            raise RuntimeError("the daemon is not started")
        try:
            new = self._keep_restart_only(load_settings(self.config_path), old.settings)
            sampler = suite_sampler(new)
        except (CanarydError, EngineError, ValueError) as exc:
            log.error("config.reload_failed", reason=str(exc), kept=old.run.config_hash)
            return False
        reuse = {
            arm: engine
            for arm, engine in old.engines.items()
            if arm in new.arms.names and new.arms.arm(arm) == old.settings.arms.arm(arm)
        }
        replaced = [arm for arm in old.engines if arm not in reuse]
        engines: dict[str, Engine] = dict(reuse)
        try:
            engines = self._load_engines(new, reuse)
            plan = new_plan(new, sampler, engines, self.metrics.pairs, previous=old.run)
            if plan.run is not old.run:
                with self._pairs.lock:
                    self.store.create_run(plan.run)
        except Exception as exc:
            # Any error, not only ours: a model directory transformers cannot read raises
            # OSError, a GPU without room for the new model a RuntimeError. A reload must
            # never take the running daemon down with it.
            for arm, engine in engines.items():
                if arm not in reuse:
                    engine.close()
            self._arms_ready(old.engines)
            self._engines_loaded = True  # the old engines still are
            log.error(
                "config.reload_failed",
                reason=str(exc) or type(exc).__name__,
                kept=old.run.config_hash,
                exc_info=not isinstance(exc, (CanarydError, EngineError)),
            )
            return False
        with self._cycle_lock:
            self._plan = plan
            self._engines = engines
            self.settings = new
        for arm in replaced:
            old.engines[arm].close()
        if plan.run is not old.run:
            try:
                with self._pairs.lock:
                    self.store.finish_run(old.run.run_id, datetime.now(UTC))
            except DatabaseError as exc:
                log.error("run.finish_failed", run_id=old.run.run_id, reason=str(exc))
            publish_build_info(self.metrics.build, plan.run)
        self._pairs.resize(new.storage.buffer_pairs)
        self._reschedule(old.settings, new)
        self._reconfigure_telemetry()
        if self.manage_logging:
            configure_logging(new.logging)
        log.info(
            "config.reloaded",
            run_id=plan.run.run_id,
            config_hash=plan.run.config_hash,
            engines_rebuilt=[arm for arm in engines if arm not in reuse],
            engines_closed=replaced,
            categories=sampler.categories,
        )
        return True

    def _keep_restart_only(self, new: Settings, old: Settings) -> Settings:
        """`new` with the running values of the settings bound at start: `storage.url`
        (the store), `server.listen` and `traffic.listen` (the sockets); a change to them
        is logged as needing a restart. The mirror sink's other settings (bounds, token,
        key) also apply at the next start; `traffic.live_share` and `traffic.store_text`
        apply at once."""
        changed = []
        if new.storage.url != old.storage.url:
            changed.append("storage.url")
        if new.server.listen != old.server.listen:
            changed.append("server.listen")
        if new.traffic.listen != old.traffic.listen:
            changed.append("traffic.listen")
        if changed:
            log.warning(
                "config.restart_required",
                keys=changed,
                reason="these settings apply at start only; the running values are kept",
            )
        return new.model_copy(
            update={
                "storage": new.storage.model_copy(update={"url": old.storage.url}),
                "server": new.server.model_copy(update={"listen": old.server.listen}),
                "traffic": new.traffic.model_copy(update={"listen": old.traffic.listen}),
            }
        )

    def _reconfigure_telemetry(self) -> None:
        """The scrape job on the new `[telemetry]`; a source that cannot be opened keeps
        the running ones."""
        try:
            self._telemetry.reconfigure()
        except CanarydError as exc:
            log.error("telemetry.reload_failed", reason=str(exc), kept="the running sources")

    def _reschedule(self, old: Settings, new: Settings) -> None:
        scheduler = self._scheduler
        if scheduler is None or old.schedule == new.schedule:
            return
        reschedule(scheduler, new.schedule)
        self._pace.scheduled(new.schedule)
