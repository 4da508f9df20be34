-- A hold is a node parked until someone or something decides: an approval, an event
-- wait, a callback, a child run (issue 50, "one way to wait"). Each kind keeps its own
-- table of what only it knows (votes, matchers, tokens, the child's run); this view is
-- the one row shape all of them share, so "is any hold of this run settled while its
-- step still runs?" — the question a pause must ask so no wake-up is lost — is one
-- query, and a new kind is one more branch here plus its settle rule.
--
-- status: pending | settled | timed_out | cancelled (`flow_ledger::HoldStatus`; the
-- mapping from each kind's own status is `HoldStatus::of_*`, and a conformance test
-- checks this view against it). unseen = 1 when a pending hold was signalled past what
-- its worker looked at (a published event).
CREATE VIEW holds AS
SELECT tenant, workspace, run_id, step_id, node_id AS subject, 'approval' AS kind,
       CASE status WHEN 'pending' THEN 'pending' WHEN 'timed_out' THEN 'timed_out'
                   WHEN 'cancelled' THEN 'cancelled' ELSE 'settled' END AS status,
       deadline, CAST(0 AS BIGINT) AS unseen
  FROM approvals
UNION ALL
SELECT tenant, workspace, run_id, step_id, node_id AS subject, kind,
       CASE status WHEN 'pending' THEN 'pending' WHEN 'timed_out' THEN 'timed_out'
                   WHEN 'cancelled' THEN 'cancelled' ELSE 'settled' END AS status,
       deadline,
       CAST(CASE WHEN signal > seen_signal THEN 1 ELSE 0 END AS BIGINT) AS unseen
  FROM waits
UNION ALL
SELECT tenant, workspace, parent_run_id AS run_id, parent_step_id AS step_id,
       id AS subject, 'child' AS kind,
       CASE WHEN status IN ('succeeded', 'failed', 'cancelled') THEN 'settled'
            ELSE 'pending' END AS status,
       CAST(NULL AS BIGINT) AS deadline, CAST(0 AS BIGINT) AS unseen
  FROM runs
 WHERE parent_run_id IS NOT NULL;
