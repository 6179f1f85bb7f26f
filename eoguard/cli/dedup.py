"""``eoguard dedup check|forget ID --scope S``: one message's dedup key in one consumer scope."""

from __future__ import annotations

from typing import Any

import click

from eoguard.cli import render
from eoguard.cli.context import CliContext, NotFoundError, json_option, pass_cli
from eoguard.store.dedup import DedupEntry, DedupState, DedupStore

_SCOPE = click.option("--scope", "-s", required=True, help="The consumer scope (dedup namespace).")


@click.group()
def dedup() -> None:
    """Dedup keys: per (scope, message id), absent -> claimed(owner, lease) -> done.

    A done key makes the scope drop any duplicate of the message until expires_at + grace.
    """


def _describe(entry: DedupEntry, now_ms: int) -> dict[str, Any]:
    claimed = entry.state is DedupState.CLAIMED
    return {
        "id": entry.message_id, "scope": entry.scope, "state": entry.state.name.lower(),
        "owner": entry.owner,
        "lease_deadline": render.iso_ms(entry.at_ms) if claimed else None,
        "lease_left_ms": entry.at_ms - now_ms if claimed else None,
        "lease_lapsed": claimed and entry.at_ms <= now_ms,
        "done_at": None if claimed else render.iso_ms(entry.at_ms),
        "expires_at": render.iso_ms(entry.expire_at_ms),
        "ttl_left_ms": entry.expire_at_ms - now_ms if entry.expire_at_ms >= 0 else None,
    }


def _lookup(cli: CliContext, message_id: str, scope: str) -> tuple[DedupStore, DedupEntry, int]:
    store = DedupStore(cli.client(), scope=scope, keys=cli.keys)
    entry = store.check(message_id)
    if entry is None:
        raise NotFoundError(f"no dedup key for id {message_id} in scope {scope!r} "
                            "(not seen by the scope, or expired)")
    seconds, micros = cli.client().time()
    return store, entry, int(seconds) * 1000 + int(micros) // 1000


def _table(title: str, info: dict[str, Any]) -> Any:
    return render.key_values(title, {
        **{k: v for k, v in info.items() if not k.endswith("_ms")},
        "lease left": render.duration_ms(info["lease_left_ms"]),
        "ttl left": render.duration_ms(info["ttl_left_ms"]),
    })


@dedup.command()
@click.argument("message_id")
@_SCOPE
@json_option
@pass_cli
def check(cli: CliContext, message_id: str, scope: str) -> None:
    """State of one message id in one scope: claimed (by whom, lease left) or done."""
    _, entry, now = _lookup(cli, message_id, scope)
    info = _describe(entry, now)
    render.show(cli, info, _table(f"dedup key of {message_id} in scope {scope!r}", info))


@dedup.command()
@click.argument("message_id")
@_SCOPE
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Show the key that would be deleted, delete nothing.")
@json_option
@pass_cli
def forget(cli: CliContext, message_id: str, scope: str, *, yes: bool, dry_run: bool) -> None:
    """Delete one dedup key so the scope handles the message again if it is redelivered.

    Its handler's effects already committed are NOT undone: a redelivery repeats them. A
    consumer that holds the claim right now finds its done mark refused (fenced).
    """
    store, entry, now = _lookup(cli, message_id, scope)
    info = _describe(entry, now)
    if not dry_run and not yes:
        if cli.as_json:
            raise click.UsageError("forget with --json needs --yes (no prompt in script mode)")
        click.confirm(f"forget {entry.state.name.lower()} id {message_id} in scope {scope!r}? "
                      "A redelivery would then be handled again", abort=True, err=True)
    deleted = False if dry_run else store.forget(message_id)
    data = {"dry_run": dry_run, "deleted": deleted, "entry": info}
    verb = "would forget" if dry_run else "forgot" if deleted else "already gone:"
    render.show(cli, data, f"{verb} id {message_id} in scope {scope!r} (was {info['state']})")
