"""Shared by every command: the CLI context, one-line errors and exit codes.

Exit codes:

    0  ok
    1  the operation failed: Redis unreachable, wrong auth, Redis refused, stack failure,
       a demo invariant broken
    2  bad input: unknown option, bad Redis URL, invalid prefix or argument
    3  not found: the message id or dedup key does not exist
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import update_wrapper
from typing import Any, TypeVar, cast

import click
import redis

from eoguard.codec.headers import parse_time
from eoguard.envelope import canonical_id
from eoguard.errors import EoguardError, InvalidInputError, StoreUnavailableError
from eoguard.redaction import redact_url
from eoguard.store.client import connect, security_reason
from eoguard.store.keys import DEFAULT_MAX_TTL_MS, DEFAULT_SHARDS, KeySpace
from eoguard.store.layout import recorded_layout

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """A user-facing failure: printed as one line, exit code :data:`EXIT_FAILED`."""

    exit_code = EXIT_FAILED


class BadInputError(CliError):
    """The user's input is invalid (bad URL, prefix, argument): exit code 2."""

    exit_code = EXIT_BAD_INPUT


class NotFoundError(CliError):
    """An id the user named does not exist in Redis: exit code 3."""

    exit_code = EXIT_NOT_FOUND


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def translate(exc: BaseException, redis_url: str) -> CliError:
    """Map a redis-py or eoguard error to a one-line :class:`CliError`."""
    where = redact_url(redis_url)
    if isinstance(exc, EoguardError) and isinstance(exc.__cause__, redis.RedisError):
        exc = exc.__cause__  # the store wrapped it: judge by what Redis said
    security = security_reason(exc)
    if security == "credentials":
        return CliError(f"Redis at {where} refused authentication: {_one_line(exc)}")
    if security == "certificate":
        return CliError(f"Redis at {where} has a TLS certificate this client does not trust "
                        f"(ssl_ca_certs): {_one_line(exc)}")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, StoreUnavailableError)):
        return CliError(f"Redis at {where} is unreachable: {_one_line(exc)}")
    if isinstance(exc, InvalidInputError):
        return BadInputError(_one_line(exc))
    if isinstance(exc, redis.RedisError):
        return CliError(f"Redis at {where} failed: {_one_line(exc)}")
    return CliError(_one_line(exc))


def default_redis_url() -> str:
    """The local stack's Redis (the stack itself honours ``EOGUARD_REDIS_URL`` too)."""
    from eoguard.stack import LocalStack  # noqa: PLC0415 - keep `eoguard --help` light

    return LocalStack().endpoints().redis_url


redis_url_option = click.option(
    "--redis-url", envvar="EOGUARD_REDIS_URL", default=None, show_envvar=True, metavar="URL",
    help="Redis holding the outbox and dedup keys [default: the local stack's, "
         "redis://127.0.0.1:16379/0].")
"""The groups' ``--redis-url`` (``eoguard`` and ``eoguard-dev``)."""


