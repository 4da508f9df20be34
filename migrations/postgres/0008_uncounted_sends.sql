-- Sends whose request count is unknown: a holder died after the outbound mark and before
-- it recorded how many requests left (the takeover put the call in doubt). Each such
-- send may have sent at least one request, so `outbound_requests` is only what is known;
-- `flow show`, the API and the console say so instead of printing a bare 0.
ALTER TABLE tool_calls ADD COLUMN uncounted_sends BIGINT NOT NULL DEFAULT 0;
-- Calls in doubt with no request counted came from such a takeover.
UPDATE tool_calls SET uncounted_sends = 1 WHERE status = 'in_doubt' AND outbound_requests = 0;
