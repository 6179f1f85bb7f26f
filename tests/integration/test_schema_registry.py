"""The stack's Schema Registry (Apicurio Registry): loopback only, BACKWARD by default, schemas
kept across a crash, and read and written by confluent-kafka's own Avro serializers."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from eoguard.stack import LocalStack
from eoguard.stack.schema_registry import COMPATIBILITY, SchemaRegistry
from tests.conftest import free_port

pytestmark = pytest.mark.integration

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "eoguard.example", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "amount_cents", "type": "long"}]}
# BACKWARD: v1 data is readable with v2 (the new field has a default).
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                   {"name": "currency", "type": "string", "default": "EUR"}]}
# Not BACKWARD: v1 data has no "customer" and v3 gives it no default.
ORDER_V3 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "customer", "type": "string"}]}


@pytest.fixture
def private_registry(tmp_path: Path) -> Iterator[SchemaRegistry]:
    """A Schema Registry of this test alone, which the test may SIGKILL and restart."""
    registry = SchemaRegistry(tmp_path / "registry", port=_free_pair())
    registry.start()
    yield registry
    registry.stop()


def _free_pair() -> int:
    """A port P with P + 1 free as well (the registry's management interface)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of loopback ports")


def _listening(pid: int) -> set[tuple[str, int]]:
    """Every TCP address the process ``pid`` listens on, read from /proc (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            host_hex, port_hex = local.split(":")
            found.add((_address(host_hex), int(port_hex, 16)))
    return found


def _address(host_hex: str) -> str:
    """/proc/net/tcp{,6} spell addresses as little-endian 32-bit words in hex."""
    raw = b"".join(bytes.fromhex(host_hex[i:i + 8])[::-1] for i in range(0, len(host_hex), 8))
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.load(reply)


def test_the_registry_listens_on_loopback_only(private_registry: SchemaRegistry) -> None:
    pid = private_registry.pid()
    assert pid is not None
    port = private_registry.port
    # The API and the management interface, both moved off 0.0.0.0, and nothing else.
    assert _listening(pid) == {("127.0.0.1", port), ("127.0.0.1", port + 1)}
    health = _get(f"http://127.0.0.1:{port + 1}/health/ready")
    assert isinstance(health, dict)
    assert health["status"] == "UP"


def test_global_compatibility_is_backward(private_registry: SchemaRegistry) -> None:
    with SchemaRegistryClient({"url": private_registry.address}) as client:
        _check_backward(client)


def _check_backward(client: SchemaRegistryClient) -> None:
    assert client.get_compatibility() == COMPATIBILITY == "BACKWARD"
    client.register_schema("orders-value", Schema(json.dumps(ORDER_V1), "AVRO"))
    assert client.register_schema("orders-value", Schema(json.dumps(ORDER_V2), "AVRO")) > 0
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("orders-value", Schema(json.dumps(ORDER_V3), "AVRO"))
    assert refused.value.http_status_code == 409


def test_schemas_survive_a_sigkill(private_registry: SchemaRegistry) -> None:
    with SchemaRegistryClient({"url": private_registry.address}) as client:
        schema_id = client.register_schema("orders-value", Schema(json.dumps(ORDER_V1), "AVRO"))
    private_registry.kill()
    assert private_registry.start() is True
    with SchemaRegistryClient({"url": private_registry.address}) as fresh:  # no cached ids
        assert json.loads(fresh.get_schema(schema_id).schema_str) == ORDER_V1
        # A new schema gets a new id, never one a record in Kafka may already carry.
        assert fresh.register_schema("refunds-value", Schema(json.dumps(ORDER_V3), "AVRO")) != schema_id


def test_the_stack_runs_its_registry(stack, local_stack: LocalStack, schema_registry_url: str) -> None:
    status = local_stack.status()["schema_registry"]
    assert status["address"] == schema_registry_url
    if not stack.schema_registry_managed:
        pytest.skip("EOGUARD_SCHEMA_REGISTRY_URL names a registry this stack does not run")
    assert status["ready"] is True
    pid = status["pid"]
    assert isinstance(pid, int)
    assert all(host == "127.0.0.1" for host, _ in _listening(pid))
    assert local_stack.endpoints().as_env()["EOGUARD_SCHEMA_REGISTRY_URL"] == schema_registry_url


def test_environment_names_an_existing_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EOGUARD_SCHEMA_REGISTRY_URL", "https://registry.example/apis/ccompat/v7")
    local = LocalStack(tmp_path)
    ends = local.endpoints()
    assert ends.schema_registry_url == "https://registry.example/apis/ccompat/v7"
    assert not ends.schema_registry_managed
    assert "schema_registry" not in local.managed_services()


@pytest.mark.cluster
def test_confluent_avro_serializers_round_trip_through_kafka(
        kafka_bootstrap: str, schema_registry_client: SchemaRegistryClient, new_topic) -> None:
    """A plain confluent-kafka producer and consumer, Confluent's own Avro serde, on the real
    Kafka and the stack's registry: the framing and the ids are Confluent's."""
    topic = new_topic(partitions=1)
    client = schema_registry_client
    serialize = AvroSerializer(client, json.dumps(ORDER_V1))
    deserialize = AvroDeserializer(client)
    orders = [{"order_id": f"o-{i}", "amount_cents": 1250 + i} for i in range(5)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    context = SerializationContext(topic, MessageField.VALUE)
    for order in orders:
        producer.produce(topic, serialize(order, context))
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    values: list[bytes] = []
    for _ in range(60):
        values += [m.value() for m in consumer.consume(10, timeout=1) if m.error() is None]
        if len(values) >= len(orders):
            break
    consumer.close()
    registered = client.get_latest_version(f"{topic}-value")
    assert [v[0] for v in values] == [0] * len(orders)  # magic byte
    assert {int.from_bytes(v[1:5], "big") for v in values} == {registered.schema_id}
    assert [deserialize(v, context) for v in values] == orders
