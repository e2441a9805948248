-- What the eventsourcing library's recorders need beyond the event store (_events), for apps
-- that keep their events in estafeta's store (estafeta.eventsourcing). Applied with
-- search_path set to the service's schema, like _events.

-- A follower's position in each upstream application's log: one row per upstream, whose
-- notification id only ever grows (the library's "single-row tracking"). Written in the
-- transaction that records what the follower did with that notification.
CREATE TABLE eventsourcing_tracking (
    application_name text        PRIMARY KEY,
    notification_id  bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The library's snapshots, byte for byte (its own format, often compressed or encrypted):
-- estafeta's `snapshots` table keys states by aggregate class and schema version instead.
CREATE TABLE eventsourcing_snapshots (
    originator_id      text   NOT NULL,
    originator_version bigint NOT NULL,
    topic              text   NOT NULL,
    state              bytea  NOT NULL,
    PRIMARY KEY (originator_id, originator_version)
);
