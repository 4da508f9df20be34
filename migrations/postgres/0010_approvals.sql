-- Approvals: a node whose call must be approved by people before it leaves
-- (`approval:` in a workflow; ledger/src/approvals.rs). One row per (run, node): the
-- request as rendered (secrets as names) and its digest, what it takes (`rule`, JSON:
-- approvers, min, forbid_self, inputs, on_timeout), and where it stands. An approval
-- binds to `digest`: the gateway sends only a request whose digest is the approved one.
--
-- `status` moves by one compare-and-set from `pending` to exactly one of `approved`,
-- `denied`, `timed_out`, `cancelled` (approve, deny, the deadline and a cancel race
-- there; the loser changes nothing). A changed request puts an approved (or pending)
-- row back to `pending` under the new digest (`approval.invalidated`).
CREATE TABLE approvals (
    tenant         TEXT   NOT NULL,
    workspace      TEXT   NOT NULL,
    run_id         TEXT   NOT NULL,
    node_id        TEXT   NOT NULL,
    step_id        TEXT   NOT NULL,   -- the step that asked last
    tool           TEXT   NOT NULL,
    status         TEXT   NOT NULL,   -- pending | approved | denied | timed_out | cancelled
    request        TEXT   NOT NULL,   -- JSON, redacted (secret names only)
    digest         TEXT   NOT NULL,   -- canonical SHA-256 of `request`
    message        TEXT,
    rule           TEXT   NOT NULL,   -- JSON
    min_approvals  BIGINT NOT NULL,
    submitted_by   TEXT,              -- who submitted the run (forbid_self)
    requested_at   BIGINT NOT NULL,
    deadline       BIGINT NOT NULL,
    reminders_sent BIGINT NOT NULL DEFAULT 0,
    next_remind_at BIGINT,
    decided_at     BIGINT,
    decided_by     TEXT,
    reason         TEXT,
    inputs         TEXT,              -- JSON: the deciding approver's inputs
    PRIMARY KEY (tenant, workspace, run_id, node_id),
    FOREIGN KEY (tenant, workspace, run_id) REFERENCES runs (tenant, workspace, id)
);
-- query: pending approvals by deadline (the inbox, the daemons' timeout sweep).
CREATE INDEX approvals_pending ON approvals (tenant, workspace, status, deadline);

-- One row per approver and digest: a token listed twice counts once; a vote for an
-- older digest (the request changed since) does not count towards `min_approvals`.
CREATE TABLE approval_votes (
    tenant    TEXT   NOT NULL,
    workspace TEXT   NOT NULL,
    run_id    TEXT   NOT NULL,
    node_id   TEXT   NOT NULL,
    digest    TEXT   NOT NULL,
    voter     TEXT   NOT NULL,
    decision  TEXT   NOT NULL,   -- approve | deny
    at        BIGINT NOT NULL,
    reason    TEXT,
    inputs    TEXT,              -- JSON
    PRIMARY KEY (tenant, workspace, run_id, node_id, digest, voter)
);
