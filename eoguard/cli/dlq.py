"""``eoguard dlq list|replay TOPIC``: a dead-letter topic read back, and its records sent to
the topics they came from as new attempts of the same messages (:mod:`eoguard.cli.dead_letters`
says what a next attempt is), so each consumer scope's dedup store decides again: a message
some scope already did is dropped there as a duplicate, the others are handled.

The dead-letter topic is only read (no consumer group, nothing committed), never changed: a
replay that fails part way loses nothing, and running it again sends the same messages again,
which the dedup store drops where they were done. A record counts as replayed only once Kafka
acknowledged it (``acks=all``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from eoguard.cli import render
from eoguard.cli.context import (
    MOMENT,
    BadInputError,
    CliContext,
    CliError,
    NotFoundError,
    json_option,
    message_ids,
    pass_cli,
)
from eoguard.cli.dead_letters import Filter, Letter, read_letter
from eoguard.cli.dedup import id_states
from eoguard.cli.kafka_options import kafka_config, kafka_options, shown
from eoguard.codec import EnvelopeCodec
from eoguard.consumer.dead_letter import DeadLetterReason
from eoguard.envelope import now_ms
from eoguard.kafka.producer import KafkaProducer, delivery_error
from eoguard.kafka.reader import Offset, TopicReader

ERROR_CHARS = 60  # an error's width in the table (--json shows it whole)
OUTCOMES = ("replayed", "would-replay", "skipped", "failed", "unacknowledged", "not-sent")
"""A dead letter's outcome in a replay: acknowledged by Kafka; the dry run's; not replayable;
refused by Kafka; no answer within --timeout; never handed to Kafka (its queue stayed full)."""
F = Callable[..., Any]


@click.group()
def dlq() -> None:
    """Dead letters: list them, replay them to the topics they came from.

    A consumer scope dead-letters a record (to <scope>.dead-letter by default) with headers
    saying why (reason: malformed, handler-failed, expired, partial-effects) and where it was
    read. A replay sends each selected one back as the same message, attempt + 1, in its own
    wire format; the dedup store then decides, as for any redelivery.
    """


def _filters(f: F) -> F:
    options = [
        click.argument("topic"),
        click.option("--reason", "reasons", multiple=True,
                     type=click.Choice([r.value for r in DeadLetterReason]),
                     help="Only dead letters of this reason (repeatable)."),
        click.option("--id", "ids", multiple=True, callback=message_ids, metavar="ID",
                     help="Only this message id (repeatable)."),
        click.option("--since", "since_ms", type=MOMENT, default=None, metavar="TIME",
                     help="Only those dead-lettered at or after TIME: RFC 3339, or a duration "
                          "ago (90m, 2h, 1d)."),
        click.option("--until", "until_ms", type=MOMENT, default=None, metavar="TIME",
                     help="Only those dead-lettered before TIME (as --since)."),
        click.option("--source-topic", "sources", multiple=True, metavar="TOPIC",
                     help="Only those that came from this topic (repeatable)."),
        click.option("--timeout", "timeout_s", default=30.0, show_default=True,
                     type=click.FloatRange(1), help="Seconds to wait for Kafka without progress."),
        click.option("--scope", "-s", "scopes", multiple=True,
                     help="Show each id's state in this consumer scope (repeatable): where it is "
                          "done, a replay is dropped as a duplicate."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _select(cli: CliContext, topic: str, conf: dict[str, str], rule: Filter, *,
            timeout_s: float, scopes: tuple[str, ...]) -> tuple[list[Letter], list[str]]:
    """The dead letters of ``topic`` the rule takes, in partition and offset order, with their
    ids' states in ``scopes``, and the ids of ``--id`` none of them has; NotFoundError when
    that is every one of them."""
    if rule.since_ms is not None and rule.until_ms is not None and rule.since_ms >= rule.until_ms:
        raise BadInputError("--since must be before --until")
    codec = EnvelopeCodec()
    now = now_ms()
    reader = TopicReader(conf, timeout_s=timeout_s)
    try:
        letters = [read_letter(m, codec, now)
                   for m in reader.read(topic, reader.partitions(topic), Offset())]
    finally:
        reader.close()
    chosen = [letter for letter in letters if rule.matches(letter)]
    missing = sorted(rule.ids - {letter.id for letter in chosen})
    if rule.ids and len(missing) == len(rule.ids):
        raise NotFoundError(f"no dead letter in {topic!r} the filters take has id "
                            f"{', '.join(missing)}")
    if scopes:
        states, _ = id_states(cli, (x.id for x in chosen if x.id is not None), scopes)
        for letter in chosen:
            letter.states = states.get(letter.id, {}) if letter.id is not None else {}
    return chosen, missing


def _rule(reasons: tuple[str, ...], ids: tuple[str, ...], since_ms: int | None,
          until_ms: int | None, sources: tuple[str, ...]) -> Filter:
    return Filter(frozenset(reasons), frozenset(ids), since_ms, until_ms, frozenset(sources))


@dlq.command("list")
@_filters
@click.option("--limit", default=100, show_default=True, type=click.IntRange(0),
              help="Show at most this many (oldest first); 0 = all. The total is always counted.")
@kafka_options
@json_option
@pass_cli
def list_letters(cli: CliContext, topic: str, *, reasons: tuple[str, ...], ids: tuple[str, ...],
                 since_ms: int | None, until_ms: int | None, sources: tuple[str, ...],
                 timeout_s: float, scopes: tuple[str, ...], limit: int, bootstrap_servers: str | None,
                 config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """List TOPIC's dead letters: reason, error, message id, where each came from, and
    whether a replay would send it (or why not).

    Kafka's client settings: -b, -F FILE and -X key=value, as kcat takes them.
    """
    conf = kafka_config(bootstrap_servers, config_file, overrides)
    letters, missing = _select(cli, topic, conf,
                               _rule(reasons, ids, since_ms, until_ms, sources),
                               timeout_s=timeout_s, scopes=scopes)
    rows = [letter.as_data() for letter in (letters[:limit] if limit else letters)]
    data = {"topic": topic, "client": shown(conf), "matched": len(letters), "shown": len(rows),
            "ids_not_found": missing, "records": rows}
    render.show(cli, data, _table(f"{topic}: {len(letters):,} dead letter(s)", rows, scopes))


@dlq.command()
@_filters
@click.option("--all", "take_all", is_flag=True, help="Every dead letter (no filter given).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed, send nothing.")
@kafka_options
@json_option
@pass_cli
def replay(cli: CliContext, topic: str, *, reasons: tuple[str, ...], ids: tuple[str, ...],
           since_ms: int | None, until_ms: int | None, sources: tuple[str, ...],
           timeout_s: float, scopes: tuple[str, ...], take_all: bool, yes: bool, dry_run: bool,
           bootstrap_servers: str | None, config_file: Path | None,
           overrides: tuple[str, ...]) -> None:
    """Send TOPIC's selected dead letters back to the topics they came from, each as the same
    message (same id, attempt + 1, its own wire format); the dedup store decides again.

    Select by --reason, --id, --since/--until, --source-topic, or --all. What cannot be
    replayed (a record that does not decode, a plain record, an expired message) is listed
    with the reason and skipped. A record is reported replayed once Kafka acknowledged it;
    any other outcome exits 1. Kafka's client settings: -b, -F FILE and -X key=value.
    """
    rule = _rule(reasons, ids, since_ms, until_ms, sources)
    if rule.empty != take_all:
        raise click.UsageError("select dead letters with --reason, --id, --since, --until or "
                               "--source-topic, or take them all with --all (one of the two)")
    conf = kafka_config(bootstrap_servers, config_file, overrides)
    letters, missing = _select(cli, topic, conf, rule, timeout_s=timeout_s, scopes=scopes)
    sending = [letter for letter in letters if letter.skip is None]
    for letter in letters:
        letter.outcome = {"outcome": "skipped" if letter.skip else
                          "would-replay" if dry_run else "not-sent"}
    if sending and not dry_run:
        if not yes:
            if cli.as_json:
                raise click.UsageError("replay with --json needs --yes (no prompt in script mode)")
            click.confirm(f"replay {len(sending):,} dead letter(s) to their source topics?",
                          abort=True, err=True)
        refused = _send(conf, sending, timeout_s)
    else:
        refused = None
    rows = [letter.as_data() for letter in letters]
    counts = {name: sum(1 for r in rows if r["outcome"] == name) for name in OUTCOMES}
    data = {"topic": topic, "client": shown(conf), "dry_run": dry_run, "matched": len(rows),
            **counts, "ids_not_found": missing, "records": rows}
    title = (f"{topic}: {len(rows):,} matched, " + ", ".join(
        f"{n:,} {name}" for name, n in counts.items() if n or name in ("replayed", "skipped")))
    render.show(cli, data, _table(title, rows, scopes, outcome=True))
    lost = counts["failed"] + counts["unacknowledged"] + counts["not-sent"]
    if lost:
        raise CliError(f"{lost} of {len(sending)} replay(s) not acknowledged by Kafka at "
                       f"{conf['bootstrap.servers']}" + (f" ({refused})" if refused else "")
                       + "; their dead letters stay: run the replay again")


def _send(conf: dict[str, str], letters: list[Letter], timeout_s: float) -> str | None:
    """Produce each letter's next attempt (acks=all, idempotent, in order) and set its
    outcome from Kafka's acknowledgement; returns a login or certificate refusal, if any."""
    producer = KafkaProducer({**conf, "acks": "all", "enable.idempotence": True,
                              "message.timeout.ms": int(timeout_s * 1000)})

    def delivered(letter: Letter) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            if err is None:
                letter.outcome = {"outcome": "replayed", "replayed_to": {
                    "topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()}}
            else:
                letter.outcome = {"outcome": "failed",
                                  "replay_error": str(delivery_error(err, topic=msg.topic()))}
        return report

    try:
        for letter in letters:
            if not _hand_over(producer, letter, delivered(letter), timeout_s):
                break  # librdkafka's queue stayed full: this one and the rest stay not-sent
            letter.outcome = {"outcome": "unacknowledged"}  # until Kafka answers
        producer.flush(timeout_s)
        refused = producer.refused()
        return None if refused is None else str(refused)
    finally:
        producer.close()


def _hand_over(producer: KafkaProducer, letter: Letter, on_delivery: Callable[[Any, Any], None],
               timeout_s: float) -> bool:
    """Hand the letter's next attempt to librdkafka, serving deliveries while its queue is
    full; False when it stayed full for ``timeout_s``."""
    target, partition = letter.target
    deadline = time.monotonic() + timeout_s
    while not producer.produce_pairs(target, letter.value, letter.key, letter.headers,
                                     on_delivery=on_delivery, partition=partition):
        if time.monotonic() > deadline:
            return False
        producer.poll(0.1)
    return True


def _table(title: str, rows: list[dict[str, Any]], scopes: tuple[str, ...], *,
           outcome: bool = False) -> Any:
    columns = ["partition", "offset", "dead-lettered at", "reason", "id", "attempt", "from",
               "error", *scopes, "outcome" if outcome else "replay"]
    lines = []
    for r in rows:
        source = r["source"]
        where = (f"{source['topic']}[{source['partition']}]@{source['offset']}"
                 if source["topic"] else None)
        error = r["error"] or ""
        error = error if len(error) <= ERROR_CHARS else error[:ERROR_CHARS - 1] + "…"
        last = r["outcome"] if outcome else "yes"
        if r["skip_reason"]:
            last = f"{'skipped' if outcome else 'no'}: {r['skip_reason']}"
        elif r.get("replay_error"):
            last = f"failed: {r['replay_error']}"
        lines.append([r["partition"], r["offset"], r["dead_lettered_at"], r["reason"], r["id"],
                      r["attempt"], where, escape(error), *(r["dedup"].get(s) for s in scopes),
                      escape(last)])
    return render.table(title, columns, lines)
