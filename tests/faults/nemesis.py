"""A nemesis schedule as Jepsen runs one: network faults, one at a time, during a saga workload.

The order system runs in the fault harness: PostgreSQL, the broker (RabbitMQ, Redis or
Kafka), the ``dramatiq estafeta_actors`` workers, ``estafeta relay``, ``estafeta serve`` and a Redis
lock server each in a namespace of their own, the test (and the ``estafeta`` commands it
runs) in an observer's. Each fault starts, then a wave of orders is placed (``estafeta
orders place``, as the kill runs do; over HTTP with Idempotency-Keys, retried until
accepted, while the HTTP server is cut from its database), so its sagas run into it; the
fault lasts ``fault_seconds`` (packet loss at most :data:`LOSS_SECONDS`, the lock's
cut at most 9.5 s: its scenario is over by then) and is healed; the
time from the heal until every saga of the wave has ended is that fault's recovery time.
The lock fault is a side scenario: a lock holder cut from the Redis lock server loses its
lease, a successor takes the key, then the stale holder writes: its fencing token must be
refused. After the last fault and quiescence, :meth:`NemesisRun.invariants` checks every
invariant and names the rows that break one.

The order of the faults comes from a seed, printed first: ``CHAOS_SEED=<seed>`` replays a
run's order. CI's run holds each fault ``CHAOS_FAULT_SECONDS`` (5 s: TCP retransmits
across the gap and the same connections carry on); ``make chaos`` holds them 60 s, past
every client's bound, so every client must give up its connection, reconnect, and the work
in flight must be retried.
"""

from __future__ import annotations

import collections
import os
import queue
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import httpx
import psycopg

from estafeta_actors.kill_and_recover import ROOT, Child, KillAndRecover, Plan

from .network import Network, Node

#: The longest a lossy fault lasts (20 s of 30 % loss).
LOSS_SECONDS = 20.0
#: The schemas whose outboxes must be empty once the run is quiet.
SERVICES = ("orders", "payments", "inventory", "notifications", "pingpong")
#: The Redis lock lease of the fenced scenario: it runs out during the cut.
LOCK_TTL_MS = 1500


@attrs.frozen
class Fault:
    """One fault of the schedule: its name, how to start it (healing is ``heal_all``), and how its wave is placed.

    ``kind`` groups the faults (``make chaos`` runs the broker faults against every broker);
    ``http``: the wave goes through ``estafeta serve`` with Idempotency-Keys; ``during``: a
    scenario of its own, run while the fault is on, after the wave.
    """

    name: str
    start: Callable[[], None]
    kind: str = "link"
    #: The longest it lasts, whatever ``fault_seconds`` says.
    longest: float | None = None
    http: bool = False
    during: Callable[[], None] | None = None
    #: Called before the heal (a fault that keeps changing the rules stops here).
    stop: Callable[[], None] | None = None


def _everywhere(net: Network, percent: int) -> None:
    nodes = [node for node in net.nodes.values() if node.name != "observer"]
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            net.lossy(a, b, percent)


class _Flapping:
    """Cut ``links`` for a second, heal them for a second, again and again until :meth:`stop`."""

    def __init__(self, net: Network, links: list[tuple[Node, Node]], period: float = 1.0) -> None:
        self.net, self.links, self.period = net, links, period
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopped.clear()
        self._thread = threading.Thread(target=self._flap, daemon=True)
        self._thread.start()

    def _flap(self) -> None:
        while not self._stopped.is_set():
            for a, b in self.links:
                self.net.cut(a, b)
            if self._stopped.wait(self.period):
                return
            for a, b in self.links:
                self.net.heal(a, b)
            self._stopped.wait(self.period)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(30)


def fault_seconds() -> float:
    """``CHAOS_FAULT_SECONDS`` (``make chaos``: 60 s, longer than every client's bound), or 5 (CI's run)."""
    return float(os.environ.get("CHAOS_FAULT_SECONDS") or 5)


