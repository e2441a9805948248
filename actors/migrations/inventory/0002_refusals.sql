-- A refused reservation (unknown SKU, out of stock) leaves a 'refused' row of quantity 0
-- with the reason: the order's one decision, so a reservation retried late is refused too.
ALTER TABLE reservations DROP CONSTRAINT reservations_status_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_status_check
    CHECK (status IN ('reserved', 'released', 'refused'));
ALTER TABLE reservations ADD COLUMN reason text;
