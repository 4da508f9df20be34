-- Tool pins (issue 51, flow's MCP proxy; ledger/src/tool_pins.rs): the definition of a
-- proxied MCP tool (description, input schema, annotations) pinned when the proxy first
-- lists it. A server that later lists another definition — drops `destructiveHint`,
-- changes the schema — has it recorded beside the pin (`seen_*`, with one
-- `mcp.tool_changed` event per new definition), and the proxy keeps offering and
-- gating the pinned one until an admin accepts the new one (`flow mcp accept`, an
-- `mcp.tool_accepted` event with who and why). `digest` is the canonical hash of
-- `definition`, so an acceptance names exactly what was reviewed.
CREATE TABLE tool_pins (
    tenant           TEXT    NOT NULL,
    workspace        TEXT    NOT NULL,
    server           TEXT    NOT NULL,
    tool             TEXT    NOT NULL,
    digest           TEXT    NOT NULL,
    definition       TEXT    NOT NULL,
    seen_digest      TEXT    NOT NULL,
    seen_definition  TEXT    NOT NULL,
    pinned_at        BIGINT  NOT NULL,
    pinned_by        TEXT,
    seen_at          BIGINT  NOT NULL,
    PRIMARY KEY (tenant, workspace, server, tool)
);
