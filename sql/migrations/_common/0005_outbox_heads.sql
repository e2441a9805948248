-- Indexes that let the relay find the heads of unblocked keys however many rows of a
-- blocked key come first (sql/outbox.py, claim_batch). Small: each holds only a sliver of
-- the outbox.

-- Keyless pending rows, in id order: found without reading any keyed row.
CREATE INDEX outbox_pending_keyless ON outbox (id) WHERE status = 'pending' AND ordering_key IS NULL;
-- Rows that were refused at least once: a key's first failed or backing-off row (what
-- blocks the rest of the key) in one probe, instead of a walk through the key's rows.
CREATE INDEX outbox_refused ON outbox (ordering_key, id) WHERE attempts > 0 OR status = 'failed';
