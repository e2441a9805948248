"""Settings: defaults, overrides, and one-line errors that name the variable and hide passwords."""

from __future__ import annotations

from pathlib import Path

import pytest

from estafeta import Settings, SettingsError
from estafeta_brokers import amqp_urls, redact_url
from estafeta_sql.pool import describe_dsn


def test_defaults_need_no_configuration() -> None:
    settings = Settings.from_env({})
    assert settings.database_url == "embedded"
    assert settings.broker_url == "stub://"
    assert settings.lock_url == "postgres"
    assert settings.relay_max_attempts == 5


def test_observability_settings() -> None:
    settings = Settings.from_env(
        {"ESTAFETA_LOG_FORMAT": "JSON", "ESTAFETA_METRICS_PORT": "9191", "ESTAFETA_SAGA_STUCK_AFTER": "120"}
    )
    assert (settings.log_format, settings.metrics_port, settings.saga_stuck_after) == ("json", 9191, 120.0)
    assert Settings.from_env({}).metrics_port is None  # no worker metrics server unless asked


def test_a_service_can_have_its_own_database() -> None:
    settings = Settings.from_env(
        {"ESTAFETA_DATABASE_URL": "dbname=shop", "ESTAFETA_PAYMENTS_DATABASE_URL": "host=db2 dbname=payments"}
    )
    assert settings.database_url_for("orders") == "dbname=shop"
    assert settings.database_url_for("payments") == "host=db2 dbname=payments"


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db1,db2 port=5432,5433 user=app password=hunter2 dbname=shop target_session_attrs=read-write",
        "postgresql://app:hunter2@db1:5432,db2:5433/shop?target_session_attrs=primary",
    ],
)
def test_a_dsn_naming_a_primary_and_its_standby_is_accepted_and_described_host_by_host(dsn: str) -> None:
    # libpq's multi-host DSN: every connection goes to whichever host accepts writes now.
    settings = Settings.from_env({"ESTAFETA_DATABASE_URL": dsn, "ESTAFETA_PAYMENTS_DATABASE_URL": dsn})
    assert settings.database_url_for("payments") == dsn
    assert describe_dsn(dsn) == "postgresql://app@db1:5432,db2:5433/shop"
    assert describe_dsn("host=db1,db2 port=6432 dbname=shop") == "postgresql://db1:6432,db2:6432/shop"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"ESTAFETA_BROKER_URL": "nats://u:hunter2@h:4222"}, "ESTAFETA_BROKER_URL: unknown scheme 'nats'"),
        ({"ESTAFETA_BROKER_URL": "kafka://u:hunter2@h:port"}, "ESTAFETA_BROKER_URL: port 'port' of h is not"),
        ({"ESTAFETA_BROKER_URL": "amqp://u:hunter2@:5672/"}, "ESTAFETA_BROKER_URL: no host"),
        ({"ESTAFETA_BROKER_URL": "amqp://u:hunter2@h:port/"}, "ESTAFETA_BROKER_URL: not a URL"),
        ({"ESTAFETA_DATABASE_URL": "host=x password=hunter2 oops"}, "ESTAFETA_DATABASE_URL: not a PostgreSQL DSN"),
        ({"ESTAFETA_DATABASE_URL": "postgresql://u:hunter2@h:port/db"}, "ESTAFETA_DATABASE_URL: not a PostgreSQL"),
        ({"ESTAFETA_ORDERS_DATABASE_URL": ""}, "ESTAFETA_ORDERS_DATABASE_URL: is empty"),
        (
            {"ESTAFETA_DATABASE_URL": "host=a,b port=5432,5433 password=hunter2 dbname=shop"},
            "ESTAFETA_DATABASE_URL: not a PostgreSQL DSN: names 2 hosts but target_session_attrs=any",
        ),
        (
            {"ESTAFETA_DATABASE_URL": "postgresql://u:hunter2@a,b/shop?target_session_attrs=prefer-standby"},
            "ESTAFETA_DATABASE_URL: not a PostgreSQL DSN: names 2 hosts but target_session_attrs=prefer-standby",
        ),
        (
            {"ESTAFETA_DATABASE_URL": "host=a,b,c port=1,2 password=hunter2 target_session_attrs=read-write"},
            "ESTAFETA_DATABASE_URL: not a PostgreSQL DSN: 2 ports for 3 hosts",
        ),
        ({"ESTAFETA_LOCK_URL": "zookeeper://u:hunter2@h"}, "ESTAFETA_LOCK_URL: "),
        ({"ESTAFETA_RELAY_BATCH_SIZE": "lots"}, "ESTAFETA_RELAY_BATCH_SIZE: 'lots' is not a number"),
        ({"ESTAFETA_RELAY_BATCH_SIZE": "0"}, "ESTAFETA_RELAY_BATCH_SIZE: 0 is below the minimum 1"),
        ({"ESTAFETA_BROKR_URL": "stub://"}, "ESTAFETA_BROKR_URL: unknown setting"),
        ({"ESTAFETA_MIN_BACKOFF_MS": "10", "ESTAFETA_MAX_BACKOFF_MS": "5"}, "ESTAFETA_MAX_BACKOFF_MS: must not be"),
        ({"ESTAFETA_LOG_FORMAT": "xml"}, "ESTAFETA_LOG_FORMAT: 'xml' is not one of text, json"),
        ({"ESTAFETA_WAKEUP": "never"}, "ESTAFETA_WAKEUP: 'never' is not one of notify, after-commit, poll"),
        ({"ESTAFETA_METRICS_PORT": "70000"}, "ESTAFETA_METRICS_PORT: 70000 is not a TCP port"),
        ({"ESTAFETA_SAGA_STUCK_AFTER": "0"}, "ESTAFETA_SAGA_STUCK_AFTER: 0 is below the minimum"),
    ],
)
def test_bad_values_name_the_variable_in_one_line_without_the_password(environ: dict[str, str], expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(environ)
    message = str(caught.value)
    assert message.startswith(expected)
    assert "\n" not in message
    assert "hunter2" not in message


def test_a_toml_file_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    config = tmp_path / "estafeta.toml"
    config.write_text('broker_url = "redis://cache:6379/0"\nrelay_batch_size = 50\nlock_url = "postgres"\n')
    settings = Settings.from_env({"ESTAFETA_CONFIG": str(config), "ESTAFETA_RELAY_BATCH_SIZE": "70"})
    assert settings.broker_url == "redis://cache:6379/0"
    assert settings.relay_batch_size == 70


def test_an_unreadable_config_file_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="ESTAFETA_CONFIG: cannot read"):
        Settings.from_env({"ESTAFETA_CONFIG": str(tmp_path / "missing.toml")})
    broken = tmp_path / "broken.toml"
    broken.write_text("broker_url = ")
    with pytest.raises(SettingsError, match="not valid TOML"):
        Settings.from_env({"ESTAFETA_CONFIG": str(broken)})


