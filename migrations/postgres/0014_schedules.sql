-- Schedules (engine/src/schedule/, ledger/src/schedules.rs). One row per schedule of
-- flow.toml: its definition as a daemon last saw it (JSON, with who changed it and
-- when), whether it is paused, and its cursor: the last tick handled. A daemon handles
-- the ticks after the cursor in one transaction that moves the cursor only if it still
-- holds the value the daemon read (compare-and-set), so however many daemons try,
-- each tick is handled once; each started tick's run id is derived from the schedule
-- and the tick, and inserted with the queue's idempotent start besides.
-- `buffered_at`: with `overlap: buffer_one`, the one tick that waits for the previous
-- run to end.
CREATE TABLE schedules (
    tenant       TEXT    NOT NULL,
    workspace    TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    definition   TEXT    NOT NULL,
    def_hash     TEXT    NOT NULL,
    paused       BOOLEAN NOT NULL DEFAULT FALSE,
    cursor_at    BIGINT  NOT NULL,
    last_run_id  TEXT,
    buffered_at  BIGINT,
    changed_at   BIGINT  NOT NULL,
    changed_by   TEXT    NOT NULL,
    PRIMARY KEY (tenant, workspace, id)
);

-- What became of each tick, and what was done to the schedule: `started` (its run),
-- `skipped_overlap` (the previous run was unfinished), `missed` (a range of ticks from
-- `tick_at` to `last_at`, `count` of them, older than the catch-up window when a daemon
-- came to them), `triggered` (a run started by hand), `paused`, `resumed`, `changed`
-- (a new definition; `detail` says what) and `removed`; `actor` is who. Never silence:
-- a tick that fired nothing says why here.
CREATE TABLE schedule_history (
    tenant       TEXT   NOT NULL,
    workspace    TEXT   NOT NULL,
    schedule_id  TEXT   NOT NULL,
    tick_at      BIGINT NOT NULL,
    outcome      TEXT   NOT NULL,
    run_id       TEXT,
    last_at      BIGINT NOT NULL,
    count        BIGINT NOT NULL,
    actor        TEXT,
    detail       TEXT,
    recorded_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, schedule_id, tick_at, outcome)
);

-- A schedule's latest entries by outcome (its last run, its last skip) and its history
-- newest first, without reading the history of every schedule.
CREATE INDEX schedule_history_by_outcome
    ON schedule_history (tenant, workspace, schedule_id, outcome, tick_at);
CREATE INDEX schedule_history_by_time
    ON schedule_history (tenant, workspace, schedule_id, recorded_at);
