-- Consumer checkpoints for the outbox dispatcher (issue 7).
--
-- A checkpoint is a position in (txid, seq) order. On PostgreSQL, `seq` values are
-- allocated at insert time but transactions commit in any order, so a checkpoint on seq
-- alone could skip an event whose transaction commits late. `txid` is the inserting
-- transaction's id (pg_current_xact_id); the dispatcher only reads events whose txid is
-- below the oldest running transaction (pg_snapshot_xmin), and every event that can
-- still appear later sorts after them. SQLite has one writer at a time, so its txid is
-- always 0 and (0, seq) is commit order.
ALTER TABLE outbox ADD COLUMN txid BIGINT NOT NULL DEFAULT 0;
-- query: due outbox rows for a consumer (schedule_deliveries: after the checkpoint).
CREATE INDEX outbox_by_txid ON outbox (tenant, workspace, txid, seq);

CREATE TABLE event_consumers (
    tenant     TEXT   NOT NULL,
    workspace  TEXT   NOT NULL,
    consumer   TEXT   NOT NULL,
    last_txid  BIGINT NOT NULL,
    last_seq   BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, consumer)
);
