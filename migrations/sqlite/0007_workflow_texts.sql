-- Workflow texts stored once per (tenant, workspace, text): a batch of 1,000 runs of one
-- 5 KB workflow used to write 5 MB of copies into runs.workflow_text.
--
-- `hash` is the SHA-256 (lowercase hex) of the exact text, computed by the ledger when a
-- run is enqueued and equal to that run's runs.workflow_hash: two different texts never
-- share a row. Rows are immutable (insert-if-absent, never updated), so a text read by
-- hash can never be stale.
--
-- Runs enqueued from now on store runs.workflow_text = '' and are read back through this
-- table; runs created before this migration keep their inline text untouched (a
-- non-empty runs.workflow_text always wins), so nothing is moved or rewritten here.
CREATE TABLE workflow_texts (
    tenant     TEXT   NOT NULL,
    workspace  TEXT   NOT NULL,
    hash       TEXT   NOT NULL,   -- sha256 hex of `text`
    text       TEXT   NOT NULL,
    created_at BIGINT NOT NULL,   -- ms; the first run that stored it
    PRIMARY KEY (tenant, workspace, hash)
);
