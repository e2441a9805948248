"""The factory's environment: bad values are refused with the variable named; building it touches no database."""

from __future__ import annotations

import pytest

from tests.es_interop.support import require_eventsourcing

require_eventsourcing()

from eventsourcing.persistence import InfrastructureFactory, InfrastructureFactoryError, Mapper  # noqa: E402

from estafeta.eventsourcing import Factory  # noqa: E402

#: Nothing listens on port 1: any connection attempt would fail.
NOWHERE = "postgresql://nobody@127.0.0.1:1/none"


def test_the_persistence_module_names_the_factory() -> None:
    factory = InfrastructureFactory.construct(
        {"PERSISTENCE_MODULE": "estafeta.eventsourcing", "ESTAFETA_DATABASE_URL": NOWHERE, "ESTAFETA_SCHEMA": "bank"}
    )
    assert isinstance(factory, Factory)
    # the library builds factories just for their mappers (a follower, for each leader): no connection
    assert isinstance(factory.mapper(), Mapper)
    factory.close()


GOOD = {"ESTAFETA_DATABASE_URL": NOWHERE, "ESTAFETA_SCHEMA": "bank"}


@pytest.mark.parametrize(
    ("env", "complaint"),
    [
        ({"ESTAFETA_SCHEMA": "bank"}, "ESTAFETA_DATABASE_URL is not set"),
        ({"ESTAFETA_DATABASE_URL": NOWHERE}, "ESTAFETA_SCHEMA is not set"),
        ({**GOOD, "ESTAFETA_SCHEMA": "Bank; DROP"}, "ESTAFETA_SCHEMA='Bank; DROP' is not a service schema name"),
        ({**GOOD, "ESTAFETA_ORIGINATOR_ID_TYPE": "int"}, "ESTAFETA_ORIGINATOR_ID_TYPE='int': expected uuid or text"),
        ({**GOOD, "ESTAFETA_POOL_SIZE": "0"}, "ESTAFETA_POOL_SIZE='0': expected a whole number >= 1"),
        ({**GOOD, "ESTAFETA_NOTIFICATION_TIMEOUT": "soon"}, "ESTAFETA_NOTIFICATION_TIMEOUT='soon': expected a number"),
    ],
)
def test_bad_settings_are_refused_by_name(env: dict[str, str], complaint: str) -> None:
    with pytest.raises(InfrastructureFactoryError) as refused:
        Factory(env)
    assert str(refused.value).startswith(complaint)
    assert "\n" not in str(refused.value)
