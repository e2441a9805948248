-- A hand-off's row (ESTAFETA_HANDOFFS: attempts -1, leased from the relays, see
-- insert_outbox_handoff in sql/queries.sql) holds back its key's later rows as a refused
-- row does, so the index of a key's first blocking row (0005) holds it too. Rebuilt in the
-- migration's transaction: writes to the outbox wait for it (an outbox is small).
DROP INDEX outbox_refused;
CREATE INDEX outbox_refused ON outbox (ordering_key, id) WHERE attempts <> 0 OR status = 'failed';
