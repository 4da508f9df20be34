-- Reconciliation: every probe flow sent to ask a downstream whether an in-doubt call took
-- effect (the audit trail of automatic settlement), and each call's probe schedule.

-- One row per probe of an in-doubt call.
CREATE TABLE call_probes (
    tenant        TEXT   NOT NULL,
    workspace     TEXT   NOT NULL,
    id            TEXT   NOT NULL,   -- prb_<ULID>
    run_id        TEXT   NOT NULL,
    tool_call_id  TEXT   NOT NULL,
    probe         BIGINT NOT NULL,   -- 1, 2, … per call
    sent_key      TEXT   NOT NULL,   -- the key of the effect attempt asked about
    probed_at     BIGINT NOT NULL,
    observed      TEXT   NOT NULL,   -- found | not_found | unknown
    decision      TEXT   NOT NULL,   -- succeed | resend | probe_again | needs_operator
    http_status   BIGINT,
    detail        TEXT,              -- why the answer settled nothing (redacted)
    response      TEXT,              -- JSON summary of the answer (redacted, capped)
    next_probe_at BIGINT,            -- when the next probe is due (probe_again)
    by_worker     TEXT   NOT NULL,   -- who probed
    PRIMARY KEY (tenant, workspace, id)
);
-- query: probes of a run or call (list_probes, flow show, the probe count).
CREATE INDEX call_probes_by_call ON call_probes (tenant, workspace, run_id, tool_call_id, probe);

-- One row per call that has been probed: how many probes, and when the next is due
-- (NULL once a human must decide or the call is settled).
CREATE TABLE call_reconcile (
    tenant        TEXT   NOT NULL,
    workspace     TEXT   NOT NULL,
    run_id        TEXT   NOT NULL,
    tool_call_id  TEXT   NOT NULL,
    probes        BIGINT NOT NULL,
    next_probe_at BIGINT,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, run_id, tool_call_id)
);
-- query: calls whose next probe is due (the daemon's reconciler).
CREATE INDEX call_reconcile_due ON call_reconcile (tenant, workspace, next_probe_at);
