"""A library's lending desk: an event-sourced aggregate of the app's own, its projection, two services.

``lending`` keeps each book as a stream of events (``BookAdded``, ``BookLent``,
``BookReturned``); the ``Book`` aggregate is their replay. Its ``LendBook`` step loads the
book, records the loan, saves it and sends ``ScheduleReminder`` to the ``reminders``
service: the events, the step's inbox row and that outbox row commit in one transaction,
or none of them do. ``books_on_loan`` is a projection of the events. The README's "A
worked example: an event-sourced service of your own" quotes this module.

``dramatiq examples.lending`` serves both services; ``estafeta --app examples.lending``
manages them (``migrate``, ``projections status``, ``events show book-ID``...).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import attrs
import psycopg

from estafeta import (
    Aggregate,
    App,
    BusinessFailure,
    EventRegistry,
    Projection,
    ProjectionContext,
    RecordedEvent,
    Repository,
    Service,
    StepContext,
    applies,
    handles,
)

events = EventRegistry()


@events.event("BookAdded")
@attrs.frozen
class BookAdded:
    """A book was put on the shelf."""

    title: str


@events.event("BookLent")
@attrs.frozen
class BookLent:
    """A member borrowed the book until ``due``."""

    member: str
    due: datetime


@events.event("BookReturned")
@attrs.frozen
class BookReturned:
    """The member gave the book back."""

    member: str


@attrs.define
class Book(Aggregate):
    """One copy of a book: lent to one member at a time."""

    snapshot_every = 50

    title: str = ""
    borrower: str | None = None
    loans: int = 0  # the number of the current (or last) loan

    @classmethod
    def add(cls, book_id: str, title: str) -> Book:
        """A new book (saved, it refuses a second ``add`` of the same id: its stream exists)."""
        book = cls.new(f"book-{book_id}")
        book.record(BookAdded(title))
        return book

    def lend(self, member: str, due: datetime) -> None:
        """Lend the book to ``member``; refused while someone else has it."""
        if self.borrower is not None:
            raise BusinessFailure(f"{self.title!r} is on loan to {self.borrower}")
        self.record(BookLent(member, due))

    def give_back(self) -> None:
        """The borrower returns the book; refused if it is on the shelf."""
        if self.borrower is None:
            raise BusinessFailure(f"{self.title!r} is not on loan")
        self.record(BookReturned(self.borrower))

    @applies(BookAdded)
    def _added(self, event: BookAdded) -> None:
        self.title = event.title

    @applies(BookLent)
    def _lent(self, event: BookLent) -> None:
        self.borrower, self.loans = event.member, self.loans + 1

    @applies(BookReturned)
    def _returned(self, event: BookReturned) -> None:
        self.borrower = None


class BooksOnLoan(Projection):
    """Which books are out, to whom, until when: a row per book on loan."""

    name = "books_on_loan"
    tables: ClassVar[dict[str, str]] = {
        "books_on_loan": "CREATE TABLE {books_on_loan}"
        " (book_id text PRIMARY KEY, member text NOT NULL, due timestamptz NOT NULL)"
    }

    @handles(BookLent)
    def lent(self, ctx: ProjectionContext, recorded: RecordedEvent[BookLent]) -> None:
        """The book leaves the shelf."""
        ctx.execute(
            "INSERT INTO {books_on_loan} VALUES (%s, %s, %s)",
            (book_id(recorded.stream_id), recorded.event.member, recorded.event.due),
        )

    @handles(BookReturned)
    def returned(self, ctx: ProjectionContext, recorded: RecordedEvent[BookReturned]) -> None:
        """The book is back."""
        ctx.execute("DELETE FROM {books_on_loan} WHERE book_id = %s", (book_id(recorded.stream_id),))


def book_id(stream_id: str) -> str:
    """The book id of a book's stream id (``book-42`` -> ``42``)."""
    return stream_id.removeprefix("book-")


lending = Service("lending")  # no tables of its own: use_events adds the store's, the projection its own
store = lending.use_events(events, aggregates=[Book])
lending.projection(BooksOnLoan())
reminders = Service("reminders", migrations=Path(__file__).parent / "migrations" / "reminders")
app = App("lending", services=[lending, reminders])


@attrs.frozen
class LendBook:
    """Lend book ``book_id`` to ``member`` for ``days`` days."""

    book_id: str
    member: str
    days: int = 21


@attrs.frozen
class ReturnBook:
    """Book ``book_id`` is back."""

    book_id: str


@attrs.frozen
class ScheduleReminder:
    """Remind ``member`` to bring back book ``book_id`` (its ``loan``-th loan) by ``due``."""

    book_id: str
    loan: int
    member: str
    due: datetime


@attrs.frozen
class CancelReminder:
    """No reminder for that loan any more: the book is back."""

    book_id: str
    loan: int


# No lock=: two loans of one book race on the book's stream version. The second save
# conflicts, the step rolls back, Dramatiq retries it and the retry finds the book out.
@lending.step(LendBook)
def lend_book(ctx: StepContext, command: LendBook) -> None:
    """Record the loan and ask for its reminder: the events, the inbox row and the outbox row commit together."""
    book = ctx.events.get(Book, f"book-{command.book_id}")
    if book is None:
        raise BusinessFailure(f"there is no book {command.book_id}")
    due = datetime.now(UTC) + timedelta(days=command.days)
    book.lend(command.member, due)
    ctx.events.save(book)  # BookLent, expecting the version loaded above, and ...
    ctx.send(ScheduleReminder(command.book_id, book.loans, command.member, due))  # ... this: one transaction


@lending.step(ReturnBook)
def return_book(ctx: StepContext, command: ReturnBook) -> None:
    """Record the return and cancel the loan's reminder, in one transaction."""
    book = ctx.events.get(Book, f"book-{command.book_id}")
    if book is None:
        raise BusinessFailure(f"there is no book {command.book_id}")
    book.give_back()
    ctx.events.save(book)
    ctx.send(CancelReminder(command.book_id, book.loans))


@reminders.step(ScheduleReminder)
def schedule_reminder(ctx: StepContext, command: ScheduleReminder) -> None:
    """Note the reminder (a cancellation that arrived first keeps it cancelled)."""
    ctx.conn.execute(
        "INSERT INTO reminders.reminders (book_id, loan, member, due) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (book_id, loan) DO UPDATE SET member = excluded.member, due = excluded.due",
        (command.book_id, command.loan, command.member, command.due),
    )


@reminders.step(CancelReminder)
def cancel_reminder(ctx: StepContext, command: CancelReminder) -> None:
    """Cancel the loan's reminder, whether its schedule arrived yet or not."""
    ctx.conn.execute(
        "INSERT INTO reminders.reminders (book_id, loan, cancelled) VALUES (%s, %s, true)"
        " ON CONFLICT (book_id, loan) DO UPDATE SET cancelled = true",
        (command.book_id, command.loan),
    )


def add_book(conn: psycopg.Connection[Any], book_id: str, title: str) -> None:
    """Put a new book on the shelf, in the caller's transaction (outside any step)."""
    Repository(store, Book).save(conn, Book.add(book_id, title))


#: ``dramatiq examples.lending`` imports this module: bind the app to ESTAFETA_BROKER_URL's broker.
broker = app.bind().broker
