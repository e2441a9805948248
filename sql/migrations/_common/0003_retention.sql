-- What pruning looks rows up by (estafeta prune, and the workers' periodic pruner).
-- The inbox keeps the record of a message while its dead letter is there: found by
-- consumer and message id.
CREATE INDEX dead_letters_message ON dead_letters (consumer, message_id);
CREATE INDEX dead_letters_created_at ON dead_letters (created_at);
CREATE INDEX inbox_attempts_last_attempt_at ON inbox_attempts (last_attempt_at);
CREATE INDEX fences_raised_at ON fences (raised_at);
