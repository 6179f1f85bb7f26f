"""Idempotent per-batch sinks: a retried or replayed micro-batch replaces, never appends twice.

:class:`ParquetBatchSink` writes micro-batch ``N`` to ``<path>/batch_id=N``: first into a
temporary directory under ``<path>/_eoguard_tmp`` (ignored by readers: it starts with ``_``),
with a commit marker naming the query, then renamed into place in one step. A directory is
committed iff its marker names this query (the id Spark keeps in the checkpoint), so a batch
directory left by an older query on the same path is replaced, not taken for ours.

:class:`BatchLedger` records in the checkpoint that every sink of batch ``N`` committed, so a
replay after a crash between the sinks' commit and Spark's own commit skips the sinks (a
user's ``foreach_batch`` hook included) instead of running them on a different row set.

:func:`resolve_reader` keeps in the checkpoint the reader this query's claim positions and
batch tokens name (``eoguard.store.dedup.position``, ``eoguard_spark.dedup.batch_token``), so a
driver restarted from the checkpoint re-owns the claims of the batch it replays, whatever name
it is started with.

File operations go through Hadoop's FileSystem of the path (local, HDFS, object stores).
The rename is atomic on local disks and HDFS; on object stores it is a copy, so a crash
mid-rename can leave a partial directory without its marker, which the next attempt replaces.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from eoguard.errors import ConfigError

__all__ = ["BatchLedger", "HadoopFs", "ParquetBatchSink", "PendingBatch", "default_reader",
           "query_id_of", "recorded_reader", "resolve_reader"]

log = logging.getLogger(__name__)

COMMIT_MARKER = "_EOGUARD_COMMITTED"
TMP_DIR = "_eoguard_tmp"
READER_FILE = "eoguard/reader"
UNIQUE_COLUMNS = ("id", "position")
"""Columns with a new value on nearly every row: Parquet's dictionary encoding of them hashes
every value, then falls back to plain encoding at the first page (the dictionary is no
smaller), so the sink writes them plain from the start: the same files, less CPU. (Where ids
do repeat, as in the dead letters of a resent message, the files differ and read the same.)"""


class HadoopFs:
    """The few Hadoop FileSystem calls the sinks need, through the driver's JVM."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        jvm: Any = spark._jvm  # Hadoop FileSystem has no Python API
        self._jvm = jvm
        self._path_cls = jvm.org.apache.hadoop.fs.Path
        conf = spark._jsc.hadoopConfiguration()
        self._fs = self._path_cls(path).getFileSystem(conf)
        self._local: bool | None = None  # on this machine's filesystem? (asked once, if ever)

    def local_path(self, path: str) -> str | None:
        """``path`` on this machine's filesystem; None on another filesystem (HDFS, S3...)."""
        if self._local is None:  # getUri(): every FileSystem has one (not every getScheme())
            self._local = str(self._fs.getUri().getScheme()) == "file"
        if not self._local:
            return None
        return str(self._fs.makeQualified(self._p(path)).toUri().getPath())

    def _p(self, path: str) -> Any:
        return self._path_cls(path)

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._p(path)))

    def delete(self, path: str) -> None:
        self._fs.delete(self._p(path), True)

    def rename(self, src: str, dst: str) -> bool:
        return bool(self._fs.rename(self._p(src), self._p(dst)))

    def mkdirs(self, path: str) -> None:
        self._fs.mkdirs(self._p(path))

    def write_text(self, path: str, text: str) -> None:
        out = self._fs.create(self._p(path), True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()

    def read_text(self, path: str) -> str | None:
        if not self._fs.exists(self._p(path)):
            return None
        stream = self._fs.open(self._p(path))
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def children(self, path: str) -> list[str]:
        if not self._fs.exists(self._p(path)):
            return []
        return [str(status.getPath().getName()) for status in self._fs.listStatus(self._p(path))]


def query_id_of(spark: SparkSession, checkpoint: str) -> str:
    """The query id Spark keeps in ``<checkpoint>/metadata`` (stable across restarts)."""
    text = HadoopFs(spark, checkpoint).read_text(f"{checkpoint.rstrip('/')}/metadata")
    if text is None:
        raise RuntimeError(f"no query metadata in checkpoint {checkpoint}; has the query started?")
    return str(json.loads(text.splitlines()[0])["id"])


def recorded_reader(spark: SparkSession, checkpoint: str) -> str | None:
    """The reader recorded in ``<checkpoint>/eoguard/reader``, or None before the first batch."""
    text = HadoopFs(spark, checkpoint).read_text(f"{checkpoint.rstrip('/')}/{READER_FILE}")
    if text is None or not text.strip():  # an empty file: a crash hit while writing it
        return None
    return text.strip()


def default_reader(query_id: str) -> str:
    """``spark-`` and the first 12 hex digits (48 random bits) of the query id: unique among
    a scope's readers, and short (it is in every claim's position, sent at claim time)."""
    return "spark-" + query_id.replace("-", "")[:12]


def resolve_reader(spark: SparkSession, checkpoint: str, configured: str | None) -> str:
    """The reader of this query's claims, recorded in the checkpoint at the first batch.

    Once recorded it is the query's reader for good: a replayed micro-batch must name the
    same positions and token to re-own its claims, so a ``configured`` reader that differs is
    refused. The
    default is ``spark-<query id>`` (the id Spark keeps in the checkpoint): unique per query,
    stable across driver restarts.
    """
    recorded = recorded_reader(spark, checkpoint)
    if recorded is not None:
        if configured is not None and configured != recorded:
            raise ConfigError(reader_mismatch(checkpoint, recorded, configured))
        return recorded
    reader = configured or default_reader(query_id_of(spark, checkpoint))
    HadoopFs(spark, checkpoint).write_text(f"{checkpoint.rstrip('/')}/{READER_FILE}", reader)
    return reader


def reader_mismatch(checkpoint: str, recorded: str, configured: str) -> str:
    return (f"reader {configured!r} differs from {recorded!r}, the reader recorded in "
            f"checkpoint {checkpoint}: a replayed micro-batch would not re-own its claims. "
            f"Keep reader={recorded!r} (or leave it unset) for this checkpoint.")


class PendingBatch:
    """The temporary directory of a batch being written (:meth:`ParquetBatchSink.batch`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.schema: StructType | None = None  # the first frame's (the others have its columns)

    @property
    def written(self) -> bool:
        return self.schema is not None

    def add(self, df: DataFrame) -> None:
        """Write ``df``'s rows into the batch, beside those of the frames added before."""
        plain = {f"parquet.enable.dictionary#{name}": "false"
                 for name in UNIQUE_COLUMNS if name in df.columns}
        df.write.options(**plain).mode("append" if self.written else "errorifexists") \
            .parquet(self.path)
        self.schema = self.schema or df.schema


class ParquetBatchSink:
    """Per-batch Parquet directories, committed by an atomic rename (see the module docstring)."""

    def __init__(self, spark: SparkSession, path: str, *, query_id: str) -> None:
        self.spark = spark
        self.path = path.rstrip("/")
        self.query_id = query_id
        self._fs = HadoopFs(spark, self.path)

    def batch_dir(self, batch_id: int) -> str:
        return f"{self.path}/batch_id={batch_id}"

    def local_dir(self, batch_id: int) -> str | None:
        """Batch ``batch_id``'s directory on this machine's filesystem, if the sink is on it."""
        return self._fs.local_path(self.batch_dir(batch_id))

    def committed(self, batch_id: int) -> bool:
        """Whether this query committed batch ``batch_id`` here."""
        marker = self._fs.read_text(f"{self.batch_dir(batch_id)}/{COMMIT_MARKER}")
        return marker is not None and marker.strip() == self.query_id

    def read(self, batch_id: int, schema: StructType | None = None) -> DataFrame:
        """The committed rows of batch ``batch_id``; with their ``schema`` when the caller
        knows it (it wrote them), so Spark need not read a file's footer to learn it."""
        reader = self.spark.read if schema is None else self.spark.read.schema(schema)
        return reader.parquet(self.batch_dir(batch_id))

    def write(self, df: DataFrame, batch_id: int) -> None:
        """Write batch ``batch_id`` and commit it; replaces a directory this query did not commit."""
        with self.batch(batch_id) as pending:
            pending.add(df)

    @contextmanager
    def batch(self, batch_id: int) -> Iterator[PendingBatch]:
        """Batch ``batch_id``'s files, committed when the block ends without an exception.

        Step 1. Each frame added is written into one fresh temporary directory (a failed
                attempt leaves only a temporary directory behind, never a visible batch).
        Step 2. Put the commit marker (this query's id) into it.
        Step 3. Remove a stale ``batch_id=N`` (another query's, or a partial copy), then rename
                the temporary directory into place: the commit point.
        Step 4. Remove temporary leftovers of earlier attempts of this batch.
        """
        final = self.batch_dir(batch_id)
        tmp_root = f"{self.path}/{TMP_DIR}"
        prefix = f"batch_id={batch_id}-"
        tmp = f"{tmp_root}/{prefix}{uuid.uuid4().hex}"
        pending = PendingBatch(tmp)
        yield pending  # Step 1.
        if not pending.written:
            raise ValueError(f"batch {batch_id}: no frame was added (an empty frame still is)")
        self._fs.write_text(f"{tmp}/{COMMIT_MARKER}", self.query_id)  # Step 2.
        if self._fs.exists(final):  # Step 3.
            log.warning("replacing %s: it was not committed by query %s", final, self.query_id)
            self._fs.delete(final)
        if not self._fs.rename(tmp, final):
            raise OSError(f"could not rename {tmp} to {final}")
        for name in self._fs.children(tmp_root):  # Step 4.
            if name.startswith(prefix):
                self._fs.delete(f"{tmp_root}/{name}")


class BatchLedger:
    """``<checkpoint>/eoguard/sunk/N``: every sink of batch N committed (see module docstring)."""

    def __init__(self, spark: SparkSession, checkpoint: str, *, keep: int = 200) -> None:
        self.root = f"{checkpoint.rstrip('/')}/eoguard/sunk"
        self.keep = keep
        self._fs = HadoopFs(spark, self.root)

    def has(self, batch_id: int) -> bool:
        return self._fs.exists(f"{self.root}/{batch_id}")

    def put(self, batch_id: int) -> None:
        self._fs.write_text(f"{self.root}/{batch_id}", "")
        old = batch_id - self.keep
        if old >= 0 and self._fs.exists(f"{self.root}/{old}"):
            self._fs.delete(f"{self.root}/{old}")
