-- flow ledger schema, SQLite flavour. The PostgreSQL file has the same tables, columns
-- and indexes; only column types differ where the dialects do (BIGINT ms timestamps and
-- JSON-as-TEXT are the same in both, so no predicate depends on the dialect).
-- Every row carries tenant and workspace; every query filters by them.

-- The runs, and the queue: a queued run is a row with status 'queued'.
CREATE TABLE runs (
    tenant           TEXT    NOT NULL,
    workspace        TEXT    NOT NULL,
    id               TEXT    NOT NULL,
    workflow_name    TEXT    NOT NULL,
    workflow_text    TEXT    NOT NULL,  -- snapshot of the YAML the run started with
    workflow_hash    TEXT    NOT NULL,
    inputs           TEXT    NOT NULL,  -- JSON
    inputs_hash      TEXT    NOT NULL,  -- canonical hash, for idempotent enqueue
    status           TEXT    NOT NULL,
    priority         BIGINT  NOT NULL DEFAULT 0,
    not_before       BIGINT  NOT NULL,  -- ms; = created_at when not delayed
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    worker           TEXT,              -- lease holder (host:pid:start)
    lease_token      BIGINT  NOT NULL DEFAULT 0,  -- fencing token, +1 per claim
    lease_expires_at BIGINT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    pause_reason     TEXT,
    output           TEXT,              -- JSON
    error            TEXT,
    PRIMARY KEY (tenant, workspace, id)
);
-- query: next runnable run (claim_next: queued and not_before <= now, by priority).
CREATE INDEX runs_next_runnable ON runs (tenant, workspace, status, priority DESC, not_before, created_at);
-- query: expired leases (claim_next reclaim, expire_dead_local_workers).
CREATE INDEX runs_expired_leases ON runs (tenant, workspace, status, lease_expires_at);

-- One row per attempt of a node: `node` for the first, `node_retry<n>` for retry n.
CREATE TABLE steps (
    tenant        TEXT   NOT NULL,
    workspace     TEXT   NOT NULL,
    run_id        TEXT   NOT NULL,
    step_id       TEXT   NOT NULL,
    node_id       TEXT   NOT NULL,
    retry         BIGINT NOT NULL DEFAULT 0,
    status        TEXT   NOT NULL,
    not_before    BIGINT,                -- durable backoff: not started before this
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    started_at    BIGINT,
    finished_at   BIGINT,
    output        TEXT,                  -- JSON
    error_kind    TEXT,
    error_message TEXT,
    tool_call_id  TEXT,
    PRIMARY KEY (tenant, workspace, run_id, step_id),
    FOREIGN KEY (tenant, workspace, run_id) REFERENCES runs (tenant, workspace, id)
);
-- query: steps waiting on a call (pause on in_doubt, resolve).
CREATE INDEX steps_by_call ON steps (tenant, workspace, run_id, tool_call_id);

-- The at-most-once ledger: one row per (run, node), stable across the node's steps.
CREATE TABLE tool_calls (
    tenant              TEXT   NOT NULL,
    workspace           TEXT   NOT NULL,
    run_id              TEXT   NOT NULL,
    tool_call_id        TEXT   NOT NULL,   -- = node id
    step_id             TEXT   NOT NULL,   -- the step that last claimed it
    tool                TEXT   NOT NULL,
    idempotency_key     TEXT   NOT NULL,   -- base key; attempt n sends "<key>:<n>"
    request             TEXT   NOT NULL,   -- JSON, redacted (secret names only)
    request_hash        TEXT   NOT NULL,   -- canonical hash of the request
    status              TEXT   NOT NULL,
    attempt_count       BIGINT NOT NULL,   -- effect attempts started
    outbound_requests   BIGINT NOT NULL DEFAULT 0,  -- requests known to have been sent
    lease_holder        TEXT,
    lease_token         BIGINT NOT NULL DEFAULT 0,  -- fencing token of the call lease
    run_token           BIGINT NOT NULL DEFAULT 0,  -- run lease token the holder claimed under
    lease_expires_at    BIGINT,
    outbound_started_at BIGINT,
    in_doubt_at         BIGINT,
    output              TEXT,              -- JSON
    error_kind          TEXT,
    error_message       TEXT,
    resolution          TEXT,              -- succeeded | failed | retry (operator)
    resolved_by         TEXT,
    resolved_at         BIGINT,
    resolution_note     TEXT,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL,
    finished_at         BIGINT,
    -- query: call by id (claim_call, mark_outbound, complete_call: the primary key).
    PRIMARY KEY (tenant, workspace, run_id, tool_call_id),
    FOREIGN KEY (tenant, workspace, run_id) REFERENCES runs (tenant, workspace, id)
);
-- query: call by key (claim_call cross-run idempotency; unique per DESIGN section 7).
CREATE UNIQUE INDEX tool_calls_by_key ON tool_calls (tenant, workspace, idempotency_key);
-- query: expired leases (takeover scans, expire_dead_local_workers).
CREATE INDEX tool_calls_expired_leases ON tool_calls (tenant, workspace, status, lease_expires_at);

