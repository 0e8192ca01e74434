"""The switch state file production reads (`switch.json`): the state object written to
it with its freshness (`confirmed_at`), and its atomic, locked, never-backwards write.

Writers serialise on a lock file beside it, write a temp file in the same directory,
fsync it, rename it over the file and fsync the directory; the file is padded to whole
blocks, so that on a full volume a writer overwrites it in place instead. A file never
goes back to a lower generation, and a `pending_sync` file (the kill switch written while
the database was down) is only replaced by its adoption or a higher generation.
`confirmed_at` says when canaryd last checked the file against the database; refreshing
it rewrites the file at the same generation, and comparisons of the state leave it out.
So do they
`route_to_baseline`: what the latest capability probe says a router should send to the
baseline one request at a time (canaryd.parity.routing). It changes with each probe, not
with a transition, and a writer that does not know it keeps the file's own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from gates import SwitchState

__all__ = [
    "CONFIRMED_AT",
    "PENDING_SYNC",
    "ROUTE_TO_BASELINE",
    "STATE_FILE_ACTUATOR",
    "STATE_FILE_BLOCK",
    "file_generation",
    "file_lock",
    "file_object",
    "flock_within",
    "generation_of",
    "is_pending",
    "open_lock_file",
    "overwrite_in_place",
    "padded_body",
    "read_state_file",
    "remove_leftover_temps",
    "replace_file",
    "shows",
    "state_object",
    "without_freshness",
    "without_pending",
    "write_state_file",
]

STATE_FILE_ACTUATOR = "state_file"  # its name among the actuators' failures
PENDING_SYNC = "pending_sync"  # state-file field: written while the database was down
CONFIRMED_AT = "confirmed_at"  # state-file field: when canaryd last confirmed it
ROUTE_TO_BASELINE = "route_to_baseline"  # state-file field: requests a router sends to the baseline
_ANNOTATIONS = (CONFIRMED_AT, ROUTE_TO_BASELINE)  # in the file, not in the state


def state_object(state: SwitchState) -> dict[str, Any]:
    """What production reads (the state file, the webhook body, `switch status --json`)."""
    return {
        "mode": state.mode.value,
        "speculative_enabled": state.speculative_enabled,
        "reason": state.reason,
        "since": state.since.isoformat() if state.since else None,
        "actor": state.actor,
        "generation": state.generation,
        "control": state.control.value,
        "latched": state.latched,
        "categories": {
            name: {
                "mode": own.mode.value,
                "speculative_enabled": own.speculative_enabled,
                "reason": own.reason,
                "since": own.since.isoformat() if own.since else None,
                "actor": own.actor,
                "generation": own.generation,
                "control": own.control.value,
                "latched": own.latched,
            }
            for name, own in state.categories
        },
    }


def file_object(
    state: SwitchState,
    confirmed_at: datetime | None,
    routes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What the state file holds: the state object, when it was confirmed against the
    database, and the requests to route to the baseline (hooks get the state object
    alone); no `confirmed_at` when nothing has confirmed it yet (no gate run completed):
    a router then reads speculation off; no `route_to_baseline` without `routes`."""
    obj = state_object(state)
    if routes is not None:
        obj[ROUTE_TO_BASELINE] = dict(routes)
    if confirmed_at is not None:
        obj[CONFIRMED_AT] = confirmed_at.isoformat()
    return obj


def without_freshness(data: dict[str, Any]) -> dict[str, Any]:
    """The state object of a file: without `confirmed_at` and `route_to_baseline`."""
    return {key: value for key, value in data.items() if key not in _ANNOTATIONS}


def shows(data: dict[str, Any] | None, state: SwitchState) -> bool:
    """True when a state file's object holds `state` (its freshness aside)."""
    return data is not None and without_freshness(data) == state_object(state)


def read_state_file(path: Path) -> dict[str, Any] | None:
    """The state file's object; None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def generation_of(data: dict[str, Any] | None) -> int:
    """A state object's generation; -1 when there is none or it is not an integer."""
    value = data.get("generation") if data else None
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def file_generation(path: Path) -> int:
    return generation_of(read_state_file(path))


def is_pending(data: dict[str, Any] | None) -> bool:
    return data is not None and data.get(PENDING_SYNC) is True


def without_pending(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key != PENDING_SYNC}


# How long a writer waits for the writers' lock. Every writer holds it for one small
# write; one that holds it longer is stuck (a frozen process, a hung disk), and the kill
# switch must finish in seconds whatever holds it.
LOCK_WAIT_S = 5.0
_LOCK_POLL_S = 0.02


