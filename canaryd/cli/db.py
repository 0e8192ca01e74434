"""`canaryd db`: create, upgrade and inspect the history database's schema, and forget
drift pins (`repin`).

The URL follows every command's rule (`StorageConfig.resolved_url`): `--url`, else the
configuration's `storage.url` (`--config` or CANARYD_CONFIG, CANARYD_STORAGE__URL), else
env CANARYD_DATABASE_URL, else the default SQLite file under the data directory. Problems
(bad URL, unreachable server, schema not current) are one line on stderr and exit code 2.
"""

from __future__ import annotations

from typing import Annotated

import typer

from canaryd.cli.common import handle_errors
from canaryd.cli.options import ConfigOption, UrlOption, settings_and_url
from canaryd.errors import DatabaseError
from canaryd.store import (
    SqlStore,
    current_revision,
    head_revision,
    known_revisions,
    mask_url,
    schema_problem,
)
from canaryd.store import upgrade as upgrade_database

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Create, upgrade and inspect the database schema.",
)


@app.command()
@handle_errors
def upgrade(url: UrlOption = None, config: ConfigOption = None) -> None:
    """Create the schema, or migrate it to this canaryd's revision."""
    _, resolved = settings_and_url(config, url)
    before = current_revision(resolved)
    after = upgrade_database(resolved)
    if before == after:
        typer.echo(f"{mask_url(resolved)}: schema already at revision {after} (head)")
    else:
        typer.echo(
            f"{mask_url(resolved)}: schema upgraded from {before or 'empty'} to revision "
            f"{after} (head)"
        )


@app.command()
@handle_errors
def current(url: UrlOption = None, config: ConfigOption = None) -> None:
    """Show the schema revision; exit 2 with what to run when it is not current."""
    _, resolved = settings_and_url(config, url)
    revision = current_revision(resolved)
    problem = schema_problem(revision, head_revision(), known_revisions(), mask_url(resolved))
    if problem is not None:
        raise DatabaseError(problem)
    typer.echo(f"{mask_url(resolved)}: schema at revision {revision} (head)")


@app.command()
@handle_errors
def repin(
    category: Annotated[
        list[str] | None,
        typer.Option("--category", help="only this category's pins (repeatable)"),
    ] = None,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Forget pinned drift references (all, or those of --category) so that the daemon
    pins them afresh from the next healthy pairs: after a deliberate change of traffic,
    or for a pin you distrust. Until then those categories are unmonitored (named in the
    drift gate's detail)."""
    _, resolved = settings_and_url(config, url)
    with SqlStore.open(resolved) as store:
        removed = store.unpin_drift_references(category or ())
    which = ", ".join(category) if category else "every category"
    typer.echo(f"{mask_url(resolved)}: {removed} drift pin(s) forgotten ({which})")
