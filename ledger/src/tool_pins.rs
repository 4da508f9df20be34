//! Tool pins: the definitions of proxied MCP tools, pinned when first seen (the table's
//! migration, `0024_tool_pins.sql`, says why). The proxy offers and gates a tool by its
//! pin; what the server lists now is recorded beside it, and only an acceptance — who,
//! why, and the digest they reviewed — moves the pin.

use serde_json::{Value, json};

use crate::canonical_hash;
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, emit_unscoped};
use crate::ledger::Ledger;
use crate::model::Actor;
use crate::model::Scope;

/// A tool's pin and what its server listed last.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPin {
    /// The proxied server's name (`[[mcp.servers]] name`).
    pub server: String,
    /// The tool's name on that server.
    pub tool: String,
    /// The canonical hash of [`ToolPin::definition`].
    pub digest: String,
    /// The pinned definition: what the proxy offers and gates by.
    pub definition: Value,
    /// The hash of the definition the server listed last.
    pub seen_digest: String,
    /// That definition.
    pub seen_definition: Value,
    /// When the pin was set (first seen, or accepted).
    pub pinned_at: Timestamp,
    /// Who accepted it (`None`: pinned when first seen).
    pub pinned_by: Option<String>,
}

impl ToolPin {
    /// Whether the server now lists something other than the pin.
    pub fn changed(&self) -> bool {
        self.digest != self.seen_digest
    }
}

#[derive(sqlx::FromRow)]
struct PinRow {
    server: String,
    tool: String,
    digest: String,
    definition: String,
    seen_digest: String,
    seen_definition: String,
    pinned_at: i64,
    pinned_by: Option<String>,
}

impl PinRow {
    fn pin(self) -> ToolPin {
        let parse = |t: &str| serde_json::from_str(t).unwrap_or(Value::Null);
        ToolPin {
            definition: parse(&self.definition),
            seen_definition: parse(&self.seen_definition),
            server: self.server,
            tool: self.tool,
            digest: self.digest,
            seen_digest: self.seen_digest,
            pinned_at: Timestamp(self.pinned_at),
            pinned_by: self.pinned_by,
        }
    }
}

/// The columns of a [`PinRow`].
macro_rules! pin_cols {
    () => {
        "server, tool, digest, definition, seen_digest, seen_definition, pinned_at, pinned_by"
    };
}

/// The pin of `server`'s `tool`, if any, in `c`'s transaction.
async fn read(
    c: &mut Conn<'_>,
    s: &Scope,
    server: &str,
    tool: &str,
) -> Result<Option<ToolPin>, Error> {
    let sql = concat!(
        "SELECT ",
        pin_cols!(),
        " FROM tool_pins WHERE tenant = $1 AND workspace = $2 AND server = $3 AND tool = $4"
    );
    Ok(
        c.optional::<PinRow>(sql, args![&s.tenant, &s.workspace, server, tool])
            .await?
            .map(PinRow::pin),
    )
}

impl Ledger {
    /// Records that `server` lists `tool` as `definition` now. The first time, that is
    /// the pin. Later, a definition other than the one seen last is recorded beside
    /// the pin, with an `mcp.tool_changed` event when it differs from the pin (one per
    /// new definition, however many proxies list it). Returns the pin.
    pub async fn observe_tool(
        &self,
        server: &str,
        tool: &str,
        definition: &Value,
        now: Timestamp,
    ) -> Result<ToolPin, Error> {
        let ledger = self.clone();
        let (server, tool) = (server.to_owned(), tool.to_owned());
        let digest = canonical_hash(definition);
        let text = definition.to_string();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                c.execute(
                    "INSERT INTO tool_pins (tenant, workspace, server, tool, digest, definition,
                        seen_digest, seen_definition, pinned_at, pinned_by, seen_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $5, $6, $7, NULL, $7)
                     ON CONFLICT (tenant, workspace, server, tool) DO NOTHING",
                    args![&s.tenant, &s.workspace, &server, &tool, &digest, &text, now],
                )
                .await?;
                let n = c
                    .execute(
                        "UPDATE tool_pins SET seen_digest = $5, seen_definition = $6, seen_at = $7
                         WHERE tenant = $1 AND workspace = $2 AND server = $3 AND tool = $4
                           AND seen_digest <> $5",
                        args![&s.tenant, &s.workspace, &server, &tool, &digest, &text, now],
                    )
                    .await?;
                let pin = read(c, s, &server, &tool)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: format!("the pin of {server} tool {tool}"),
                    })?;
                if n == 1 && pin.changed() {
                    let payload = json!({
                        "server": server, "tool": tool,
                        "pinned": pin.digest, "seen": pin.seen_digest,
                    });
                    emit_unscoped(c, s, now, EventType::McpToolChanged, payload).await?;
                }
                Ok(pin)
            })
        })
        .await
    }

    /// Makes the definition `server` listed last for `tool` its pin, if that is still
    /// the one with `digest` (what the admin reviewed; `Conflict` otherwise, naming the
    /// digest seen now), with an `mcp.tool_accepted` event naming who and why.
    pub async fn accept_tool(
        &self,
        server: &str,
        tool: &str,
        digest: &str,
        actor: &Actor,
        now: Timestamp,
    ) -> Result<ToolPin, Error> {
        let ledger = self.clone();
        let (server, tool, digest, actor) = (
            server.to_owned(),
            tool.to_owned(),
            digest.to_owned(),
            actor.clone(),
        );
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let Some(before) = read(c, s, &server, &tool).await? else {
                    return Err(Error::NotFound {
                        what: format!("a pin of server `{server}` tool `{tool}`"),
                    });
                };
                if before.seen_digest != digest {
                    return Err(Error::Conflict {
                        reason: format!(
                            "server `{server}` lists tool `{tool}` as {} now, not {digest}: review it again",
                            before.seen_digest
                        ),
                        other_run: String::new(),
                        other_node: String::new(),
                    });
                }
                c.execute(
                    "UPDATE tool_pins SET digest = seen_digest, definition = seen_definition,
                        pinned_at = $5, pinned_by = $6
                     WHERE tenant = $1 AND workspace = $2 AND server = $3 AND tool = $4",
                    args![&s.tenant, &s.workspace, &server, &tool, now, &actor.by],
                )
                .await?;
                let payload = json!({
                    "server": server, "tool": tool, "from": before.digest, "to": digest,
                    "by": actor.by, "reason": actor.reason,
                });
                emit_unscoped(c, s, now, EventType::McpToolAccepted, payload).await?;
                read(c, s, &server, &tool).await?.ok_or_else(|| Error::NotFound {
                    what: format!("the pin of {server} tool {tool}"),
                })
            })
        })
        .await
    }

    /// Every pin, by server and tool.
    pub async fn list_tool_pins(&self) -> Result<Vec<ToolPin>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let sql = concat!(
            "SELECT ",
            pin_cols!(),
            " FROM tool_pins WHERE tenant = $1 AND workspace = $2 ORDER BY server, tool"
        );
        Ok(pc
            .conn()
            .all::<PinRow>(sql, args![&s.tenant, &s.workspace])
            .await?
            .into_iter()
            .map(PinRow::pin)
            .collect())
    }
}
