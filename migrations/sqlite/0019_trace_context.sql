-- OpenTelemetry (engine/src/telemetry): the W3C trace context of a call's current key,
-- stored by its first outbound mark, so a re-send after a crash carries the original's
-- `traceparent` and the downstream can tie both requests to one call. A new attempt (a
-- new key) forgets it. Never part of the request's digest.
ALTER TABLE tool_calls ADD COLUMN trace_parent TEXT;
ALTER TABLE tool_calls ADD COLUMN trace_state TEXT;
-- The span context of the run's latest execution segment (one claim of the run), so the
-- next segment — a resume or a takeover — links to it instead of staying one open span.
ALTER TABLE runs ADD COLUMN trace_segment TEXT;
