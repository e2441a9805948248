-- The ping service: the smallest real round trip through outbox, relay, broker and inbox.
CREATE TABLE pingpong.pings (
    ping_id   uuid        PRIMARY KEY,
    sent_at   timestamptz NOT NULL,
    pinged_at timestamptz NOT NULL DEFAULT now(),
    ponged_at timestamptz,
    -- How many times the pong step ran its effect: exactly-once means this stays at 1.
    pongs     int         NOT NULL DEFAULT 0
);
