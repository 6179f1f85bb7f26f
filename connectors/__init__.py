"""Connectors that join engines to eoguard's delivery guarantees (they import eoguard, never
the other way round). ``connectors.spark``: the Spark Structured Streaming job."""
