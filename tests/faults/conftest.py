"""The fault harness as a fixture: a network of namespaces, deleted after the test, also when it fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .network import Network, network


@pytest.fixture
def net() -> Iterator[Network]:
    with network() as created:
        yield created
