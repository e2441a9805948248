-- The event store is append-only: UPDATE and DELETE on `events` are refused, unless the
-- transaction says it rewrites history on purpose (pruning, crypto-shredding) with
--     SET LOCAL estafeta.events_rewrite = 'on'
-- (sql/event_store.py: allow_rewrite). A transaction-local setting, not a role: the
-- services run as the owner of their schema, and privileges never bind a table's owner
-- (it can grant them back to itself); a setting that ends with its transaction cannot leak
-- to the next user of a pooled connection, and the code that rewrites says so where it does.
-- A guard against mistakes, not a security boundary: for that, run the services as a role
-- that does not own the schema and grant it only SELECT and INSERT on `events`.
-- TRUNCATE and DROP are not row changes and pass (test wipes, dropping a schema).

CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('estafeta.events_rewrite', true) = 'on' THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    RAISE EXCEPTION '% on %.% refused: the event store is append-only', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation',
              HINT = 'to prune or crypto-shred events on purpose, run SET LOCAL estafeta.events_rewrite = ''on'''
                     ' first in the same transaction';
END
$$;

-- A row trigger: on a partitioned `events` (sql/migrations/_events_partitioned) it is cloned
-- onto every partition, so a statement aimed at one partition is refused too.
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();
