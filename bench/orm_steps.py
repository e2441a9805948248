"""Three steps that make the same change, for ``python -m bench.step_cost --orm``: what an ORM session adds.

- ``ormbench.by_sql``: ``UPDATE ... SET value = value + n`` on ``ctx.conn``;
- ``ormbench.by_orm_update``: the same ``UPDATE``, as an ORM statement on
  ``estafeta.sqlalchemy.session(ctx)`` (the session's own cost, nothing else);
- ``ormbench.by_unit_of_work``: ``session.get`` then ``counter.value += n`` (a ``SELECT``, then
  the ``UPDATE`` of the flush at the step's end): how ORM code is usually written.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import attrs
from sqlalchemy import update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from estafeta import App, Service, StepContext
from estafeta.sqlalchemy import session

service = Service("ormbench", migrations=Path(__file__).parent / "orm_migrations")
app = App("ormbench", services=[service])


class Base(DeclarativeBase):
    pass


class Counter(Base):
    """A row of ``ormbench.counters``."""

    __tablename__ = "counters"
    __table_args__ = {"schema": "ormbench"}

    counter_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


@attrs.frozen
class BySql:
    counter_id: uuid.UUID
    n: int


@attrs.frozen
class ByOrmUpdate:
    counter_id: uuid.UUID
    n: int


@attrs.frozen
class ByUnitOfWork:
    counter_id: uuid.UUID
    n: int


@service.step(BySql)
def by_sql(ctx: StepContext, command: BySql) -> None:
    ctx.conn.execute(
        "UPDATE ormbench.counters SET value = value + %s WHERE counter_id = %s", (command.n, command.counter_id)
    )


@service.step(ByOrmUpdate)
def by_orm_update(ctx: StepContext, command: ByOrmUpdate) -> None:
    change = update(Counter).where(Counter.counter_id == command.counter_id).values(value=Counter.value + command.n)
    session(ctx).execute(change)


@service.step(ByUnitOfWork)
def by_unit_of_work(ctx: StepContext, command: ByUnitOfWork) -> None:
    counter = session(ctx).get(Counter, command.counter_id)
    assert counter is not None
    counter.value += command.n


#: The commands, by the step that handles them.
COMMANDS = {"ormbench.by_sql": BySql, "ormbench.by_orm_update": ByOrmUpdate, "ormbench.by_unit_of_work": ByUnitOfWork}
