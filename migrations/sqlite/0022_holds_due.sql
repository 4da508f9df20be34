-- The holds view of 0021, shaped for the one sweep of every kind (issue 50):
--
-- * `due_at` is when a pending hold next needs the sweep: its deadline, or an
--   approval's next reminder when that comes first (a child run has none);
-- * `status` is each table's own column in the branches where the two names agree, and
--   a constant in the others, so `status = 'pending'` reaches each table's
--   (tenant, workspace, status, deadline) index instead of mapping every row first.
--
-- The row shape and the status mapping are 0021's (`flow_ledger::HoldStatus::of_*`).
DROP VIEW holds;
CREATE VIEW holds AS
SELECT tenant, workspace, run_id, step_id, node_id AS subject, 'approval' AS kind, status,
       deadline,
       CASE WHEN next_remind_at IS NOT NULL AND next_remind_at < deadline
            THEN next_remind_at ELSE deadline END AS due_at,
       CAST(0 AS BIGINT) AS unseen
  FROM approvals WHERE status IN ('pending', 'timed_out', 'cancelled')
UNION ALL
SELECT tenant, workspace, run_id, step_id, node_id AS subject, 'approval' AS kind,
       'settled' AS status, deadline, CAST(NULL AS BIGINT) AS due_at,
       CAST(0 AS BIGINT) AS unseen
  FROM approvals WHERE status NOT IN ('pending', 'timed_out', 'cancelled')
UNION ALL
SELECT tenant, workspace, run_id, step_id, node_id AS subject, kind, status, deadline,
       deadline AS due_at,
       CAST(CASE WHEN signal > seen_signal THEN 1 ELSE 0 END AS BIGINT) AS unseen
  FROM waits WHERE status IN ('pending', 'timed_out', 'cancelled')
UNION ALL
SELECT tenant, workspace, run_id, step_id, node_id AS subject, kind, 'settled' AS status,
       deadline, CAST(NULL AS BIGINT) AS due_at, CAST(0 AS BIGINT) AS unseen
  FROM waits WHERE status NOT IN ('pending', 'timed_out', 'cancelled')
UNION ALL
SELECT tenant, workspace, parent_run_id AS run_id, parent_step_id AS step_id,
       id AS subject, 'child' AS kind, 'pending' AS status,
       CAST(NULL AS BIGINT) AS deadline, CAST(NULL AS BIGINT) AS due_at,
       CAST(0 AS BIGINT) AS unseen
  FROM runs
 WHERE parent_run_id IS NOT NULL AND status NOT IN ('succeeded', 'failed', 'cancelled')
UNION ALL
SELECT tenant, workspace, parent_run_id AS run_id, parent_step_id AS step_id,
       id AS subject, 'child' AS kind, 'settled' AS status,
       CAST(NULL AS BIGINT) AS deadline, CAST(NULL AS BIGINT) AS due_at,
       CAST(0 AS BIGINT) AS unseen
  FROM runs
 WHERE parent_run_id IS NOT NULL AND status IN ('succeeded', 'failed', 'cancelled');