def chaos_seed() -> int:
    """``CHAOS_SEED``, or a new one."""
    return int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(2**31))


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@attrs.define
class Broken:
    """One invariant that does not hold, the rows that break it, and the faults whose waves they belong to."""

    invariant: str
    rows: list[Any]
    faults: collections.Counter[str] = attrs.Factory(collections.Counter)

    def __str__(self) -> str:
        shown = "\n    ".join(str(row) for row in self.rows[:20])
        more = f"\n    ... and {len(self.rows) - 20} more" if len(self.rows) > 20 else ""
        waves = "; ".join(f"{n} in the wave of {fault!r}" for fault, n in self.faults.most_common())
        return f"{self.invariant}: {len(self.rows)} offending row(s){f' ({waves})' if waves else ''}\n    {shown}{more}"


class NemesisRun(KillAndRecover):
    """:class:`KillAndRecover` with its processes in the harness's namespaces and faults instead of kills.

    Construct and run it inside the observer's namespace (``inside(observer)``): its own
    connections, the threads it starts and their pools' threads then live there. ``nodes``
    holds ``db``, ``mq``, ``worker``, ``relay``, ``observer``, and for the HTTP and lock
    faults ``api``, ``locks`` and ``holder`` (``lock_url``: the lock server in ``locks``).
    """

    def __init__(
        self,
        net: Network,
        nodes: dict[str, Node],
        database_url: str,
        broker_url: str,
        log_dir: Path,
        *,
        seed: int,
        broker: str = "rabbitmq",
        kinds: tuple[str, ...] | None = None,
        lock_url: str | None = None,
        wave: int = 20,
        fault_seconds: float = 5.0,
        recovery_timeout: float = 180.0,
    ) -> None:
        self.net, self.nodes, self.seed, self.broker = net, nodes, seed, broker
        self.lock_url = lock_url
        self.faults = [fault for fault in self.schedule() if kinds is None or fault.kind in kinds]
        random.Random(seed).shuffle(self.faults)
        plan = Plan(orders=wave * len(self.faults), processes=1, threads=4, step_timeout=5.0, timeout=300, kill=False)
        super().__init__(database_url, broker_url, plan, log_dir)
        self.wave = wave
        self.fault_seconds = fault_seconds
        self.recovery_timeout = recovery_timeout
        #: The fault in progress (or the last one): what a failure reports.
        self.active: str | None = None
        #: One entry per fault: its name, its wave's sagas unfinished at the heal, and the
        #: seconds from the heal until they had all ended.
        self.recoveries: list[dict[str, Any]] = []
        #: The HTTP waves' orders: Idempotency-Key -> (order id, requests sent for it).
        self.accepted: dict[str, tuple[uuid.UUID, int]] = {}
        #: The fenced scenario's outcome: the stale holder's answer, its ping id and its successor's.
        self.fenced: dict[str, Any] = {}
        self.api: Child | None = None
        #: Each order's and saga's id -> the fault its wave ran into.
        self.wave_of: dict[str, str] = {}

    # -- the schedule ---------------------------------------------------------------------

    def schedule(self) -> list[Fault]:
        """Every fault this run's nodes allow, once (``__init__`` shuffles them with the seed)."""
        net, n = self.net, self.nodes
        db, mq, worker, relay = n["db"], n["mq"], n["worker"], n["relay"]
        broker = {"rabbitmq": "RabbitMQ", "redis": "Redis", "kafka": "Kafka"}[self.broker]
        flapping = _Flapping(net, [(worker, db), (worker, mq)])
        faults = [
            Fault("worker <-> database cut", lambda: net.cut(worker, db)),
            Fault(f"relay <-> broker ({broker}) cut", lambda: net.cut(relay, mq), kind="broker"),
            Fault(f"worker <-> broker ({broker}) cut", lambda: net.cut(worker, mq), kind="broker"),
            Fault(
                "database -> worker lost (one way: requests arrive, answers do not)",
                lambda: net.cut_one_way(db, worker),
            ),
            Fault("relay <-> database cut (it may have published what it cannot delete)", lambda: net.cut(relay, db)),
            Fault("10 % loss on every link", lambda: _everywhere(net, 10), longest=LOSS_SECONDS),
            Fault(
                "the workers' links to the database and the broker flapping (cut 1 s, whole 1 s)",
                flapping.start,
                stop=flapping.stop,
            ),
            Fault("30 % loss on every link", lambda: _everywhere(net, 30), longest=LOSS_SECONDS),
        ]
        if "api" in n:
            faults.append(
                Fault(
                    "HTTP server <-> database cut (clients retry with their Idempotency-Keys)",
                    lambda: net.cut(n["api"], db),
                    http=True,
                )
            )
            faults.append(
                Fault(
                    "database -> HTTP server lost (one way: its commits land, their answers do not)",
                    lambda: net.cut_one_way(db, n["api"]),
                    http=True,
                )
            )
        if "holder" in n and self.lock_url is not None:
            faults.append(
                Fault(
                    "lock holder <-> Redis lock server cut (its lease runs out, a successor takes the key)",
                    self._start_stale_holder,
                    kind="lock",
                    longest=LOCK_TTL_MS / 1000 + 8,
                    during=self._successor_then_stale_write,
                )
            )
        return faults

    def seconds_of(self, fault: Fault) -> float:
        return self.fault_seconds if fault.longest is None else min(self.fault_seconds, fault.longest)

    # -- processes ------------------------------------------------------------------------

    def start(self, *, relay: bool = True) -> None:
        """The workers in the worker's namespace, the relay in the relay's, ``estafeta serve`` in the API's."""
        workers = [
            str(self.bin / "dramatiq"),
            "estafeta_actors",
            "--processes",
            "1",
            "--threads",
            str(self.plan.threads),
        ]
        self.workers = Child("workers", self.nodes["worker"].command(*workers), self.env, self.log_dir)
        if relay:
            argv = self.nodes["relay"].command(str(self.bin / "estafeta"), "relay")
            self.relay = Child("relay", argv, self.env, self.log_dir)
        if "api" in self.nodes:
            api = self.nodes["api"]
            serve = [str(self.bin / "estafeta"), "serve", "--host", api.address, "--port", "8000", "--no-access-log"]
            self.api = Child("api", api.command(*serve), self.env, self.log_dir)
            self.wait_for("estafeta serve", self._api_healthy, 60)

    def stop(self) -> None:
        super().stop()
        if self.api is not None:
            self.api.stop()

    def _api_url(self) -> str:
        return f"http://{self.nodes['api'].address}:8000"

    def _api_healthy(self) -> bool:
        try:
            return httpx.get(f"{self._api_url()}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    # -- the run --------------------------------------------------------------------------

    def _place_and_survive(self) -> None:
        print(f"nemesis: seed {self.seed} (CHAOS_SEED={self.seed} replays this order)", flush=True)
        for number, fault in enumerate(self.faults, 1):
            seconds = self.seconds_of(fault)
            self.active = fault.name
            print(f"nemesis: fault {number}: {fault.name}, for {seconds:g} s", flush=True)
            fault.start()
            began = time.monotonic()
            # The wave is placed (from the observer, whose links stay whole) while the fault
            # is on; over HTTP it cannot be accepted before the heal, so it runs beside it.
            errors: queue.Queue[BaseException] = queue.Queue()
            placing = threading.Thread(target=self._wave_and_scenario, args=(fault, number, errors), daemon=True)
            placing.start()
            placing.join(timeout=seconds if fault.http else None)
            time.sleep(max(seconds - (time.monotonic() - began), 0.0))
            placed = self.wave * number
            in_flight = placed - self.ended()
            if fault.stop is not None:
                fault.stop()
            self.net.heal_all()
            healed = time.monotonic()
            placing.join(self.recovery_timeout)
            if placing.is_alive():
                raise TimeoutError(
                    f"the wave of {fault.name!r} was not placed {self.recovery_timeout:g} s after the heal"
                )
            if not errors.empty():
                raise errors.get()
            self._wait_for_wave(fault, placed)
            self._mark_wave(fault)
            recovered = round(time.monotonic() - healed, 1)
            self.recoveries.append({"fault": fault.name, "in_flight_at_heal": in_flight, "recovered_after": recovered})
            print(
                f"nemesis: fault {number}: {in_flight} sagas of its wave unfinished at the heal;"
                f" all ended {recovered} s after it",
                flush=True,
            )
        self.active = "none (after the last heal)"

    def _wave_and_scenario(self, fault: Fault, number: int, errors: queue.Queue[BaseException]) -> None:
        try:
            if fault.http:
                self._place_wave_http()
            else:
                self._place_wave(number)
            if fault.during is not None:
                fault.during()
        except BaseException as exc:  # handed to the schedule's thread
            errors.put(exc)

    def _mark_wave(self, fault: Fault) -> None:
        query = """SELECT o.order_id, s.saga_id FROM orders.orders o LEFT JOIN orders.saga_order s USING (order_id)
                   WHERE starts_with(o.customer_id, %s)"""
        for order_id, saga_id in self._rows("orders", query, (self.prefix,)):
            for found in (order_id, saga_id):
                if found is not None:
                    self.wave_of.setdefault(str(found), fault.name)

    def _wait_for_wave(self, fault: Fault, placed: int) -> None:
        self.wait_for(f"the wave of {fault.name!r} to end", lambda: self.ended() >= placed, self.recovery_timeout)

    def _place_wave(self, number: int) -> None:
        plan, prefix = self.plan, self.prefix
        place = ["orders", "place", "--quantity", "1", "--amount", str(plan.amount), "--count", str(self.wave)]
        place += [a for i in range(1, plan.customers + 1) for a in ("--customer", f"{prefix}c{i}")]
        place += [a for i in range(1, plan.skus + 1) for a in ("--sku", f"{prefix}sku{i}")]
        self.estafeta(*place)

    # -- the HTTP wave --------------------------------------------------------------------

    def _place_wave_http(self) -> None:
        """The wave over HTTP: each order with a key of its own, resent with that key until it is accepted."""
        plan, prefix = self.plan, self.prefix
        bodies = [
            {
                "customer_id": f"{prefix}c{i % plan.customers + 1}",
                "sku": f"{prefix}sku{i % plan.skus + 1}",
                "quantity": 1,
                "amount_cents": plan.amount,
            }
            for i in range(self.wave)
        ]
        with ThreadPoolExecutor(4) as clients:
            for key, order_id, sent in clients.map(self._post_until_accepted, bodies):
                self.accepted[key] = (order_id, sent)

    def _post_until_accepted(self, body: dict[str, Any]) -> tuple[str, uuid.UUID, int]:
        key = str(uuid.uuid4())
        headers = {"Idempotency-Key": f'"{key}"', "X-Client-Id": f"{self.prefix}nemesis"}
        deadline = time.monotonic() + self.fault_seconds + self.recovery_timeout
        sent = 0
        with httpx.Client(base_url=self._api_url(), timeout=3.0) as client:
            while time.monotonic() < deadline:
                sent += 1
                try:
                    answer = client.post("/orders", json=body, headers=headers)
                except httpx.HTTPError:
                    time.sleep(0.5)  # a timeout or a reset: the same key again
                    continue
                if answer.status_code == 201:
                    return key, uuid.UUID(answer.json()["order_id"]), sent
                if answer.status_code not in (409, 500, 502, 503, 504):
                    raise AssertionError(f"POST /orders with key {key}: {answer.status_code} {answer.text}")
                time.sleep(0.5)
        raise TimeoutError(f"POST /orders with key {key} was not accepted after {sent} requests")

    # -- the fenced lock scenario ---------------------------------------------------------

    def _start_stale_holder(self) -> None:
        """The holder takes the lease, then is cut from the lock server (its database link stays whole)."""
        assert self.lock_url is not None
        key = f"{self.prefix}fenced-{uuid.uuid4().hex[:6]}"
        stale = uuid.uuid4()
        argv = [sys.executable, "-m", "tests.faults.fenced_writer", self.database_url, self.lock_url, key]
        argv += [str(LOCK_TTL_MS), str(stale)]
        holder = subprocess.Popen(
            self.nodes["holder"].command(*argv),
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.log_dir / "holder.log").open("wb"),
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_read_lines, args=(holder, lines), daemon=True).start()
        held = lines.get(timeout=60)
        if not held.startswith("held "):
            raise AssertionError(f"the lock holder did not take {key}: {held!r}")
        self.fenced = {
            "key": key,
            "stale": stale,
            "stale_token": int(held.split()[1]),
            "process": holder,
            "lines": lines,
        }
        self.net.cut(self.nodes["holder"], self.nodes["locks"])

    def _successor_then_stale_write(self) -> None:
        """Once the lease ran out, a successor takes the key and writes; then the stale holder tries to."""
        from estafeta import Runtime, Settings

        fenced = self.fenced
        time.sleep(LOCK_TTL_MS / 1000 + 0.5)
        successor = uuid.uuid4()
        assert self.lock_url is not None
        runtime = Runtime(Settings(database_url=self.database_url, lock_url=self.lock_url, lock_ttl_ms=30_000))
        try:
            with (
                runtime.database("pingpong").transaction() as conn,
                runtime.locks.hold(conn, fenced["key"], schema="pingpong", dsn=self.database_url) as held,
            ):
                conn.execute("INSERT INTO pingpong.pings (ping_id, sent_at) VALUES (%s, now())", (successor,))
                held.before_commit(conn)
                fenced["successor_token"] = held.token
        finally:
            runtime.close()
        fenced["successor"] = successor
        holder: subprocess.Popen[str] = fenced["process"]
        assert holder.stdin is not None
        holder.stdin.write("write\n")
        holder.stdin.flush()
        fenced["answer"] = fenced["lines"].get(timeout=60).strip()
        holder.wait(60)

    # -- the invariants -------------------------------------------------------------------

    def _rows(self, service: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.settings.database_url_for(service), autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def unfinished_or_failed(self) -> list[dict[str, Any]]:
        """The run's sagas that did not end completed or compensated, with their step, attempts and last error."""
        query = """SELECT s.saga_id, s.status, s.current_step, s.attempts, s.last_error, o.status
                   FROM orders.saga_order s JOIN orders.orders o USING (order_id)
                   WHERE starts_with(o.customer_id, %s) AND s.status NOT IN ('completed', 'compensated')"""
        columns = ("saga_id", "status", "step", "attempts", "last_error", "order_status")
        return [dict(zip(columns, row, strict=True)) for row in self._rows("orders", query, (self.prefix,))]

    def invariants(self, report: dict[str, Any]) -> list[Broken]:
        """Every invariant that does not hold after the heal and quiescence, with its offending rows."""
        prefix = self.prefix
        broken: list[Broken] = []

        def check(name: str, rows: list[Any]) -> None:
            if rows:
                waves = collections.Counter(
                    next((self.wave_of[i] for i in _UUID.findall(str(row)) if i in self.wave_of), "no wave")
                    for row in rows
                )
                broken.append(Broken(name, rows, waves))

        orders = self._rows(
            "orders", "SELECT order_id FROM orders.orders WHERE starts_with(customer_id, %s)", (prefix,)
        )
        ids = {row[0] for row in orders}
        check(
            "every accepted order exists once",
            [
                f"key {k}: order {o} (after {n} requests) does not exist"
                for k, (o, n) in self.accepted.items()
                if o not in ids
            ]
            + _shared_orders(self.accepted)
            + ([f"{len(ids)} orders for {self.plan.orders} placed"] if len(ids) != self.plan.orders else []),
        )
        check(
            "one saga per order",
            self._rows(
                "orders",
                """SELECT o.order_id, count(s.saga_id)
                   FROM orders.orders o LEFT JOIN orders.saga_order s USING (order_id)
                   WHERE starts_with(o.customer_id, %s) GROUP BY o.order_id HAVING count(s.saga_id) <> 1""",
                (prefix,),
            ),
        )
        check("every saga final (completed or compensated)", self.unfinished_or_failed())
        check(
            "confirmed orders charged and reserved, cancelled ones refunded and released, history recorded once",
            report["mismatches"],
        )
        money, stock, ledger = report["money"], report["stock"], report["ledger"]
        check(
            "money and stock conserved",
            [f"money seeded {money[0]}, now {money[1]}"] * (money[0] != money[1])
            + [f"stock seeded {stock[0]}, now {stock[1]}"] * (stock[0] != stock[1])
            + [f"the ledger's events: deposited {ledger[0]}, balances + charges {ledger[1]}"]
            * (ledger != [money[0]] * 2),
        )
        check("nobody charged twice", self._charged_twice())
        check(
            "every order notified exactly once (confirmed or cancelled, as its saga ended)",
            self._rows(
                "orders",
                """SELECT o.order_id, s.status, array_agg(n.kind ORDER BY n.kind) FILTER (WHERE n.kind IS NOT NULL)
                   FROM orders.orders o JOIN orders.saga_order s USING (order_id)
                   LEFT JOIN notifications.sent n USING (order_id)
                   WHERE starts_with(o.customer_id, %s) GROUP BY o.order_id, s.status
                   HAVING count(n.kind) <> 1
                       OR min(n.kind) <> CASE s.status WHEN 'completed' THEN 'confirmed' ELSE 'cancelled' END""",
                (prefix,),
            ),
        )
        for service in SERVICES:
            check(
                f"{service}'s outbox drained",
                self._rows(service, f"SELECT id, actor_name, status, attempts, last_error FROM {service}.outbox"),
            )
        check("projections equal to a replay of the event log", report["projection_mismatches"])
        if self.fenced:
            stale = self._rows(
                "pingpong", "SELECT ping_id FROM pingpong.pings WHERE ping_id = %s", (self.fenced["stale"],)
            )
            check(
                "the fencing token refuses the stale lock holder's write",
                [f"the stale holder (token {self.fenced['stale_token']}) answered {self.fenced.get('answer')!r}"]
                * (not str(self.fenced.get("answer", "")).startswith("refused StaleFencingToken"))
                + [f"its row {row[0]} was committed" for row in stale],
            )
        return broken

    def _charged_twice(self) -> list[str]:
        """Orders the ledger withdrew money for more than once without a refund between."""
        from estafeta_actors import payments
        from estafeta_actors.ledger import MoneyRefunded, MoneyWithdrawn, stream_of

        found = []
        with psycopg.connect(self.settings.database_url_for("payments"), autocommit=True) as conn:
            for i in range(1, self.plan.customers + 1):
                held: collections.Counter[uuid.UUID] = collections.Counter()
                for recorded in payments.STORE.read(conn, stream_of(f"{self.prefix}c{i}")):
                    event = recorded.event
                    if isinstance(event, MoneyWithdrawn) and event.order_id is not None:
                        held[event.order_id] += 1
                        if held[event.order_id] > 1:
                            found.append(f"order {event.order_id}: withdrawn again at version {recorded.version}")
                    elif isinstance(event, MoneyRefunded):
                        held[event.order_id] -= 1
        return found


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    for line in process.stdout or ():
        lines.put(line)


def _shared_orders(accepted: dict[str, tuple[uuid.UUID, int]]) -> list[str]:
    """Orders that answered more than one key (each key must place an order of its own)."""
    keys_of: dict[uuid.UUID, list[str]] = collections.defaultdict(list)
    for key, (order_id, _) in accepted.items():
        keys_of[order_id].append(key)
    return [f"order {order_id}: accepted for keys {keys}" for order_id, keys in keys_of.items() if len(keys) > 1]
