"""``python -m bench.relay``: how fast ``estafeta relay`` drains an outbox, beside its ceilings and floor.

One run on one machine measures: rows/s drained by ``estafeta relay`` (one and two
processes) to RabbitMQ with publisher confirms, to Redis and to Kafka (idempotent
producer, ``acks=all``); the ceilings (raw pika publishing batches of 100 with confirms;
raw confluent-kafka producing the same records with the same settings, batches of 500;
Dramatiq's own ``enqueue`` on RabbitMQ with ``confirm_delivery``, on Redis and on Kafka); the floor
(the seed article's relay, as written and without its sleep); commit-to-publish latency
at 50 and 500 events/s; and the relay's
RSS growth while draining 200,000 rows. It prints one table, or one JSON object with
``--json``. Figures measured while other suites run on the machine are noisy: the
table shows the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import psycopg

from estafeta_brokers import broker_from_url, split_namespace

from . import relay_baselines as baselines
from .relay_kafka import count_records, raw_kafka_rate
from .relay_latency import latency, memory
from .relay_setup import Services, fill, machine, relays, services, wait_empty, warm_up

#: The targets (2-core machine).
TARGETS = {
    "rabbitmq_rows_per_second": 5000,
    "rabbitmq_vs_raw_pika": 0.5,
    "redis_vs_dramatiq_enqueue": 0.8,
    "kafka_vs_raw_confluent_kafka": 0.5,
    "p99_ms_at_50": 20.0,
    "rss_growth_mb": 10.0,
}


def drain_rate(services: Services, broker: str, rows: int, processes: int = 1, *args: str) -> float:
    """Rows/s for ``processes`` relays to publish ``rows`` committed rows (all delivered, checked)."""
    url = services.url(broker)
    queue = f"bench_drain_{broker}_{processes}"
    with relays(services.env(url), processes, *args), psycopg.connect(services.dsn, autocommit=True) as conn:
        warm_up(conn, queue)
        with conn.transaction():
            fill(conn, rows, queue)
        started = time.perf_counter()
        ended = wait_empty(conn)
    _check_delivered(url, broker, queue, rows + 1)
    return rows / (ended - started)


def _check_delivered(url: str, broker: str, queue: str, expected: int) -> None:
    if broker == "kafka":  # a topic cannot be flushed: count what it holds
        found = count_records(url, queue)
        if found != expected:
            raise SystemExit(f"Kafka topic of {queue} holds {found} records, expected {expected}")
        return
    client = broker_from_url(url)
    if broker == "rabbitmq":
        client.declare_queue(queue, ensure=True)  # type: ignore[call-arg]
        found = client.get_queue_message_counts(queue)[0]  # type: ignore[attr-defined]
    else:
        import redis

        plain, namespace = split_namespace(url)
        found = redis.Redis.from_url(plain).llen(f"{namespace}:{queue}")
    client.flush(queue)  # type: ignore[attr-defined]
    client.close()
    if found != expected:
        raise SystemExit(f"{broker} queue {queue} holds {found} messages, expected {expected}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure, in one run."""
    with services() as found:
        result: dict[str, Any] = {"rows": args.rows, "machine": machine(found.dsn, found.amqp_url)}
        step = _progress(args.quiet)
        step("relay -> RabbitMQ")
        rabbit = {"relay": drain_rate(found, "rabbitmq", args.rows)}
        rabbit["relay_x2"] = drain_rate(found, "rabbitmq", args.rows, processes=2)
        step("raw pika, Dramatiq enqueue")
        rabbit["raw_pika_batches_of_100"] = baselines.raw_pika_rate(found.amqp_url, "bench_pika", args.rows)
        rabbit["dramatiq_enqueue"] = baselines.dramatiq_enqueue_rate(
            found.amqp_url, "bench_enqueue", min(args.rows, 5000)
        )
        step("seed relay")
        seed_rows = min(args.rows, 2000)
        rabbit["seed_relay"] = baselines.seed_relay_rate(found.dsn, found.amqp_url, "bench_seed", seed_rows, sleep=True)
        rabbit["seed_relay_no_sleep"] = baselines.seed_relay_rate(
            found.dsn, found.amqp_url, "bench_seed", seed_rows, sleep=False
        )
        step("relay -> Redis")
        redis_rates = {"relay": drain_rate(found, "redis", args.rows)}
        redis_rates["relay_x2"] = drain_rate(found, "redis", args.rows, processes=2)
        redis_rates["dramatiq_enqueue"] = baselines.dramatiq_enqueue_rate(found.redis_url, "bench_enqueue", args.rows)
        step("relay -> Kafka, raw confluent-kafka")
        kafka_rates = {"relay": drain_rate(found, "kafka", args.rows)}
        kafka_rates["relay_x2"] = drain_rate(found, "kafka", args.rows, processes=2)
        kafka_rates["raw_confluent_kafka"] = raw_kafka_rate(found.kafka_url, "bench_raw_kafka", args.rows)
        kafka_rates["dramatiq_enqueue"] = baselines.dramatiq_enqueue_rate(
            found.kafka_url, "bench_enqueue", min(args.rows, 5000)
        )
        result["rabbitmq"] = {k: round(v) for k, v in rabbit.items()}
        result["redis"] = {k: round(v) for k, v in redis_rates.items()}
        result["kafka"] = {k: round(v) for k, v in kafka_rates.items()}
        result["machine"]["kafka"] = found.kafka_server
        result["latency"] = {}
        for broker in ("rabbitmq", "redis", "kafka"):
            for rate in (50, 500):
                step(f"latency {broker} {rate}/s")
                result["latency"][f"{broker}_{rate}"] = latency(found, broker, rate, args.latency_seconds)
        if args.memory_rows:
            step(f"memory, {args.memory_rows} rows")
            result["memory"] = memory(found, args.memory_rows)
    result["targets"] = _verdicts(result)
    return result


