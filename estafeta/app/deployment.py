"""Which deployment this process belongs to: the name its relays stamp on every message.

Two deployments of one app (staging and production, two tenants, a demo) sharing a broker
namespace (a RabbitMQ vhost, a Redis namespace, Kafka topics) would consume each other's
messages, and a step would run another deployment's command against its own tables. What
makes a deployment one is its databases: every process writing the same tables is the same
deployment, whatever app it binds (a CLI, workers of a part of the app) and whatever address
reaches them. So, unless ``ESTAFETA_DEPLOYMENT`` names it, a deployment's name is its default
database's name and a hash of the identity (``system_identifier`` and name) of every database
its settings name: ``shop~3f9c2a1e``. It is asked of the databases once per process.
"""

from __future__ import annotations

import hashlib
import threading
import weakref

from estafeta.app.runtime import Runtime
from estafeta_sql.deployments import database_identity

#: The names found so far in this process, by the DSNs they were derived from, and by runtime
#: (a worker asks for every message it receives).
_derived: dict[tuple[str, ...], str] = {}
_known: weakref.WeakKeyDictionary[Runtime, str] = weakref.WeakKeyDictionary()
_mutex = threading.Lock()


def deployment_name(runtime: Runtime) -> str:
    """This deployment's name: ``ESTAFETA_DEPLOYMENT``, or derived from its databases (see the module).

    Raises :class:`estafeta_sql.errors.DatabaseUnavailable` when a database must be asked and cannot be
    reached (the next call asks again).
    """
    if runtime.settings.deployment:
        return runtime.settings.deployment
    with _mutex:
        found = _known.get(runtime)
    if found is not None:
        return found
    dsns = tuple(runtime.dsns())
    with _mutex:
        found = _derived.get(dsns)
    if found is None:
        found = derived_name(dsns)
    with _mutex:
        _derived[dsns] = _known[runtime] = found
    return found


def derived_name(dsns: tuple[str, ...]) -> str:
    """The name of the deployment whose databases are ``dsns`` (the default one first), asking each."""
    identities = [database_identity(dsn) for dsn in dsns]
    text = "\n".join(f"{i.system_identifier}/{i.database}" for i in sorted(set(identities)))
    return f"{identities[0].database}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"
