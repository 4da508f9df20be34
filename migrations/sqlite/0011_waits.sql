-- Waits: a node that completes from outside (ledger/src/waits). One row per (run, node):
-- a `wait:` node waits for a published event whose data its `match` accepts; a node with
-- `callback:` sends its call and then waits for `POST /api/v1/callbacks/{token}`.
--
-- `status` moves by one compare-and-set from `pending` to exactly one of `completed`,
-- `failed` (a callback said `ok: false`), `timed_out`, `cancelled` (the run finished):
-- an event, a callback, the deadline and a cancel race there; the loser changes nothing.
-- `deadline` is when the sweep times it out: `hard_deadline` (began + timeout), or
-- sooner when a heartbeat is due. `signal` counts events published under `event_name`
-- since the wait began; `seen_signal` is the count the run's worker last looked at, so
-- a worker never pauses a run over an event it has not looked at. `begin_seq` is the
-- name's last event `seq` when the wait began (every later event is a candidate,
-- whatever the clocks say); `seen_seq` is how far the worker has read.
CREATE TABLE waits (
    tenant          TEXT   NOT NULL,
    workspace       TEXT   NOT NULL,
    run_id          TEXT   NOT NULL,
    node_id         TEXT   NOT NULL,
    step_id         TEXT   NOT NULL,   -- the step that waits
    kind            TEXT   NOT NULL,   -- event | callback
    status          TEXT   NOT NULL,   -- pending | completed | failed | timed_out | cancelled
    event_name      TEXT,
    matcher         TEXT,              -- the `match` expression as written (for views)
    lookback_ms     BIGINT NOT NULL DEFAULT 0,
    began_at        BIGINT NOT NULL,
    deadline        BIGINT NOT NULL,
    hard_deadline   BIGINT NOT NULL,
    heartbeat_ms    BIGINT,
    last_beat_at    BIGINT,
    signal          BIGINT NOT NULL DEFAULT 0,
    seen_signal     BIGINT NOT NULL DEFAULT 0,
    begin_seq       BIGINT NOT NULL DEFAULT 0,
    seen_seq        BIGINT NOT NULL DEFAULT 0,
    settled_at      BIGINT,
    settled_by      TEXT,
    event_id        TEXT,              -- the event that completed it
    output          TEXT,              -- JSON: the event's data or the callback's output
    error           TEXT,
    PRIMARY KEY (tenant, workspace, run_id, node_id),
    FOREIGN KEY (tenant, workspace, run_id) REFERENCES runs (tenant, workspace, id)
);
-- query: pending waits by deadline (the daemons' timeout sweep, views, the gauge).
CREATE INDEX waits_pending ON waits (tenant, workspace, status, deadline);
-- query: the pending waits a published event signals.
CREATE INDEX waits_by_event ON waits (tenant, workspace, event_name, status);

-- A callback's token, stored as its SHA-256 only: the token is the credential, and a
-- copy of the database must not hold one. Each render of a callback node's call mints
-- one (a crash before the send mints another; the first that comes back wins).
CREATE TABLE callback_tokens (
    token_hash TEXT   NOT NULL PRIMARY KEY,
    tenant     TEXT   NOT NULL,
    workspace  TEXT   NOT NULL,
    run_id     TEXT   NOT NULL,
    node_id    TEXT   NOT NULL,
    step_id    TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);
-- query: a run's tokens (deleted with the run by retention).
CREATE INDEX callback_tokens_by_run ON callback_tokens (tenant, workspace, run_id);

-- Events published from outside (`POST /api/v1/events:publish`, `flow publish`) for
-- `wait:` nodes to match. `event_id` makes a publish idempotent: the same id twice is
-- one event. `seq` counts the events of one name (1, 2, …), assigned under the name's
-- lock: a wait reads its candidates in `seq` order from where it stopped.
CREATE TABLE published_events (
    tenant       TEXT   NOT NULL,
    workspace    TEXT   NOT NULL,
    event_id     TEXT   NOT NULL,
    name         TEXT   NOT NULL,
    seq          BIGINT NOT NULL,
    data         TEXT   NOT NULL,   -- JSON
    published_at BIGINT NOT NULL,
    published_by TEXT,
    PRIMARY KEY (tenant, workspace, event_id)
);
-- query: a wait's candidates, by name from where it stopped reading.
CREATE UNIQUE INDEX published_events_by_seq ON published_events (tenant, workspace, name, seq);
-- query: where a new wait starts reading (its name's events from `began_at - lookback`).
CREATE INDEX published_events_by_time ON published_events (tenant, workspace, name, published_at);
