-- A run id a deleted run used is refused at submit when that run sent anything (issue
-- 49): its calls' keys are tombstoned, and a new run under the same id would derive the
-- same keys and be stopped only node by node, after its first nodes had sent. The insert
-- of a new run asks whether any tombstone names its id; this index answers that.
CREATE INDEX key_tombstones_by_run ON key_tombstones (tenant, workspace, run_id);
