-- What each outbox row holds: the command's or event's class (`module.Class`, e.g.
-- `actors.orders.ConfirmOrder`), written by every insert, so an operator can ask which
-- messages of a type wait and since when (`estafeta outbox stats --by-type`). Rows
-- written before this migration keep NULL (shown as "(unknown)"). Adding a nullable
-- column without a default rewrites nothing. No index: the breakdown reads the whole
-- outbox, like the other stats, and an index would cost every insert.
ALTER TABLE outbox ADD COLUMN message_type text;