-- One row per effect attempt that reached an outcome (known or unknown).
CREATE TABLE tool_call_attempts (
    tenant              TEXT   NOT NULL,
    workspace           TEXT   NOT NULL,
    id                  TEXT   NOT NULL,   -- att_<ULID>
    run_id              TEXT   NOT NULL,
    tool_call_id        TEXT   NOT NULL,
    step_id             TEXT   NOT NULL,
    attempt             BIGINT NOT NULL,
    sent_key            TEXT   NOT NULL,   -- "<base>:<attempt>"
    outbound_started_at BIGINT,
    finished_at         BIGINT NOT NULL,
    outcome             TEXT   NOT NULL,   -- succeeded | failed | unknown
    error_kind          TEXT,
    error_message       TEXT,
    requests_sent       BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, id)
);
-- query: attempts of a run (list_attempts, flow show).
CREATE INDEX tool_call_attempts_by_run ON tool_call_attempts (tenant, workspace, run_id, tool_call_id, attempt);

-- One row per request sent (fix 11/12: usage counts requests, not invocations).
CREATE TABLE usage (
    tenant       TEXT   NOT NULL,
    workspace    TEXT   NOT NULL,
    id           TEXT   NOT NULL,          -- use_<ULID>
    run_id       TEXT   NOT NULL,
    tool_call_id TEXT   NOT NULL,
    tool         TEXT   NOT NULL,
    attempt      BIGINT NOT NULL,
    sent_key     TEXT   NOT NULL,
    kind         TEXT   NOT NULL,          -- 'request'
    quantity     BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, id)
);
-- query: usage of a run (list_usage).
CREATE INDEX usage_by_run ON usage (tenant, workspace, run_id);

-- Fixed-window counters for rate limits and daily quotas, shared by all workers.
CREATE TABLE rate_counters (
    tenant       TEXT   NOT NULL,
    workspace    TEXT   NOT NULL,
    key          TEXT   NOT NULL,
    window_kind  TEXT   NOT NULL,          -- minute | day
    window_start BIGINT NOT NULL,          -- ms, aligned to the UTC minute / day
    count        BIGINT NOT NULL,
    -- query: counter of a window (rate_acquire upsert).
    PRIMARY KEY (tenant, workspace, key, window_kind, window_start)
);

-- Events, written in the same transaction as the state change they report.
CREATE TABLE outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,  -- delivery order
    tenant       TEXT   NOT NULL,
    workspace    TEXT   NOT NULL,
    id           TEXT   NOT NULL UNIQUE,  -- evt_<ULID>, what consumers dedupe on
    type         TEXT   NOT NULL,
    time         BIGINT NOT NULL,
    run_id       TEXT,
    step_id      TEXT,
    tool_call_id TEXT,
    payload      TEXT   NOT NULL           -- JSON, no secret values
);
-- query: due outbox rows (dispatcher: events after a consumer's checkpoint, in order).
CREATE INDEX outbox_due ON outbox (tenant, workspace, seq);
-- query: events of a run (list_events, flow show).
CREATE INDEX outbox_by_run ON outbox (tenant, workspace, run_id, seq);

-- Per-consumer delivery state of each event (consumer checkpoint; at least once).
CREATE TABLE event_deliveries (
    tenant          TEXT   NOT NULL,
    workspace       TEXT   NOT NULL,
    consumer        TEXT   NOT NULL,
    event_id        TEXT   NOT NULL,
    status          TEXT   NOT NULL,       -- pending | delivered | dead
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error      TEXT,
    leased_by       TEXT,
    leased_until    BIGINT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, consumer, event_id)
);
-- query: due deliveries (dispatcher: pending and next_attempt_at <= now).
CREATE INDEX event_deliveries_due ON event_deliveries (tenant, workspace, status, next_attempt_at);