def _progress(quiet: bool) -> Any:
    def step(what: str) -> None:
        if not quiet:
            print(f"... {what}", file=sys.stderr, flush=True)

    return step


def _verdicts(result: dict[str, Any]) -> dict[str, bool]:
    rabbit, redis_rates, kafka, lat = result["rabbitmq"], result["redis"], result["kafka"], result["latency"]
    verdicts = {
        "rabbitmq_rows_per_second": rabbit["relay"] >= TARGETS["rabbitmq_rows_per_second"],
        "rabbitmq_vs_raw_pika": rabbit["relay"] >= TARGETS["rabbitmq_vs_raw_pika"] * rabbit["raw_pika_batches_of_100"],
        "redis_vs_dramatiq_enqueue": redis_rates["relay"]
        >= TARGETS["redis_vs_dramatiq_enqueue"] * redis_rates["dramatiq_enqueue"],
        "kafka_vs_raw_confluent_kafka": kafka["relay"]
        >= TARGETS["kafka_vs_raw_confluent_kafka"] * kafka["raw_confluent_kafka"],
        "p99_ms_at_50": all(lat[f"{b}_50"]["p99_ms"] <= TARGETS["p99_ms_at_50"] for b in ("rabbitmq", "redis")),
    }
    if "memory" in result:
        verdicts["rss_growth_mb"] = result["memory"]["growth_mb"] < TARGETS["rss_growth_mb"]
    return verdicts


