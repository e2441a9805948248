-- How many of a row's attempts the broker turned away for now (a RabbitMQ nack: a full
-- reject-publish queue, a queue whose node is down), out of `attempts`. Those count for the
-- row's backoff, never toward parking it: a row is parked after ESTAFETA_RELAY_MAX_ATTEMPTS
-- refusals (`attempts - deferrals`), however long an outage deferred it before. A column
-- with a constant default rewrites nothing.
ALTER TABLE outbox ADD COLUMN deferrals int NOT NULL DEFAULT 0;
