"""User errors end in one line on stderr and a non-zero exit code, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from eoguard.cli import cli

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