def table(result: dict[str, Any]) -> str:
    """The figures as one table: figure, how it compares, and the target's verdict."""
    m, rabbit, rds, kfk, v = result["machine"], result["rabbitmq"], result["redis"], result["kafka"], result["targets"]
    ok = {True: "ok", False: "MISSED"}
    pika, enqueue, raw = rabbit["raw_pika_batches_of_100"], rds["dramatiq_enqueue"], kfk["raw_confluent_kafka"]
    rabbit_ok = ok[v["rabbitmq_vs_raw_pika"] and v["rabbitmq_rows_per_second"]]
    redis_ok = ok[v["redis_vs_dramatiq_enqueue"]]
    kafka_ok = ok[v["kafka_vs_raw_confluent_kafka"]]

    def vs_enqueue(rate: int) -> str:
        return f"{rate / enqueue:.2f} x Dramatiq enqueue"

    def vs_raw(rate: int) -> str:
        return f"{rate / raw:.2f} x raw confluent-kafka"

    rows = [
        ("RabbitMQ, publisher confirms", "rows/s", "", ""),
        ("  estafeta relay", f"{rabbit['relay']:,}", f"{rabbit['relay'] / pika:.2f} x raw pika", rabbit_ok),
        ("  estafeta relay, 2 processes", f"{rabbit['relay_x2']:,}", f"{rabbit['relay_x2'] / pika:.2f} x raw pika", ""),
        ("  ceiling: raw pika, batches of 100", f"{pika:,}", "", ""),
        ("  ceiling: Dramatiq enqueue (confirm_delivery)", f"{rabbit['dramatiq_enqueue']:,}", "", ""),
        ("  floor: seed relay as written (500 ms ticker)", f"{rabbit['seed_relay']:,}", "", ""),
        ("  floor: seed relay without its sleep", f"{rabbit['seed_relay_no_sleep']:,}", "", ""),
        ("Redis", "rows/s", "", ""),
        ("  estafeta relay", f"{rds['relay']:,}", vs_enqueue(rds["relay"]), redis_ok),
        ("  estafeta relay, 2 processes", f"{rds['relay_x2']:,}", vs_enqueue(rds["relay_x2"]), ""),
        ("  ceiling: Dramatiq enqueue", f"{enqueue:,}", "", ""),
        ("Kafka, idempotent producer, acks=all", "rows/s", "", ""),
        ("  estafeta relay", f"{kfk['relay']:,}", vs_raw(kfk["relay"]), kafka_ok),
        ("  estafeta relay, 2 processes", f"{kfk['relay_x2']:,}", vs_raw(kfk["relay_x2"]), ""),
        ("  ceiling: raw confluent-kafka, batches of 500", f"{raw:,}", "", ""),
        ("  ceiling: Dramatiq enqueue (estafeta's KafkaBroker)", f"{kfk['dramatiq_enqueue']:,}", "", ""),
        ("Commit-to-publish latency", "p50 / p99 / max ms", "", ""),
    ]  # fmt: skip
    for name, f in result["latency"].items():
        broker, rate = name.split("_")
        verdict = ok[f["p99_ms"] <= TARGETS["p99_ms_at_50"]] if rate == "50" else ""
        figures = f"{f['p50_ms']} / {f['p99_ms']} / {f['max_ms']}"
        rows.append((f"  {broker}, {rate} events/s", figures, f"{f['events']} events", verdict))
    if "memory" in result:
        mem = result["memory"]
        note = f"{mem['rss_start_mb']} -> peak {mem['rss_peak_mb']} MB, {mem['rows_per_second']:,} rows/s"
        rows.append(("Relay RSS while draining", "growth MB", "", ""))
        rows.append((f"  {mem['rows']:,} rows to RabbitMQ", f"{mem['growth_mb']}", note, ok[v["rss_growth_mb"]]))
    width = max(len(r[0]) for r in rows)
    lines = [
        f"estafeta relay benchmark: {result['rows']:,} rows; {m['cores']} cores, {m['cpu']}; "
        f"PostgreSQL {m['postgresql']}, RabbitMQ {m['rabbitmq']}, Redis {m['redis']}, {m['kafka']}; "
        f"load {m['load_average_1m']}",
    ]
    for name, figure, note, verdict in rows:
        lines.append(f"{name:<{width}}  {figure:>20}  {note:<42} {verdict}".rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows per drain measurement (default 20,000)")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="seconds of writing per latency figure")
    parser.add_argument(
        "--memory-rows", type=int, default=200_000, help="rows drained while watching RSS (0: skip; default 200,000)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    result = measure(args)
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