def message_ids(_ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Click callback: ids (one, or a tuple of them) as the store keys them (lowercase
    hyphenated UUIDs), from any UUID spelling; anything else is a one-line error."""
    texts = value if isinstance(value, tuple) else (value,)
    ids = []
    for text in texts:
        mid = canonical_id(text)
        if mid is None:
            raise BadInputError(f"invalid value for {param.human_readable_name}: {text!r} is "
                                "not a UUID")
        ids.append(mid)
    return tuple(ids) if isinstance(value, tuple) else ids[0]


@dataclass
class CliContext:
    """What every command needs: where Redis is, the key space, the output form."""

    redis_url: str
    prefix: str
    shards: int | None  # None: the prefix's recorded layout, read on connect
    as_json: bool
    max_ttl_ms: int = DEFAULT_MAX_TTL_MS  # the prefix's recorded layout's, read on connect
    redis_url_explicit: bool = False  # given on the command line (not the default)
    _client: redis.Redis | None = field(default=None, repr=False)

    @classmethod
    def start(cls, ctx: click.Context, redis_url: str | None, *, prefix: str,
              shards: int | None, as_json: bool) -> CliContext:
        """The context of a group's commands, from its global options (closed with it)."""
        obj = cls(redis_url=redis_url or default_redis_url(), prefix=prefix, shards=shards,
                  as_json=as_json, redis_url_explicit=redis_url is not None and
                  ctx.get_parameter_source("redis_url") is click.core.ParameterSource.COMMANDLINE)
        ctx.obj = obj
        ctx.call_on_close(obj.close)
        return obj

    @property
    def keys(self) -> KeySpace:
        return KeySpace(prefix=self.prefix, shards=self.shards or DEFAULT_SHARDS,
                        max_ttl_ms=self.max_ttl_ms)

    def client(self) -> redis.Redis:
        """A connected client (pinged once, so an unreachable Redis fails here, cleanly)."""
        if self._client is None:
            try:
                # A Redis Cluster answers the same commands (RedisCluster routes them by key,
                # SCAN goes to every master through eoguard.store.scan).
                client = cast("redis.Redis", connect(
                    self.redis_url, socket_connect_timeout=3.0, socket_timeout=30.0))
            except ValueError as exc:
                raise BadInputError(
                    # redis-py's message may quote part of the password: not shown.
                    f"bad Redis URL {redact_url(self.redis_url)!r} ({type(exc).__name__})") from None
            client.ping()
            layout = recorded_layout(client, self.prefix)
            recorded = layout.shards if layout is not None else None
            if layout is not None and layout.max_ttl_ms is not None:
                self.max_ttl_ms = layout.max_ttl_ms
            if self.shards is None:
                self.shards = recorded
            elif recorded is not None and recorded != self.shards:
                raise BadInputError(f"key prefix {self.prefix!r} is laid out in {recorded} shards, "
                                    f"not {self.shards}; drop --shards or pass --shards {recorded}")
            self._client = client
        return self._client

    def server_ms(self) -> int:
        """Redis's clock in epoch milliseconds: TTLs and leases are judged by it, not ours."""
        seconds, micros = self.client().time()
        return int(seconds) * 1000 + int(micros) // 1000

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


ERROR_TYPES = {EXIT_FAILED: "failed", EXIT_BAD_INPUT: "bad-input", EXIT_NOT_FOUND: "not-found"}
"""An error's ``type`` under ``--json``, by its exit code."""


def _asks_json(argv: Sequence[str]) -> bool:
    """Whether the command line has ``--json`` (before the group's or after the command)."""
    options = argv[:argv.index("--")] if "--" in argv else argv
    return "--json" in options


def json_error(exit_code: int, message: str, cause: BaseException | None = None) -> None:
    """An error as ``--json`` prints it: one object on one line of stderr (stdout keeps the
    data a command printed before it failed, if any)."""
    error: dict[str, Any] = {"type": ERROR_TYPES.get(exit_code, "failed"), "message": message,
                             "exit_code": exit_code}
    if cause is not None:
        error["cause"] = type(cause).__name__
    click.echo(json.dumps({"error": error}), err=True)


class EoguardGroup(click.Group):
    """A click group that turns eoguard and redis-py errors into one-line exits: a line of
    text, or with ``--json`` a JSON object (:func:`json_error`)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        """click's ``main``; with ``--json`` on the command line, its errors as
        :func:`json_error` prints them."""
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode or not _asks_json(argv):
            return super().main(argv, prog_name, complete_var, standalone_mode,
                                windows_expand_args=windows_expand_args, **extra)
        try:
            result = super().main(argv, prog_name, complete_var, False,
                                  windows_expand_args=windows_expand_args, **extra)
        except click.ClickException as exc:
            json_error(exc.exit_code, exc.format_message(), exc.__cause__)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            json_error(EXIT_FAILED, "aborted")
            sys.exit(EXIT_FAILED)
        sys.exit(result if isinstance(result, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except (EoguardError, redis.RedisError) as exc:
            obj = ctx.find_object(CliContext)
            raise translate(exc, obj.redis_url if obj else "?") from exc


def _context_of(ctx: click.Context) -> CliContext:
    obj = ctx.find_object(CliContext)
    if obj is None:  # a command invoked without the group (a programming error, not a user's)
        raise RuntimeError("eoguard command invoked outside the eoguard group")
    return obj


def pass_cli(f: F) -> F:
    """Decorator: pass the :class:`CliContext` as the first argument."""

    @click.pass_context
    def wrapper(ctx: click.Context, *args: Any, **kwargs: Any) -> Any:
        return ctx.invoke(f, _context_of(ctx), *args, **kwargs)

    return cast("F", update_wrapper(wrapper, f))


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _context_of(ctx).as_json = True


def json_option(f: F) -> F:
    """``--json`` on a subcommand too (``eoguard status --json`` = ``eoguard --json status``)."""
    return click.option("--json", "as_json_local", is_flag=True, expose_value=False,
                        callback=_set_json, help="Print JSON for scripts instead of tables.")(f)


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration like ``90``, ``850ms``, ``30s``, ``5m``, ``2h``, ``1d``; converts to milliseconds."""

    name = "duration"
    _UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(value))
        if not match:
            self.fail(f"{value!r} is not a duration (e.g. 30s, 5m, 2h, 1d)", param, ctx)
        return int(float(match.group(1)) * self._UNITS[match.group(2) or "s"])


DURATION = Duration()


class Moment(click.ParamType):  # type: ignore[type-arg]
    """A point in time: RFC 3339 (``2026-11-28T14:00:00Z``, any offset) or a duration ago
    (``90m``: 90 minutes before now, by this machine's clock); converts to epoch ms."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_time(str(value).strip())
        except ValueError:
            pass
        try:
            return int(time.time() * 1000) - DURATION.convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is neither an RFC 3339 time (2026-11-28T14:00:00Z) nor a "
                      "duration ago (90m, 2h, 1d)", param, ctx)


MOMENT = Moment()
