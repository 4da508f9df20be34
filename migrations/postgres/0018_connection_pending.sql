-- Sign-ins begun from the console or the API (`POST /api/v1/connections/{name}/connect`)
-- and finished by whichever server the browser comes back to
-- (`GET /ui/connections/callback`): the callback carries only `code` and `state`, so
-- what finishing needs — the PKCE verifier, the client, the endpoints, who began it —
-- waits here, keyed by the SHA-256 of `state` (the state itself only inside `sealed`).
--
-- `sealed` is that record encrypted with AES-256-GCM under the connections key, like a
-- connection's tokens (the verifier and a client secret are in it). A row is taken
-- (deleted) by the one callback that finishes it, so a state works once; rows past
-- `expires_at` are refused and swept when the next sign-in begins.
CREATE TABLE connection_pending (
    tenant      TEXT   NOT NULL,
    workspace   TEXT   NOT NULL,
    state_hash  TEXT   NOT NULL,
    name        TEXT   NOT NULL,
    sealed      TEXT   NOT NULL,
    key_id      TEXT   NOT NULL,
    begun_by    TEXT   NOT NULL,
    begun_at    BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant, workspace, state_hash)
);
