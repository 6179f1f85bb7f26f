"""The end-to-end demo (``eoguard-dev demo``): crashes, duplicates, expiry and poison, checked."""

from eoguard.demo.plan import DemoOptions, spark_available
from eoguard.demo.report import DemoReport, ScopeResult
from eoguard.demo.run import run_demo

__all__ = ["DemoOptions", "DemoReport", "ScopeResult", "run_demo", "spark_available"]
