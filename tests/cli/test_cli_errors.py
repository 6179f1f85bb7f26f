"""User errors end in one line on stderr and a non-zero exit code, never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from eoguard.cli import cli
from eoguard.cli.dev import dev

pytestmark = pytest.mark.integration


def one_line_error(result) -> str:
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("args", [
    ["status"], ["outbox", "list"],
    ["dedup", "check", "01900000-0000-7000-8000-000000000000", "--scope", "s"]])
def test_unreachable_redis(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["--redis-url", "redis://127.0.0.1:1/0", *args])
    line = one_line_error(result)
    assert result.exit_code == 1
    assert "unreachable" in line
    assert "127.0.0.1:1" in line


def test_bad_url() -> None:
    result = CliRunner().invoke(cli, ["--redis-url", "http://nowhere:80", "status"])
    line = one_line_error(result)
    assert result.exit_code == 2
    assert "bad Redis URL" in line


def test_wrong_password_is_reported_and_redacted(redis_url: str) -> None:
    url = redis_url.replace("redis://", "redis://someone:s3cret@")
    result = CliRunner().invoke(cli, ["--redis-url", url, "status"])
    line = one_line_error(result)
    assert result.exit_code == 1
    assert "authentication" in line
    assert "s3cret" not in result.output


def test_bad_prefix(redis_url: str) -> None:
    result = CliRunner().invoke(cli, ["--redis-url", redis_url, "--prefix", "a:b", "status"])
    line = one_line_error(result)
    assert result.exit_code == 2
    assert "--prefix" in line


def test_env_vars_are_read(redis_url: str, key_prefix: str, as_json) -> None:
    result = CliRunner(env={"EOGUARD_REDIS_URL": redis_url, "EOGUARD_PREFIX": key_prefix}).invoke(
        cli, ["--json", "status"])
    data = as_json(result)
    assert data["prefix"] == key_prefix
    assert data["outbox"]["records"] == 0


@pytest.mark.parametrize("args", [["dedup", "check", "order-17", "--scope", "s"],
                                  ["outbox", "show", ""], ["outbox", "resend", "x" * 100]])
def test_an_id_that_is_not_a_uuid(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["--redis-url", "redis://127.0.0.1:1/0", *args])
    line = one_line_error(result)
    assert result.exit_code == 2
    assert "is not a UUID" in line


def json_error(result) -> dict:
    """The one JSON error object ``--json`` prints on stderr (nothing on stdout)."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    error = json.loads(line)["error"]
    assert error["exit_code"] == result.exit_code
    return error


@pytest.mark.parametrize(("args", "kind", "code", "words"), [
    (["status"], "failed", 1, "unreachable"),
    (["outbox", "list", "--json"], "failed", 1, "unreachable"),
    (["dedup", "check", "order-17", "--scope", "s"], "bad-input", 2, "not a UUID"),
    (["outbox", "resend"], "bad-input", 2, "--stuck"),
    (["outbox", "purge", "--dry-run"], "bad-input", 2, "--expired"),
    (["status", "--no-such-flag"], "bad-input", 2, "--no-such-flag"),
    (["nonsense"], "bad-input", 2, "nonsense"),
    (["stack", "status"], "bad-input", 2, "stack"),  # eoguard-dev's, not eoguard's
    (["browse", "t", "-b", "127.0.0.1:1", "--timeout", "1"], "failed", 1, "Kafka"),
    (["dlq", "list", "t", "-F", "/nonexistent/client.properties"], "bad-input", 2, "-F"),
    (["dlq", "replay", "t", "--all", "-X", "no-equals-sign"], "bad-input", 2, "-X"),
])
def test_errors_under_json_are_json(args: list[str], kind: str, code: int, words: str) -> None:
    where = ["--redis-url", "redis://127.0.0.1:1/0"]
    json_first = [*where, "--json", *args] if "--json" not in args else [*where, *args]
    error = json_error(CliRunner().invoke(cli, json_first))
    assert (error["type"], error["exit_code"]) == (kind, code), error
    assert words in error["message"]


def test_a_cause_is_named(redis_url: str) -> None:
    url = redis_url.replace("redis://", "redis://someone:s3cret@")
    error = json_error(CliRunner().invoke(cli, ["--redis-url", url, "--json", "status"]))
    assert error["type"] == "failed"
    assert error["cause"]
    assert "s3cret" not in error["message"]


def test_eoguard_dev_answers_json_too() -> None:
    result = CliRunner().invoke(dev, ["--json", "demo", "--messages", "5"])
    error = json_error(result)
    assert (error["type"], error["exit_code"]) == ("bad-input", 2)
    assert "--messages" in error["message"]
