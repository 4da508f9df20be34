-- query: listing runs newest first (`flow runs`, GET /api/v1/runs): the listing's sort
-- key, so a page walks the index from its cursor instead of sorting every run.
CREATE INDEX runs_by_created ON runs (tenant, workspace, created_at DESC, id DESC);
