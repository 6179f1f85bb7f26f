"""``eoguard-dev demo``: the end-to-end demo (eoguard.demo) with a live progress display."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import click
from rich.progress import TaskID

from eoguard.cli import render
from eoguard.cli.context import DURATION, CliContext, CliError, json_option, pass_cli
from eoguard.demo import DemoOptions, run_demo, spark_available
from eoguard.demo.report import render as render_report
from eoguard.stack import LocalStack
from eoguard.stack.local import TOPOLOGIES

_TASKS = {"guaranteed": "producers: guaranteed", "handled": "scope 'orders': handled",
          "spark": "Spark job (scope 'orders-spark')"}


@click.command()
@click.option("--messages", "-n", default=10_000, show_default=True, type=click.IntRange(200),
              help="Orders to send.")
@click.option("--spark/--no-spark", default=None,
              help="Also run the Spark job in a second scope [default: on when pyspark is installed].")
@click.option("--rate", default=None, type=click.FloatRange(100),
              help="Sends per second [default: N / 3 s, so the crashes land mid-way].")
@click.option("--ttl", "ttl_ms", type=DURATION, default="10m", show_default=True,
              help="TTL of the orders.")
@click.option("--timeout", "timeout_ms", type=DURATION, default="100s", show_default=True,
              help="Give up waiting after this long; what is missing then counts as lost.")
@click.option("--topology", type=click.Choice(TOPOLOGIES), default=None,
              help="The local stack to run on: single, or cluster (three Kafka nodes, a Redis "
                   "Cluster with replicas) [default: EOGUARD_TOPOLOGY or single].")
@json_option
@pass_cli
def demo(cli: CliContext, *, messages: int, spark: bool | None, rate: float | None, ttl_ms: int,
         timeout_ms: int, topology: str | None) -> None:
    """Show the guarantee end to end on the local stack, crashes included (< 2 minutes).

    \b
    1. Starts Kafka and Redis if they are not running.
    2. A producer process sends N orders (persist-first outbox, TTL) and is SIGKILLed
       mid-way; a new one (delayed mode) sends the rest and recovers what the first left
       in the outbox.
       Some orders are produced twice on purpose (the same envelope), some are written
       with a TTL that already passed, and malformed records go straight to the topic.
    3. A consumer scope handles them with a Redis-transactional handler and is SIGKILLed and
       restarted mid-way; the Spark job handles the same topic in a second scope.
    4. Reports what happened and checks: nothing lost, nothing handled twice, no expired
       message handled, every malformed record dead-lettered. Exit code 1 if any broke.

    Each run uses its own topic and Redis key prefix (printed), so `eoguard --prefix
    demo-<run> status` shows what it left behind; everything expires with the TTL.
    """
    with _redis_env(cli, topology):
        _run(cli, messages=messages, spark=spark, rate=rate, ttl_ms=ttl_ms, timeout_ms=timeout_ms,
             topology=topology)


@contextlib.contextmanager
def _redis_env(cli: CliContext, topology: str | None) -> Iterator[None]:
    """An explicit --redis-url reaches the stack (which then starts no Redis) and the workers:
    through the topology's own variable (EOGUARD_REDIS_URL or EOGUARD_CLUSTER_REDIS_URL)."""
    name = f"{LocalStack(topology=topology).env}REDIS_URL"
    old = os.environ.get(name)
    if cli.redis_url_explicit:
        os.environ[name] = cli.redis_url
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _run(cli: CliContext, *, messages: int, spark: bool | None, rate: float | None, ttl_ms: int,
         timeout_ms: int, topology: str | None) -> None:
    use_spark = spark_available()[0] if spark is None else spark
    options = DemoOptions(messages=messages, spark=use_spark, rate=rate, ttl_s=ttl_ms / 1000,
                          timeout_s=timeout_ms / 1000, topology=topology)
    err = render.err_console()
    started = time.monotonic()

    def event(text: str) -> None:
        err.print(f"[dim]{time.monotonic() - started:6.1f}s[/] {text}")

    with render.progress(cli) as progress:
        tasks: dict[str, TaskID] = {}

        def update(task: str, done: int, total: int | None) -> None:
            if task not in tasks:
                tasks[task] = progress.add_task(_TASKS.get(task, task), total=total)
            progress.update(tasks[task], completed=done, total=total)

        event(f"eoguard demo {options.run_id}: {messages:,} orders, Spark "
              f"{'on' if use_spark else 'off'}")
        report = run_demo(options, progress=update, event=lambda t: progress.console.print(
            f"[dim]{time.monotonic() - started:6.1f}s[/] {t}") if progress.live.is_started else event(t))
    data: dict[str, Any] = report.as_dict()
    render.show(cli, data, *render_report(report))
    if not report.ok:
        raise CliError(f"demo invariant broken: {report.failures[0]}")
    if not cli.as_json:
        err.print(f"inspect what it left: eoguard --prefix {report.prefix} status")
