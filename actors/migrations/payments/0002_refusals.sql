-- A refusal is the order's one decision: a charge refused (no account, not enough money)
-- leaves a 'refused' row of 0 cents with the reason, so that any later attempt to charge
-- the order (an earlier send of the command, retried late) is refused too instead of
-- charging an order its saga has cancelled.
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check CHECK (status IN ('charged', 'refunded', 'refused'));
ALTER TABLE payments ADD COLUMN reason text;
