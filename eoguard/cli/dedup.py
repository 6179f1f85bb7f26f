"""``eoguard dedup check|forget ID --scope S``: one message's claim key in one consumer scope,
with the batch record of the claim pass that holds it and the state the v2 rules derive."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click

from eoguard.cli import render
from eoguard.cli.context import CliContext, NotFoundError, json_option, message_ids, pass_cli
from eoguard.store.dedup import BatchRecord, BatchState, DedupEntry, DedupStore, parse_position
from eoguard.store.dedup_admin import read_entries
from eoguard.store.dedup_types import IdState

_SCOPE = click.option("--scope", "-s", required=True, help="The consumer scope (dedup namespace).")


@click.group()
def dedup() -> None:
    """Claim keys: per (scope, message id), the claim pass (token) that took it and where.

    The id's state is its batch record's: done (a later copy is dropped until expires_at +
    grace), in progress (open, lease live), free to take over (lease lapsed, or record gone);
    or partial (done for every reader, effects partially applied).
    """


def id_states(cli: CliContext, ids: Iterable[str], scopes: Iterable[str]
              ) -> tuple[dict[str, dict[str, str]], int]:
    """Each id's state in each scope, as ``dedup check`` derives it (``new``: no claim key),
    read in one pipelined pass over the claim keys; and Redis's clock, which judged them."""
    client = cli.client()
    keys = cli.keys
    wanted = sorted(set(ids))
    scopes = list(scopes)
    found: dict[tuple[str, str], str] = {}
    now = cli.server_ms()
    for scope in scopes:
        for entry in read_entries(client, keys, [keys.dedup(scope, mid) for mid in wanted]):
            found[(scope, entry.message_id)] = entry.id_state(now).value
    return ({mid: {scope: found.get((scope, mid), IdState.NEW.value) for scope in scopes}
             for mid in wanted}, now)


def _position(text: str) -> dict[str, Any] | None:
    try:
        return parse_position(text)._asdict()
    except ValueError:  # not written by this eoguard: shown as stored (position_text)
        return None


def _batch(record: BatchRecord | None, now_ms: int) -> dict[str, Any] | None:
    if record is None:
        return None
    is_open = record.state is BatchState.OPEN
    return {
        "key": record.key, "state": record.state.name.lower(),
        "lease_deadline": render.iso_ms(record.at_ms) if is_open else None,
        "lease_left_ms": record.at_ms - now_ms if is_open else None,
        "done_at": None if is_open else render.iso_ms(record.at_ms),
        "expires_at": render.iso_ms(record.expire_at_ms),
    }


def _describe(entry: DedupEntry, now_ms: int) -> dict[str, Any]:
    return {
        "id": entry.message_id, "scope": entry.scope, "state": entry.id_state(now_ms).value,
        "key": entry.key, "claim": entry.state.name.lower(), "token": entry.token,
        "position": _position(entry.position), "position_text": entry.position,
        "batch": _batch(entry.batch, now_ms),
        "expires_at": render.iso_ms(entry.expire_at_ms),
        "ttl_left_ms": entry.expire_at_ms - now_ms if entry.expire_at_ms >= 0 else None,
    }


def _lookup(cli: CliContext, message_id: str, scope: str) -> tuple[DedupStore, DedupEntry, int]:
    store = DedupStore(cli.client(), scope=scope, keys=cli.keys)
    entry = store.check(message_id)
    if entry is None:
        raise NotFoundError(f"no claim key for id {message_id} in scope {scope!r} "
                            "(not seen by the scope, or expired)")
    return store, entry, cli.server_ms()


def _lease(batch: dict[str, Any]) -> str | None:
    left = batch["lease_left_ms"]
    if left is None:
        return None
    return render.duration_ms(left) if left > 0 else f"lapsed {render.duration_ms(-left)} ago"


def _table(title: str, info: dict[str, Any]) -> Any:
    where, batch = info["position"], info["batch"]
    return render.key_values(title, {
        "state": info["state"],
        "claim key": info["key"],
        "claim": info["claim"],
        "token": info["token"],
        **({"reader": where["reader"], "topic": where["topic"], "partition": where["partition"],
            "offset": where["offset"]} if where else {"position": info["position_text"]}),
        "batch record": "missing (its claims are free to take over)" if batch is None
        else batch["state"],
        **({} if batch is None else {"lease left": _lease(batch), "done at": batch["done_at"]}),
        "expires at": info["expires_at"],
        "ttl left": render.duration_ms(info["ttl_left_ms"]),
    })


@dedup.command()
@click.argument("message_id", callback=message_ids)
@_SCOPE
@json_option
@pass_cli
def check(cli: CliContext, message_id: str, scope: str) -> None:
    """State of one message id in one scope: its claim key, its batch record, its state."""
    _, entry, now = _lookup(cli, message_id, scope)
    info = _describe(entry, now)
    render.show(cli, info, _table(f"claim key of {message_id} in scope {scope!r}", info))


@dedup.command()
@click.argument("message_id", callback=message_ids)
@_SCOPE
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Show the key that would be deleted, delete nothing.")
@json_option
@pass_cli
def forget(cli: CliContext, message_id: str, scope: str, *, yes: bool, dry_run: bool) -> None:
    """Delete one claim key so the scope handles the message again if it is redelivered.

    Its handler's effects already committed are NOT undone: a redelivery repeats them. A
    consumer that holds the claim right now finds it gone at its done mark (nothing applied)
    and claims and handles the message again. The batch record stays: it covers other claims.
    """
    store, entry, now = _lookup(cli, message_id, scope)
    info = _describe(entry, now)
    if not dry_run and not yes:
        if cli.as_json:
            raise click.UsageError("forget with --json needs --yes (no prompt in script mode)")
        click.confirm(f"forget {info['state']} id {message_id} in scope {scope!r}? "
                      "A redelivery would then be handled again", abort=True, err=True)
    deleted = False if dry_run else store.forget(message_id)
    data = {"dry_run": dry_run, "deleted": deleted, "entry": info}
    verb = "would forget" if dry_run else "forgot" if deleted else "already gone:"
    render.show(cli, data, f"{verb} id {message_id} in scope {scope!r} (was {info['state']})")
