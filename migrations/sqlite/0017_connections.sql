-- Connections (engine/src/connections/, ledger/src/connections.rs): an OAuth sign-in
-- (authorization code + PKCE) made once by a person with `flow connect NAME`, whose
-- tokens every worker on every host uses and refreshes.
--
-- `sealed` holds the tokens (and a registered client's secret) encrypted with AES-256-GCM
-- under the installation's connections key (a secret, never in the ledger); `key_id`
-- names that key so a rotation can tell old rows from new. Nothing else here is secret.
-- `generation` moves on every write of `sealed`: a refresh is leased (`refresh_holder`,
-- `refresh_until`) on the generation it read and written only by its holder, so one
-- refresh happens at a time and a rotated refresh token is stored before it is used.
-- `failed_at`: when the last refresh failed (cleared by a success or a sign-in); no
-- worker asks again for a while after it, so a server that is down gets one request per
-- interval, not one per waiting call.
CREATE TABLE connections (
    tenant               TEXT    NOT NULL,
    workspace            TEXT    NOT NULL,
    name                 TEXT    NOT NULL,
    server               TEXT    NOT NULL,
    resource             TEXT    NOT NULL,
    issuer               TEXT,
    token_endpoint       TEXT    NOT NULL,
    revocation_endpoint  TEXT,
    client_id            TEXT    NOT NULL,
    auth_method          TEXT    NOT NULL,
    sealed               TEXT    NOT NULL,
    key_id               TEXT    NOT NULL,
    generation           BIGINT  NOT NULL,
    scopes_granted       TEXT,
    scopes_wanted        TEXT,
    access_expires_at    BIGINT,
    has_refresh          BOOLEAN NOT NULL,
    status               TEXT    NOT NULL,
    connected_by         TEXT    NOT NULL,
    connected_at         BIGINT  NOT NULL,
    refreshes            BIGINT  NOT NULL DEFAULT 0,
    last_refresh_at      BIGINT,
    last_error           TEXT,
    failed_at            BIGINT,
    refresh_holder       TEXT,
    refresh_until        BIGINT,
    PRIMARY KEY (tenant, workspace, name)
);
