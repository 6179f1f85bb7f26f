"""Resolve artifact sets from Maven Central with ``mvn dependency:copy-dependencies``.

Three sets: ``kafka`` (a KRaft broker and its runtime), ``spark`` (the Kafka connector and
spark-avro for the pinned pyspark, without what pyspark's own ``jars/`` already ships) and
``registry`` (Apicurio Registry's distribution, one tar.gz that eoguard.stack.schema_registry
unpacks). Each set is resolved once into the cache; a stamp with the POM's hash makes it
idempotent.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from eoguard.errors import StackError
from eoguard.stack.paths import cache_dir, maven_dir

# Spark's set is resolved without transitive dependencies: everything those need is in pyspark.
_EXCLUDE_TRANSITIVE = {"kafka": False, "spark": True, "registry": True}
_FILES = {"kafka": "*.jar", "spark": "*.jar", "registry": "*.tar.gz"}


def resolve(kind: str) -> list[Path]:
    """Return the files of set ``kind`` (jars; the registry's tar.gz), downloading them on
    first use."""
    if kind not in _EXCLUDE_TRANSITIVE:
        raise StackError(f"unknown jar set {kind!r}; expected one of {sorted(_EXCLUDE_TRANSITIVE)}")
    pom = maven_dir() / kind / "pom.xml"
    if not pom.is_file():
        raise StackError(f"missing {pom}; is this a complete eoguard checkout?")
    out = cache_dir() / "jars" / kind
    stamp = out / ".pom-sha256"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        return sorted(out.glob(_FILES[kind]))
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("Apache Maven (mvn) is needed to fetch the jars and the registry; "
                         "install it (apt-get install maven)")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log = out.parent / f"{kind}-resolve.log"
    cmd = [
        mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={out}",
        f"-DexcludeTransitive={str(_EXCLUDE_TRANSITIVE[kind]).lower()}",
    ]
    with log.open("w") as sink:
        done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, check=False, timeout=900)
    if done.returncode != 0:
        raise StackError(f"resolving the {kind} set failed (mvn exit {done.returncode}); see {log}")
    stamp.write_text(digest)
    return sorted(out.glob(_FILES[kind]))


def spark_jars() -> str:
    """The comma-separated list for ``spark.jars`` (never ``spark.jars.packages``)."""
    return ",".join(str(p) for p in resolve("spark"))
