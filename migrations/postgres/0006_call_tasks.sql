-- Remote tasks: the id of the task a downstream started for a call (an MCP task,
-- `resultType: "task"`), written the moment it arrives. A call that is `outbound` with a
-- task id is never put in doubt by a crash or a timeout: its next holder asks the
-- downstream for the task's state (`tasks/get`) instead of sending the call again.
ALTER TABLE tool_calls ADD COLUMN remote_task TEXT;
