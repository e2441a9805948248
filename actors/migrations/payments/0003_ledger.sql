-- The payments ledger: each account becomes a stream of events in this schema's event store
-- (its tables come first, from sql/migrations/_events), and payments.accounts becomes the
-- ledger's projection, with the same columns, written by the payments steps in the
-- transaction that appends the events.
--
-- Every account that exists before the ledger gets one AccountOpened event carrying its
-- balance at the time of the migration (the history before it is not reconstructed), so the
-- replay of each stream equals its payments.accounts row from the start. The metadata says
-- where the event came from.
INSERT INTO streams (stream_id, type, version, last_tx_id, created_at, updated_at)
SELECT 'account-' || customer_id, 'Account', 1, pg_current_xact_id(), created_at, updated_at
  FROM accounts;

INSERT INTO events (stream_id, version, event_id, type, schema_version, data, metadata)
SELECT 'account-' || customer_id, 1, gen_random_uuid(), 'AccountOpened', 1,
       jsonb_build_object('customer_id', customer_id, 'balance_cents', balance_cents),
       jsonb_build_object('migrated_by', 'payments/0003_ledger.sql')
  FROM accounts
 ORDER BY customer_id;
