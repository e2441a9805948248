"""The deployment a message comes from, carried in its Dramatiq ``options``.

A relay stamps the name of its deployment on every row it publishes (an unknown top-level
field would make the message undecodable, so it goes in ``options``, as the saga id and
the trace context do). A worker of another deployment parks the message instead of
running it (``estafeta.steps.foreign``). The name comes from the caller: ``brokers`` reads
no settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from estafeta_sql.outbox import OutboxRow

#: The key of ``Message.options`` naming the deployment whose relay published the message.
DEPLOYMENT_OPTION = "deployment"

#: Where a relay learns its deployment's name when it first needs it (it may ask the databases).
DeploymentName = Callable[[], str]


def stamp(rows: Sequence[OutboxRow], deployment: DeploymentName | None) -> None:
    """Name ``deployment`` in the options of each of ``rows`` (freshly claimed) that names none yet.

    A row that names one already keeps it: a dead letter replayed into an outbox goes out as
    the deployment that first sent it. Changes the rows' message dicts in place (built for
    this batch alone), so every publisher encodes the same bytes from them.
    """
    if deployment is None or not rows:
        return
    name = deployment()
    for row in rows:
        # A message that is not an object (written by hand, or by a bug) is left as it is: its
        # encoding fails for that row alone, and the rest of the batch goes on.
        options = row.message.setdefault("options", {}) if isinstance(row.message, dict) else None
        if isinstance(options, dict):
            options.setdefault(DEPLOYMENT_OPTION, name)