def test_redacted_urls_keep_everything_but_the_password() -> None:
    assert redact_url("amqp://guest:secret@rabbit:5672/vhost") == "amqp://guest:***@rabbit:5672/vhost"
    assert redact_url("redis://cache:6379/0") == "redis://cache:6379/0"


def test_the_console_password_comes_from_a_variable_or_a_file_and_is_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "console-password"
    password = "hunter2 hunter2"
    secret.write_text(f"{password}\n", encoding="utf-8")
    from_file = Settings.from_env({"ESTAFETA_CONSOLE_PASSWORD_FILE": str(secret)})
    assert (
        from_file.console_password
        == Settings.from_env({"ESTAFETA_CONSOLE_PASSWORD": "hunter2 hunter2"}).console_password
    )
    assert from_file.console_password == "hunter2 hunter2" and "hunter2 hunter2" not in repr(from_file)
    assert Settings.from_env({}).console_password is None
    for environ, expected in [
        (
            {"ESTAFETA_CONSOLE_PASSWORD": "hunter2 hunter2", "ESTAFETA_CONSOLE_PASSWORD_FILE": str(secret)},
            "set only one",
        ),
        ({"ESTAFETA_CONSOLE_PASSWORD": " "}, "is empty"),
        ({"ESTAFETA_CONSOLE_PASSWORD": "hunter2"}, "is too short: .* at least 12 characters"),
        ({"ESTAFETA_CONSOLE_PASSWORD_FILE": str(tmp_path / "nope")}, "cannot read the password file"),
    ]:
        with pytest.raises(SettingsError, match=expected) as caught:
            Settings.from_env(environ)
        assert "hunter2" not in str(caught.value)


def test_a_multi_host_dsn_may_take_target_session_attrs_from_libpqs_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dsn = "host=db1,db2 dbname=shop"
    with pytest.raises(SettingsError, match="target_session_attrs=any"):
        Settings.from_env({"ESTAFETA_DATABASE_URL": dsn})
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "read-write")  # libpq reads it where the DSN says nothing
    assert Settings.from_env({"ESTAFETA_DATABASE_URL": dsn}).database_url == dsn


def test_the_rabbitmq_queue_type_sets_the_broker_declarations() -> None:
    assert Settings.from_env({}).broker_options == {}
    quorum = Settings.from_env(
        {"ESTAFETA_BROKER_URL": "amqp://u:secret@rabbit/shop", "ESTAFETA_RABBITMQ_QUEUE_TYPE": "Quorum",
         "ESTAFETA_MAX_DELIVERIES": "9"}
    )  # fmt: skip
    assert quorum.broker_options == {"queue_type": "quorum", "delivery_limit": 9}
    with pytest.raises(SettingsError) as not_rabbitmq:
        Settings.from_env({"ESTAFETA_BROKER_URL": "redis://:secret@cache/0", "ESTAFETA_RABBITMQ_QUEUE_TYPE": "quorum"})
    assert str(not_rabbitmq.value) == (
        "ESTAFETA_RABBITMQ_QUEUE_TYPE: quorum queues need a RabbitMQ broker (amqp://), not redis://:***@cache/0"
    )
    with pytest.raises(SettingsError, match="'mirrored' is not one of classic, quorum"):
        Settings.from_env({"ESTAFETA_RABBITMQ_QUEUE_TYPE": "mirrored"})


def test_a_rabbitmq_url_may_name_several_hosts() -> None:
    assert amqp_urls("amqp://u:secret@h1:5673,h2:5674,h3/shop?heartbeat=5") == [
        "amqp://u:secret@h1:5673/shop?heartbeat=5",
        "amqp://u:secret@h2:5674/shop?heartbeat=5",
        "amqp://u:secret@h3/shop?heartbeat=5",
    ]
    assert Settings.from_env({"ESTAFETA_BROKER_URL": "amqp://u:p@h1:5673,h2:5674/shop"}).broker_url
    for bad, why in (
        ("amqp://u:secret@h1:5673,,h2/shop", "a host is empty in amqp://u:***@h1:5673,,h2/shop"),
        ("amqp://u:secret@h1:5673,h2:x/shop", "not a URL (Port could not be cast to integer value as 'x')"),
    ):
        with pytest.raises(SettingsError) as raised:
            Settings.from_env({"ESTAFETA_BROKER_URL": bad})
        assert str(raised.value) == f"ESTAFETA_BROKER_URL: {why}"
