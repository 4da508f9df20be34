-- Sub-workflows (engine/src/executor/child.rs): a child run names the parent run and
-- the parent's step that started it, and what a cancel of the parent does to it
-- ('cancel' or 'abandon'). The child's id is derived from the parent's step, so a
-- parent retried after a crash finds the same child (insert-or-get) instead of
-- starting another. A child's finish re-queues its paused parent in the same
-- transaction.
ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN parent_step_id TEXT;
ALTER TABLE runs ADD COLUMN on_parent_cancel TEXT;
CREATE INDEX runs_by_parent ON runs (tenant, workspace, parent_run_id)
    WHERE parent_run_id IS NOT NULL;
