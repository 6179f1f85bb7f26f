"""Prometheus metrics: the producer's and the consumer's ``stats()``, and the outbox's age.

Optional: ``pip install 'eoguard[metrics]'`` (prometheus-client). Nothing here imports
prometheus_client until a collector is registered, so eoguard runs without it.

    from eoguard.metrics import register_producer, register_consumer, register_outbox
    register_producer(producer)            # reads producer.stats() at every scrape
    register_consumer(consumer)            # reads consumer.stats() at every scrape
    register_outbox(redis_client, keys)    # 2 pipelined round trips per scrape, no SCAN
    prometheus_client.start_http_server(9108)

Collectors read the live objects when Prometheus scrapes: no thread, no second copy of the
counters. Units follow Prometheus conventions: counters end in ``_total``, times are in
seconds, sizes in bytes. Every metric of one producer carries ``instance``; of one consumer
``scope`` and ``instance``.

Producer (``GuardedProducer.stats()``):

    eoguard_producer_sent_total                 counter  messages accepted by send()
    eoguard_producer_guaranteed_total           counter  on_guaranteed fired (in the outbox or acked by Kafka)
    eoguard_producer_failed_total               counter  on_failed fired
    eoguard_producer_persisted_total            counter  outbox records written to Redis
    eoguard_producer_published_total            counter  Kafka acknowledgements (acks=all), resends included
    eoguard_producer_resent_total               counter  records resent by recovery
    eoguard_producer_expired_total              counter  messages expired before guaranteed or resent
    eoguard_producer_delivery_failures_total    counter  failed Kafka delivery reports
    eoguard_producer_redis_writes_avoided_total counter  delayed mode: acked by Kafka within the delay
    eoguard_producer_already_in_outbox_total    counter  sends of an id already in the outbox
    eoguard_producer_delay_seconds              gauge    current adaptive persistence delay
    eoguard_producer_queue_messages             gauge    messages held in memory
    eoguard_producer_queue_bytes                gauge    bytes held in memory
    eoguard_producer_ack_latency_seconds        gauge    Kafka ack latency, label quantile="0.5"|"0.99"
    eoguard_producer_live_producers             gauge    producers holding a liveness lease
    eoguard_producer_store_available            gauge    1 when Redis answered the last call, else 0

Consumer (``GuardedConsumer.stats()``):

    eoguard_consumer_polled_total               counter  records consumed from Kafka
    eoguard_consumer_handled_total              counter  messages handled and marked done
    eoguard_consumer_duplicates_dropped_total   counter  duplicates skipped (already done in the scope)
    eoguard_consumer_redelivered_total          counter  records read again after their own done mark
    eoguard_consumer_fenced_total               counter  done marks refused: another owner finished first
    eoguard_consumer_expired_total              counter  messages dropped as expired
    eoguard_consumer_dead_lettered_total        counter  records routed to the dead-letter topic
    eoguard_consumer_retries_total              counter  handler attempts retried
    eoguard_consumer_busy_waits_total           counter  waits on a claim another owner held
    eoguard_consumer_busy_skipped_total         counter  messages skipped after busy_wait_s
    eoguard_consumer_claim_round_trips_total    counter  Redis round trips for claims
    eoguard_consumer_redis_wait_seconds_total   counter  time the poll loop waited on Redis replies
    eoguard_consumer_store_outages_total        counter  batches rewound because Redis or Kafka failed
    eoguard_consumer_commits_total              counter  offset commits
    eoguard_consumer_partial_effects_total      counter  effects failed midway: done, dead-lettered
    eoguard_consumer_lease_renewals_total       counter  renewal passes over the batches held
    eoguard_consumer_in_flight                  gauge    messages claimed and not yet done

Outbox (Redis, per key prefix, label ``prefix``):

    eoguard_outbox_pending                      gauge    pending records (in the resend index)
    eoguard_outbox_past_resend_time             gauge    pending records past their resend time
    eoguard_outbox_oldest_pending_age_seconds   gauge    age of the oldest pending record at the
                                                         head of a shard's index (0 when none)

Alerts that follow: ``eoguard_outbox_oldest_pending_age_seconds`` growing, or
``eoguard_outbox_past_resend_time > 0`` for minutes (nobody recovers: no producer running);
``rate(eoguard_consumer_dead_lettered_total[5m]) > 0``; ``rate(..._expired_total[5m])``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any, Protocol

from eoguard.errors import ConfigError

if TYPE_CHECKING:
    from eoguard.store.client import RedisClient
    from eoguard.store.keys import KeySpace

__all__ = [
    "CONSUMER_METRICS",
    "PRODUCER_METRICS",
    "register_consumer",
    "register_outbox",
    "register_producer",
]

# stats() field -> (metric name, kind, factor to base unit, help)
PRODUCER_METRICS: dict[str, tuple[str, str, float, str]] = {
    "sent": ("eoguard_producer_sent", "counter", 1, "Messages accepted by send()."),
    "guaranteed": ("eoguard_producer_guaranteed", "counter", 1, "Messages whose on_guaranteed fired."),
    "failed": ("eoguard_producer_failed", "counter", 1, "Messages whose on_failed fired."),
    "persisted": ("eoguard_producer_persisted", "counter", 1, "Outbox records written to Redis."),
    "published": ("eoguard_producer_published", "counter", 1, "Kafka acknowledgements, resends included."),
    "resent": ("eoguard_producer_resent", "counter", 1, "Outbox records resent by recovery."),
    "expired": ("eoguard_producer_expired", "counter", 1, "Messages expired before guaranteed or resent."),
    "delivery_failures": ("eoguard_producer_delivery_failures", "counter", 1,
                          "Failed Kafka delivery reports."),
    "redis_writes_avoided": ("eoguard_producer_redis_writes_avoided", "counter", 1,
                             "Delayed mode: messages acked by Kafka within the delay, never written."),
    "already_in_outbox": ("eoguard_producer_already_in_outbox", "counter", 1,
                          "Sends of a caller's id already in the outbox: not stored again."),
    "current_delay_ms": ("eoguard_producer_delay_seconds", "gauge", 1e-3,
                         "Current adaptive persistence delay."),
    "queue_depth": ("eoguard_producer_queue_messages", "gauge", 1, "Messages held in memory."),
    "queue_bytes": ("eoguard_producer_queue_bytes", "gauge", 1, "Bytes held in memory."),
    "live_producers": ("eoguard_producer_live_producers", "gauge", 1,
                       "Producers holding a liveness lease."),
    "store_available": ("eoguard_producer_store_available", "gauge", 1,
                        "1 when Redis answered the last call, else 0."),
}
_ACK_LATENCY = {"ack_latency_p50_ms": "0.5", "ack_latency_p99_ms": "0.99"}

CONSUMER_METRICS: dict[str, tuple[str, str, float, str]] = {
    "polled": ("eoguard_consumer_polled", "counter", 1, "Records consumed from Kafka."),
    "handled": ("eoguard_consumer_handled", "counter", 1, "Messages handled and marked done."),
    "duplicates": ("eoguard_consumer_duplicates_dropped", "counter", 1,
                   "Duplicates skipped: already done in the scope."),
    "redelivered": ("eoguard_consumer_redelivered", "counter", 1,
                    "Records read again after their own done mark (a commit or reply lost)."),
    "fenced": ("eoguard_consumer_fenced", "counter", 1, "Done marks refused: another owner finished."),
    "expired": ("eoguard_consumer_expired", "counter", 1, "Messages dropped as expired."),
    "dead_lettered": ("eoguard_consumer_dead_lettered", "counter", 1,
                      "Records routed to the dead-letter topic."),
    "retries": ("eoguard_consumer_retries", "counter", 1, "Handler attempts retried."),
    "busy_waits": ("eoguard_consumer_busy_waits", "counter", 1, "Waits on a claim another owner held."),
    "busy_skipped": ("eoguard_consumer_busy_skipped", "counter", 1, "Messages skipped after busy_wait_s."),
    "claim_round_trips": ("eoguard_consumer_claim_round_trips", "counter", 1,
                          "Redis round trips for claims."),
    "redis_wait_s": ("eoguard_consumer_redis_wait_seconds", "counter", 1,
                     "Seconds the poll loop waited on Redis replies (Redis as the bound)."),
    "store_outages": ("eoguard_consumer_store_outages", "counter", 1,
                      "Batches rewound because Redis or Kafka failed."),
    "commits": ("eoguard_consumer_commits", "counter", 1, "Offset commits."),
    "partial_effects": ("eoguard_consumer_partial_effects", "counter", 1,
                        "Redis effects failed midway: marked done, dead-lettered, to repair."),
    "lease_renewals": ("eoguard_consumer_lease_renewals", "counter", 1,
                       "Renewal passes over the batches held (one write per batch and shard)."),
    "in_flight": ("eoguard_consumer_in_flight", "gauge", 1, "Messages claimed and not yet done."),
}


class HasStats(Protocol):
    def stats(self) -> Any: ...


def _prometheus() -> Any:
    try:
        import prometheus_client  # noqa: PLC0415 - optional extra, imported on first use
        import prometheus_client.core  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError("Prometheus export needs prometheus-client: "
                          "pip install 'eoguard[metrics]'") from exc
    return prometheus_client


def _as_dict(stats: Any) -> dict[str, Any]:
    if is_dataclass(stats) and not isinstance(stats, type):
        return asdict(stats)
    return dict(stats)


def _families(table: dict[str, tuple[str, str, float, str]], stats: dict[str, Any],
              labels: dict[str, str]) -> Iterator[Any]:
    core = _prometheus().core
    names, values = list(labels), list(labels.values())
    for field_name, (name, kind, factor, doc) in table.items():
        value = stats.get(field_name)
        if value is None:
            continue
        family = (core.CounterMetricFamily if kind == "counter" else core.GaugeMetricFamily)(
            name, doc, labels=names)
        family.add_metric(values, float(value) * factor)
        yield family


class _StatsCollector:
    """A custom collector: reads ``stats()`` at scrape time."""

    def __init__(self, read: Callable[[], Iterator[Any]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        yield from self._read()

    def describe(self) -> list[Any]:
        return []  # unchecked collector: names are documented above, values read at scrape


def register_producer(producer: HasStats, *, instance: str | None = None, registry: Any = None) -> Any:
    """Export ``producer.stats()``; returns the collector (``registry.unregister`` removes it)."""
    prom = _prometheus()
    label = instance or str(getattr(producer, "instance_id", "producer"))

    def read() -> Iterator[Any]:
        stats = _as_dict(producer.stats())
        yield from _families(PRODUCER_METRICS, stats, {"instance": label})
        family = prom.core.GaugeMetricFamily("eoguard_producer_ack_latency_seconds",
                                             "Kafka ack latency quantiles (acks=all).",
                                             labels=["instance", "quantile"])
        for field_name, quantile in _ACK_LATENCY.items():
            if stats.get(field_name) is not None:
                family.add_metric([label, quantile], float(stats[field_name]) / 1000)
        yield family

    collector = _StatsCollector(read)
    (registry or prom.REGISTRY).register(collector)
    return collector


def register_consumer(consumer: HasStats, *, scope: str | None = None, instance: str | None = None,
                      registry: Any = None) -> Any:
    """Export ``consumer.stats()``; returns the collector."""
    prom = _prometheus()
    config = getattr(consumer, "config", None)
    labels = {"scope": scope or str(getattr(config, "scope", "")),
              "instance": instance or str(getattr(consumer, "instance_id", "consumer"))}

    def read() -> Iterator[Any]:
        yield from _families(CONSUMER_METRICS, _as_dict(consumer.stats()), labels)

    collector = _StatsCollector(read)
    (registry or prom.REGISTRY).register(collector)
    return collector


def register_outbox(client: RedisClient, keys: KeySpace, *, registry: Any = None) -> Any:
    """Export the outbox's pending count, past-resend count and oldest pending age."""
    prom = _prometheus()
    from eoguard.store.outbox_admin import index_stats  # noqa: PLC0415 - keep imports light

    def read() -> Iterator[Any]:
        stats = index_stats(client, keys)
        gauge = prom.core.GaugeMetricFamily
        for name, doc, value in (
            ("eoguard_outbox_pending", "Pending outbox records (resend index).", stats.pending),
            ("eoguard_outbox_past_resend_time", "Pending records past their resend time.",
             stats.past_resend),
            ("eoguard_outbox_oldest_pending_age_seconds",
             "Age of the oldest pending record at the head of a shard index.",
             stats.oldest_pending_age_ms / 1000),
        ):
            family = gauge(name, doc, labels=["prefix"])
            family.add_metric([keys.prefix], float(value))
            yield family

    collector = _StatsCollector(read)
    (registry or prom.REGISTRY).register(collector)
    return collector
