-- What became of a dead letter: still parked for an operator, replayed (through the outbox,
-- under a new message id: replayed_as), or obsolete (a saga command whose saga has moved on;
-- note says why). A dead letter is resolved once: replaying it twice has one effect.
ALTER TABLE dead_letters
    ADD COLUMN status text NOT NULL DEFAULT 'parked' CHECK (status IN ('parked', 'replayed', 'obsolete')),
    ADD COLUMN resolved_at timestamptz,
    ADD COLUMN replayed_as uuid,
    ADD COLUMN note text;
CREATE INDEX dead_letters_parked ON dead_letters (id) WHERE status = 'parked';
