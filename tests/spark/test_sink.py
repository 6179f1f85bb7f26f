"""The per-batch Parquet sink's files, read back with pyarrow (local Spark, no Kafka)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from eoguard_spark.sink import UNIQUE_COLUMNS, ParquetBatchSink

pytestmark = [pytest.mark.spark]


def test_unique_columns_are_written_without_a_dictionary(spark: SparkSession, tmp_path: Path
                                                         ) -> None:
    """``id`` and ``position`` skip the dictionary encoding, other columns keep it, and every
    row reads back. Here all three columns repeat ten values, so Parquet would give each a
    dictionary (with unique values it drops it at the first page: same files, more CPU)."""
    rows = [(f"id-{i % 10}", f"5:spark|3:top|0|{i % 10}", f"top-{i % 10}") for i in range(5000)]
    df = spark.createDataFrame(rows, "id string, position string, topic string").coalesce(1)
    sink = ParquetBatchSink(spark, str(tmp_path), query_id="q")
    sink.write(df, 7)

    files = sorted((tmp_path / "batch_id=7").glob("*.parquet"))
    assert len(files) == 1
    meta = pq.ParquetFile(files[0]).metadata
    columns = {meta.row_group(0).column(c).path_in_schema: meta.row_group(0).column(c)
               for c in range(meta.num_columns)}
    assert set(UNIQUE_COLUMNS) <= set(columns)
    for name in UNIQUE_COLUMNS:
        assert not columns[name].has_dictionary_page, name
    assert columns["topic"].has_dictionary_page
    back = pq.read_table(files[0])
    assert back.num_rows == 5000
    assert sorted(back.column("id").to_pylist()) == sorted(r[0] for r in rows)


@pytest.mark.parametrize("name", ["plain", "with space", "per%cent"])
def test_a_local_sink_names_its_batch_directories_on_this_machine(
        spark: SparkSession, tmp_path: Path, name: str) -> None:
    """``local_dir`` is the directory the driver's pass reads: the very one Spark wrote its files
    to, for a path or a ``file:`` URI, whatever characters the name holds (Hadoop takes a
    URI's ``%`` escapes literally, and so does ``local_dir``)."""
    root = tmp_path / name
    for given in (str(root), f"file://{root}"):
        sink = ParquetBatchSink(spark, given, query_id="q")
        sink.write(spark.createDataFrame([("a",)], "id string"), 3)
        local = sink.local_dir(3)
        print(f"{given!r} -> {local!r}")
        assert local == str(root / "batch_id=3")
        assert Path(local, "_EOGUARD_COMMITTED").is_file()
        assert [i for f in Path(local).glob("*.parquet")
                for i in pq.read_table(f).column("id").to_pylist()] == ["a"]
