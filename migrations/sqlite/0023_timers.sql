-- Timers (issue 50, item 3): every durable deadline the daemons keep, read as one row
-- shape by one watcher (`Ledger::fire_due_timers`, `ledger/src/timers/`). A timer is a
-- view over the row that owns the deadline, not a copy of it: no write has to keep two
-- rows in step, and a deadline moved by its owner (a callback's heartbeat, a probe's
-- next try) moves its timer in the same statement.
--
-- * `kind` is what fires (`flow_ledger::TimerKind`): a `hold` (an approval, an event
--   wait, a callback: its deadline or an approval's next reminder; at once when its run
--   or step ended without it) or a `probe` (a paused run's call in doubt, due at its
--   next probe). A probe acts on its run, so its `subject` is the run: the watcher
--   groups the due rows by (kind, run, subject) before its LIMIT, and a run with a
--   thousand due calls is one timer that cannot crowd others out of a batch. The
--   grouping is the watcher's, after its `due_at <= now`, so that filter reaches each
--   branch's index (`call_reconcile_due`) instead of aggregating every call first.
-- * `hold_kind`, `deadline`, `ended`: what a hold's rule needs to choose between
--   timing out, reminding and cancelling (NULL / 0 for other kinds).
-- * A child run has no deadline (its own end settles its parent's hold): no timer.
CREATE VIEW timers AS
SELECT h.tenant, h.workspace, 'hold' AS kind, h.kind AS hold_kind, h.run_id,
       h.subject, h.deadline,
       CASE WHEN r.status IN ('succeeded', 'failed', 'cancelled')
              OR st.status IN ('succeeded', 'failed', 'skipped', 'cancelled')
            THEN CAST(1 AS BIGINT) ELSE CAST(0 AS BIGINT) END AS ended,
       CASE WHEN r.status IN ('succeeded', 'failed', 'cancelled')
              OR st.status IN ('succeeded', 'failed', 'skipped', 'cancelled')
            THEN CAST(0 AS BIGINT) ELSE h.due_at END AS due_at
  FROM holds h
  JOIN runs r ON r.tenant = h.tenant AND r.workspace = h.workspace AND r.id = h.run_id
  LEFT JOIN steps st ON st.tenant = h.tenant AND st.workspace = h.workspace
   AND st.run_id = h.run_id AND st.step_id = h.step_id
 WHERE h.status = 'pending' AND h.kind <> 'child'
UNION ALL
SELECT c.tenant, c.workspace, 'probe' AS kind, CAST(NULL AS TEXT) AS hold_kind,
       c.run_id, c.run_id AS subject, CAST(NULL AS BIGINT) AS deadline,
       CAST(0 AS BIGINT) AS ended, c.next_probe_at AS due_at
  FROM call_reconcile c
  JOIN tool_calls t ON t.tenant = c.tenant AND t.workspace = c.workspace
   AND t.run_id = c.run_id AND t.tool_call_id = c.tool_call_id
  JOIN runs u ON u.tenant = c.tenant AND u.workspace = c.workspace AND u.id = c.run_id
 WHERE c.next_probe_at IS NOT NULL AND t.status = 'in_doubt' AND u.status = 'paused';
