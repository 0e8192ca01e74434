"""`canaryd run`: the soak daemon in the foreground until SIGTERM or SIGINT (SIGHUP reloads)."""

from __future__ import annotations

import os
import sys
import threading
import time

import structlog
import typer

from canaryd.cli.common import handle_errors
from canaryd.cli.options import ConfigOption
from canaryd.config import Settings, config_path, load_settings
from canaryd.daemon import sdnotify
from canaryd.logs import configure_logging


@handle_errors
def run(
    config: ConfigOption = None,
) -> None:
    """Run the soak daemon: pairs on a schedule, /metrics, /healthz and /readyz."""
    path = config_path(config)
    settings = load_settings(path)
    configure_logging(settings.logging)
    # Imported here: the daemon pulls in SQLAlchemy, Prometheus and APScheduler, which
    # `canaryd --help` and a config error should not wait for.
    from canaryd.daemon import Daemon, serve_until_signalled
    from canaryd.judging.gatejob import SwitchGates
    from canaryd.metrics import CanarydMetrics

    metrics = CanarydMetrics()
    daemon: Daemon | None = None

    def current_settings() -> Settings:  # follows SIGHUP reloads
        return daemon.settings if daemon is not None else settings

    gates = SwitchGates(current_settings, metrics=metrics.switch)
    daemon = Daemon(settings, config_path=path, gates=gates, metrics=metrics, manage_logging=True)
    try:
        daemon.start()
    except KeyboardInterrupt:  # Ctrl-C during the warm-up: start() has undone itself
        raise typer.Exit(130) from None
    # The switch state was written from the database inside `daemon.start()`, before
    # the engines loaded (`GateHook.start`).
    running: Daemon = daemon

    def announce_ready() -> None:
        # systemd (Type=notify): READY only now — engines warmed up, database checked,
        # run row written, signal handlers installed; the watchdog is fed by the
        # scheduler's heartbeat job, so a wedged scheduler ends in a watchdog restart.
        # Both are no-ops outside systemd.
        sdnotify.ready(f"serving on {running.address}")
        running.heartbeat_hooks.append(feed_watchdog)

    def feed_watchdog(_now: float) -> None:
        sdnotify.watchdog()

    watchdog_s = sdnotify.watchdog_interval_s()
    if watchdog_s is not None and settings.schedule.heartbeat_interval_s > watchdog_s / 2:
        print(
            f"canaryd: warning: schedule.heartbeat_interval_s "
            f"({settings.schedule.heartbeat_interval_s} s) is more than half of systemd's "
            f"WatchdogSec ({watchdog_s} s): a slow heartbeat may trigger a restart",
            file=sys.stderr,
        )
    print(
        f"canaryd: serving /metrics, /healthz and /readyz on http://{daemon.address} "
        f"(SIGTERM or Ctrl-C stops, SIGHUP reloads the config)",
        file=sys.stderr,
        flush=True,
    )
    try:
        code = serve_until_signalled(daemon, on_ready=announce_ready)
    finally:
        gates.close()
    stuck = _threads_left(THREADS_EXIT_WAIT_S)
    if daemon.abandoned or stuck:
        # A generation, or a save or gate run on a database that does not answer, still
        # runs in a worker thread and cannot be interrupted; the interpreter would join it
        # at exit, past any bound. Its pair is dropped whole: leave now.
        if stuck:
            structlog.get_logger(__name__).warning("shutdown.threads_left", threads=stuck)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


THREADS_EXIT_WAIT_S = 1.0  # idle worker threads leave at once; a stuck one never does


def _threads_left(wait_s: float) -> list[str]:
    """The names of the non-daemon threads still running after `wait_s` (together)."""
    deadline = time.monotonic() + wait_s
    left = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    return left
