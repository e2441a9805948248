-- The reminders service of the lending example: one reminder per loan of a book.
-- A loan's ScheduleReminder and CancelReminder come from two different steps and may be
-- processed in either order, so either one may create the row: member and due stay NULL
-- until the schedule arrives, and a cancelled reminder stays cancelled.
CREATE TABLE reminders (
    book_id   text        NOT NULL,
    loan      int         NOT NULL,
    member    text,
    due       timestamptz,
    cancelled boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (book_id, loan)
);
