"""``kafka://`` URLs: what they configure, what they refuse (one line, no password), what is not negotiable."""

from __future__ import annotations

import pytest

from estafeta_brokers import check_url, redact_url
from estafeta_brokers.kafka_config import parse_kafka_url


def test_defaults_name_topics_and_groups_after_the_queue() -> None:
    config = parse_kafka_url("kafka://broker1:9092")
    assert config.servers == ("broker1:9092",)
    assert config.topic("payments") == "payments"
    assert config.topic("payments.DQ") == "payments.DQ"
    assert config.group_id("payments") == "estafeta.payments"
    assert (config.partitions, config.replication_factor, config.rebalance_grace) == (6, -1, 5.0)
    assert config.min_insync_replicas is None  # the cluster's min.insync.replicas


def test_parameters_and_several_servers() -> None:
    config = parse_kafka_url(
        "kafka://a:9092,b:9093,c?topic_prefix=shop.&partitions=12&replication_factor=3&min_insync_replicas=2"
        "&group=shop-workers"
        "&rebalance_grace_ms=2500&ssl.ca.location=/etc/ca.pem&producer.linger.ms=20&consumer.fetch.wait.max.ms=50"
    )
    assert config.bootstrap == "a:9092,b:9093,c:9092"
    assert config.topic("orders") == "shop.orders"
    assert config.group_id("orders.DQ") == "shop-workers.shop.orders.DQ"
    assert (config.partitions, config.replication_factor, config.rebalance_grace) == (12, 3, 2.5)
    assert config.min_insync_replicas == 2
    producer = config.producer_config("estafeta-relay")
    consumer = config.consumer_config("orders", "estafeta-worker")
    assert producer["ssl.ca.location"] == consumer["ssl.ca.location"] == "/etc/ca.pem"
    assert producer["linger.ms"] == "20" and "linger.ms" not in consumer
    assert consumer["fetch.wait.max.ms"] == "50" and "fetch.wait.max.ms" not in producer


def test_the_settings_the_guarantees_rest_on_cannot_be_turned_off() -> None:
    config = parse_kafka_url(
        "kafka://a?producer.acks=1&producer.enable.idempotence=false"
        "&consumer.enable.auto.commit=true&consumer.auto.offset.reset=latest&consumer.group.id=mine"
    )
    producer = config.producer_config("estafeta-relay")
    assert producer["acks"] == "all" and producer["enable.idempotence"] == "true"
    consumer = config.consumer_config("orders", "estafeta-worker")
    assert consumer["enable.auto.commit"] == "false" and consumer["enable.auto.offset.store"] == "false"
    assert consumer["auto.offset.reset"] == "earliest"
    assert consumer["group.id"] == "estafeta.orders"


def test_a_shorter_session_gets_a_heartbeat_that_fits_in_it() -> None:
    consumer = parse_kafka_url("kafka://a?consumer.session.timeout.ms=2000").consumer_config("q", "w")
    assert consumer["session.timeout.ms"] == "2000" and consumer["heartbeat.interval.ms"] == "666"


def test_credentials_become_sasl_settings() -> None:
    config = parse_kafka_url("kafka://app:s%40cret@a:9092?sasl.mechanism=SCRAM-SHA-512")
    assert config.common["sasl.username"] == "app" and config.common["sasl.password"] == "s@cret"
    assert config.common["sasl.mechanism"] == "SCRAM-SHA-512"
    assert config.common["security.protocol"] == "SASL_SSL"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("kafka://", "no host"),
        ("kafka://a:port", "port 'port' of a is not a port number"),
        ("kafka://a:9092/orders", "a kafka:// URL has no path"),
        ("kafka://a?partitions=0", "partitions 0 is out of range"),
        ("kafka://a?partitions=many", "partitions 'many' is not a whole number"),
        ("kafka://a?replication_factor=0", "replication_factor 0 is out of range"),
        ("kafka://a?min_insync_replicas=0", "min_insync_replicas 0 is out of range"),
        ("kafka://a?replication_factor=2&min_insync_replicas=3", "min_insync_replicas 3 is more than replication"),
        ("kafka://a?topic_prefix=shop/", "topic_prefix 'shop/' has characters Kafka refuses"),
        ("kafka://a?group=", "group is empty"),
        ("kafka://a?topics=x", "unknown kafka:// parameter 'topics'"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_url(url)


def test_passwords_never_reach_messages() -> None:
    url = "kafka://app:hunter2@a:9092,b:9092?sasl.password=hunter3&ssl.key.password=hunter4&partitions=x"
    redacted = redact_url(url)
    assert "hunter" not in redacted
    assert redacted.startswith("kafka://app:***@a:9092,b:9092?")
    with pytest.raises(ValueError) as refused:
        check_url(url)
    assert "hunter" not in str(refused.value)


def test_every_client_gives_up_a_silent_request_within_30_s_unless_the_url_says_otherwise() -> None:
    # librdkafka's own socket.timeout.ms is 60 s: a consumer's fetch on a silent cut waited that long.
    config = parse_kafka_url("kafka://a")
    assert config.consumer_config("q", "w")["socket.timeout.ms"] == "30000"
    assert config.producer_config("p")["socket.timeout.ms"] == "30000"
    assert config.admin_config()["socket.timeout.ms"] == "30000"
    mine = parse_kafka_url("kafka://a?socket.timeout.ms=10000&consumer.socket.timeout.ms=20000")
    assert mine.consumer_config("q", "w")["socket.timeout.ms"] == "20000"
    assert mine.producer_config("p")["socket.timeout.ms"] == "10000"
