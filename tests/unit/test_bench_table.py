"""``python -m bench``'s final table fits a terminal of 100 columns and loses no figure."""

from __future__ import annotations

import pytest

from bench.table import WIDTH, Row, render

INFO = {"cores": 2, "cpu": "AMD EPYC 7B13 64-Core Processor", "python": "3.11.9",
        "eoguard": "0.9.0", "confluent-kafka": "2.6.1", "librdkafka": "2.6.1",
        "fastavro": "1.9.7", "redis-py": "5.2.1", "uuid-utils": "0.10.0", "pyspark": "4.2.0",
        "redis-server": "Redis server v=7.0.15"}
CALLBACK = "baseline, callback"
PLAIN_LOOP = "(a) plain consumer + plain fastavro decode"
ROWS = [
    Row("producer", "baseline, fire-and-forget", [61_234.0, 63_001.0, 62_500.0],
        cpu_us=11.2, note="200000 x 200 B"),
    Row("producer", CALLBACK, [40_100.0, 41_900.0, 41_000.0], cpu_us=17.9,
        guaranteed_ms=(4.2, 18.7), note="200000 x 200 B"),
    Row("producer", "persist-first", [28_000.0, 29_500.0, 29_100.0], baseline=CALLBACK,
        cpu_us=24.6, redis_cpu_us=6.3, redis_writes=1.0, guaranteed_ms=(6.1, 31.4),
        note="200000 x 200 B"),
    Row("producer", "delayed", [42_000.0, 43_100.0, 44_900.0], baseline=CALLBACK, cpu_us=19.1,
        redis_cpu_us=0.4, redis_writes=0.031, guaranteed_ms=(12.5, 210.3),
        note="200000 x 200 B"),
    Row("consumer", PLAIN_LOOP, [101_000.0, 98_000.0, 103_500.0], note="1000000 msgs, batch 1000"),
    Row("consumer", "(a') plain consumer + eoguard's codec", [97_000.0, 95_400.0, 99_000.0],
        baseline=PLAIN_LOOP, note="1000000 msgs, batch 1000"),
    Row("consumer", "(b) GuardedConsumer, no-op handler", [80_100.0, 79_000.0, 82_000.0],
        baseline=PLAIN_LOOP, note="1000000 msgs, batch 1000"),
    Row("consumer", "latency eoguard @ 50/s", [], e2e_ms=(3.1, 9.8),
        note="fetch.wait.max.ms 10"),
    Row("latency", "eoguard-delayed @ 20% (12,345/s)", [], e2e_ms=(5.4, 180.2),
        note="median of 3 rounds"),
    Row("spark", "plain", [41_000.0, 40_200.0, 42_300.0], note="204000 x 300 B, 50000 per batch"),
    Row("spark", "watermark", [26_000.0, 25_100.0, 27_900.0], baseline="plain",
        note="204000 x 300 B, 50000 per batch"),
]


def test_every_line_fits_in_100_columns_and_every_figure_is_shown(capsys) -> None:
    render(ROWS, INFO)
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert WIDTH == 100
    too_long = [line for line in lines if len(line) > 100]
    assert too_long == []
    for row in ROWS:  # each path whole on one line, not cut or folded
        assert any(row.path in line for line in lines), row.path
    for figure in ("61,234", "62,500", "0.71x", "1.000", "0.031", "6.1 / 31.4", "12.5 / 210.3",
                   "5.4 / 180.2", "0.96x", "0.79x", "0.63x", "v=7.0.15"):
        assert figure in text, figure
    assert f"x base: over {CALLBACK}" in text
    assert "204000 x 300 B, 50000 per batch" in text


@pytest.mark.parametrize("rows", [ROWS[:1], [r for r in ROWS if not r.rates]])
def test_a_run_of_one_kind_of_figure_still_fits(rows: list[Row], capsys) -> None:
    render(rows, INFO)
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 100