@contextlib.contextmanager
def file_lock(path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """The writers' exclusive lock on `path`, held on a lock file beside it. Raises
    `TimeoutError` (an `OSError`: a write that failed) when another process holds it for
    more than `wait_s`."""
    lock = path.with_name(f".{path.name}.lock")
    fd = open_lock_file(lock)
    try:
        if not flock_within(fd, wait_s):
            raise TimeoutError(
                f"another process has held the lock {str(lock)!r} for more than "
                f"{wait_s:g} s (find it with `fuser -v {lock}`)"
            )
        yield
    finally:
        os.close(fd)  # closing releases the lock


def flock_within(fd: int, wait_s: float) -> bool:
    """Take the exclusive `flock` on `fd`, polling for at most `wait_s`; False when
    another process still holds it then."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_LOCK_POLL_S)


def open_lock_file(lock: Path) -> int:
    """A descriptor to `flock` on `lock`, created if missing. Read-only when this user
    may not write it: an operator's `sudo canaryd switch` may have created it as root,
    and the daemon's user must still serialise on it."""
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:
        return os.open(lock, os.O_RDONLY)


# Every write pads the file to a whole number of these blocks (plus room to grow), with
# JSON's insignificant whitespace: on a full volume the file's own blocks are still its
# own, so the kill switch can overwrite it in place when no new temp file fits.
STATE_FILE_BLOCK = 4096
_ROOM_TO_GROW = 1024  # a rollback's state (a longer reason, `pending_sync`) fits the old size
# A write that fails for lack of room, not for a fault of the file or the directory.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def padded_body(state: dict[str, Any], size: int = 0, *, room: int = _ROOM_TO_GROW) -> bytes:
    """`state` as JSON padded with spaces to at least `size` bytes and to a whole number
    of `STATE_FILE_BLOCK`s with `room` to grow; readers parse it as the plain JSON."""
    body = json.dumps(state, indent=2, sort_keys=True).encode()
    blocks = -(-(len(body) + max(room, 1)) // STATE_FILE_BLOCK)
    length = max(size, blocks * STATE_FILE_BLOCK)
    return body + b" " * (length - len(body) - 1) + b"\n"


def replace_file(path: Path, state: dict[str, Any]) -> None:
    """The atomic write itself; the caller holds the lock. Where no new temp file fits
    (the volume or the quota is full), the existing file is overwritten in place instead:
    within its own padded size that needs no new blocks (a reader may then see a torn
    write: routers read an unreadable file as speculation off)."""
    try:
        _replace_atomically(path, padded_body(state))
    except OSError as exc:
        if exc.errno not in _NO_ROOM or not path.is_file():
            raise
        try:
            overwrite_in_place(path, state)
        except OSError as second:
            raise OSError(
                second.errno, f"{exc.strerror}; overwriting in place failed too: {second}"
            ) from exc


def _replace_atomically(path: Path, body: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)  # readable by production's user
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        Path(temp).replace(path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def overwrite_in_place(path: Path, state: dict[str, Any]) -> None:
    """Write `state` over the existing file's bytes, padded to its size (never shorter:
    a truncate would be a moment with no state), in one write, then fsync."""
    fd = os.open(path, os.O_WRONLY)
    try:
        # A file an older canaryd wrote unpadded still owns its whole last block.
        body = padded_body(state, os.fstat(fd).st_size, room=0)
        written = os.pwrite(fd, body, 0)
        if written != len(body):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(body)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_state_file(path: Path, state: dict[str, Any], *, keep_routes: bool = False) -> bool:
    """Atomically replace `path` with `state` as JSON: a temp file in the same directory,
    fsync, rename, fsync of the directory. Writers serialise on a lock file beside it and
    never replace a higher generation (a slow writer cannot move production backwards),
    nor a `pending_sync` emergency file with anything but a higher generation or the same
    state without the mark (its adoption); returns False when it skipped for that reason.
    `keep_routes`: a `state` without `route_to_baseline` takes the file's own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    generation = int(state["generation"])
    with file_lock(path):
        on_disk = read_state_file(path)
        if keep_routes and on_disk is not None and ROUTE_TO_BASELINE not in state:
            routes = on_disk.get(ROUTE_TO_BASELINE)
            if isinstance(routes, dict):
                state = {**state, ROUTE_TO_BASELINE: routes}
        if generation_of(on_disk) > generation:
            return False
        if (
            on_disk is not None
            and is_pending(on_disk)
            and not is_pending(state)
            and generation_of(on_disk) == generation
            and without_freshness(without_pending(on_disk)) != without_freshness(state)
        ):
            # A writer that decided before the emergency file appeared lands on the same
            # generation; the operator's rollback wins until the database adopts it.
            return False
        replace_file(path, state)
    return True


def remove_leftover_temps(path: Path) -> list[Path]:
    """Delete the temp files a writer killed between its write and its rename left beside
    `path`; under the writers' lock, so no live writer's file goes. Returns what went."""
    if not path.parent.is_dir():
        return []
    removed: list[Path] = []
    with file_lock(path):
        for temp in path.parent.glob(f".{path.name}.*.tmp"):
            temp.unlink(missing_ok=True)
            removed.append(temp)
    return removed
