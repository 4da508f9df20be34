-- Retention (ledger/src/retention): finished runs, delivered events and old history are
-- deleted after the horizons `[retention]` sets; what a deleted run promised stays.
--
-- A tombstone per idempotency key of a deleted run's calls: the key (as its SHA-256, so
-- a copy of the database holds no order number or e-mail a key was made of), the run and
-- node that used it, the request's digest and how the call ended. A claim of a brand-new
-- key looks here first: a tombstoned key is refused (the outcome it would replay is gone,
-- and sending it again could execute twice at a downstream that still remembers it).
-- Tombstones expire `keys` after the run was deleted (`deleted_at`).
CREATE TABLE key_tombstones (
    tenant       TEXT   NOT NULL,
    workspace    TEXT   NOT NULL,
    key_hash     TEXT   NOT NULL,   -- sha256 hex of the base idempotency key
    run_id       TEXT   NOT NULL,
    node_id      TEXT   NOT NULL,
    request_hash TEXT   NOT NULL,
    outcome      TEXT   NOT NULL,   -- succeeded | failed
    used_at      BIGINT NOT NULL,   -- ms: when the run that used it finished
    deleted_at   BIGINT NOT NULL,   -- ms: when retention deleted that run
    PRIMARY KEY (tenant, workspace, key_hash)
);
-- query: tombstones past the `keys` horizon (their expiry).
CREATE INDEX key_tombstones_by_age ON key_tombstones (tenant, workspace, deleted_at);

-- query: finished runs oldest first (the retention candidates).
CREATE INDEX runs_by_finished ON runs (tenant, workspace, finished_at, id)
    WHERE finished_at IS NOT NULL;
-- query: is a workflow text still referenced (a stored text is deleted with its last run).
CREATE INDEX runs_by_workflow_hash ON runs (tenant, workspace, workflow_hash);
-- query: an event's deliveries, whichever the consumer (an event is deleted with them).
CREATE INDEX event_deliveries_by_event ON event_deliveries (tenant, workspace, event_id);
-- query: old published events.
CREATE INDEX published_events_by_age ON published_events (tenant, workspace, published_at);
-- query: schedule history past the horizon, whichever the schedule.
CREATE INDEX schedule_history_by_age ON schedule_history (tenant, workspace, recorded_at);
-- query: rate-limit windows long closed.
CREATE INDEX rate_counters_by_window ON rate_counters (tenant, workspace, window_start);
