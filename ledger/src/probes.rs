//! Reconciliation's record: every probe flow sends to ask a downstream whether an
//! in-doubt call took effect, and each call's probe schedule.
//!
//! A probe never changes a call by itself: what it settles, it settles through
//! [`Ledger::resolve_call`] (by `reconcile`), so the at-most-once rules stay in one place.
//! This module only keeps the audit trail (`call_probes`, one row per probe, with the
//! redacted answer) and the schedule (`call_reconcile`: how many probes, when the next is
//! due) that the daemon's reconciler reads.

use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use crate::clock::Timestamp;
use crate::conn::args;
use crate::error::Error;
use crate::events::{EventType, NewEvent, emit};
use crate::ledger::Ledger;
use crate::state::CallStatus;

/// What a probe's answer said about the effect attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProbeObserved {
    /// The downstream has the effect.
    Found,
    /// The downstream says it has no such effect.
    NotFound,
    /// Neither (an error, a timeout, an answer both or neither verdict matched).
    Unknown,
}

impl ProbeObserved {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Found => "found",
            Self::NotFound => "not_found",
            Self::Unknown => "unknown",
        }
    }

    fn parse(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "found" => Self::Found,
            "not_found" => Self::NotFound,
            "unknown" => Self::Unknown,
            other => {
                return Err(Error::Corrupt {
                    what: format!("unknown probe observation `{other}`"),
                });
            }
        })
    }
}

/// What flow did with a probe's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProbeDecision {
    /// Settle the call as succeeded with the probe's output.
    Succeed,
    /// Settle it for a re-send with the same key.
    Resend,
    /// Leave it in doubt and probe again later.
    ProbeAgain,
    /// Leave it in doubt; the probes are spent: a human decides.
    NeedsOperator,
}

impl ProbeDecision {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeed => "succeed",
            Self::Resend => "resend",
            Self::ProbeAgain => "probe_again",
            Self::NeedsOperator => "needs_operator",
        }
    }

    fn parse(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "succeed" => Self::Succeed,
            "resend" => Self::Resend,
            "probe_again" => Self::ProbeAgain,
            "needs_operator" => Self::NeedsOperator,
            other => {
                return Err(Error::Corrupt {
                    what: format!("unknown probe decision `{other}`"),
                });
            }
        })
    }
}

/// A probe to record ([`Ledger::record_probe`]).
#[derive(Debug, Clone)]
pub struct NewProbe {
    /// The run.
    pub run_id: String,
    /// The call (its node id).
    pub tool_call_id: String,
    /// The key of the effect attempt the probe asked about.
    pub sent_key: String,
    /// What the answer said.
    pub observed: ProbeObserved,
    /// What flow does with it.
    pub decision: ProbeDecision,
    /// The HTTP status of the answer, if HTTP.
    pub http_status: Option<u16>,
    /// Why the answer settled nothing (already scrubbed of secrets).
    pub detail: Option<String>,
    /// A summary of the answer (already scrubbed and capped).
    pub response: Option<Json>,
    /// When the next probe is due (`ProbeAgain`).
    pub next_probe_at: Option<Timestamp>,
    /// Who probed (worker id, or the operator running `flow reconcile`).
    pub by: String,
    /// The call's tool (for the usage row).
    pub tool: String,
    /// The effect attempt asked about.
    pub attempt: u32,
    /// Requests the probe sent (0 when it could not be sent): a `usage` row of kind
    /// `probe`, so a downstream's bill counts them too.
    pub requests_sent: u32,
    /// The call's re-send budget (`reconcile.max_resends`). A `Resend` decision is
    /// checked against it in the recording transaction, after the call's schedule row
    /// is locked: two probers that both read "one left" cannot both re-send. Past the
    /// budget the probe is recorded as `NeedsOperator`.
    pub max_resends: u32,
}

/// What [`Ledger::record_probe`] recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedProbe {
    /// The probe's number (1-based, per call).
    pub number: u32,
    /// The decision as recorded: the caller's, except a `Resend` past the budget, which
    /// is recorded (and must be carried out) as `NeedsOperator`.
    pub decision: ProbeDecision,
}

/// A probe as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// The call (node id).
    pub tool_call_id: String,
    /// 1, 2, … per call.
    pub probe: u32,
    /// The key asked about.
    pub sent_key: String,
    /// When.
    pub probed_at: Timestamp,
    /// What the answer said.
    pub observed: ProbeObserved,
    /// What flow did.
    pub decision: ProbeDecision,
    /// HTTP status, if HTTP.
    pub http_status: Option<u16>,
    /// Why it settled nothing.
    pub detail: Option<String>,
    /// The answer's summary.
    pub response: Option<Json>,
    /// When the next probe was due.
    pub next_probe_at: Option<Timestamp>,
    /// Who probed.
    pub by: String,
}

#[derive(Debug, sqlx::FromRow)]
struct ProbeRow {
    tool_call_id: String,
    probe: i64,
    sent_key: String,
    probed_at: i64,
    observed: String,
    decision: String,
    http_status: Option<i64>,
    detail: Option<String>,
    response: Option<String>,
    next_probe_at: Option<i64>,
    by_worker: String,
}

impl ProbeRow {
    fn into_probe(self) -> Result<Probe, Error> {
        Ok(Probe {
            tool_call_id: self.tool_call_id,
            probe: u32::try_from(self.probe).unwrap_or(u32::MAX),
            sent_key: self.sent_key,
            probed_at: Timestamp(self.probed_at),
            observed: ProbeObserved::parse(&self.observed)?,
            decision: ProbeDecision::parse(&self.decision)?,
            http_status: self.http_status.and_then(|s| u16::try_from(s).ok()),
            detail: self.detail,
            response: self
                .response
                .map(|t| serde_json::from_str(&t))
                .transpose()
                .map_err(|e| Error::Corrupt {
                    what: format!("probe response is not JSON: {e}"),
                })?,
            next_probe_at: self.next_probe_at.map(Timestamp),
            by: self.by_worker,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
struct CountRow {
    probes: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct StatusRow {
    status: String,
}

/// Turns a `Resend` past the call's `max_resends` into `NeedsOperator` (with nothing
/// scheduled and a detail that says why), in the recording transaction, after the
/// schedule row is locked.
async fn enforce_resend_budget(
    c: &mut crate::conn::Conn<'_>,
    ledger: &Ledger,
    p: &mut NewProbe,
) -> Result<(), Error> {
    if p.decision != ProbeDecision::Resend
        || count_resends(c, ledger, &p.run_id, &p.tool_call_id).await? < p.max_resends
    {
        return Ok(());
    }
    p.decision = ProbeDecision::NeedsOperator;
    p.next_probe_at = None;
    p.detail = Some(format!(
        "not found, but the re-send budget (reconcile.max_resends = {}) is spent: a downstream whose status lags its effects may have executed every re-send",
        p.max_resends
    ));
    let s = ledger.scope();
    c.execute(
        "UPDATE call_reconcile SET next_probe_at = NULL
         WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4",
        args![&s.tenant, &s.workspace, &p.run_id, &p.tool_call_id],
    )
    .await?;
    Ok(())
}

/// A call's probe schedule ([`Ledger::probe_schedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSchedule {
    /// Probes recorded so far.
    pub probes: u32,
    /// When the next is due (`None`: not scheduled — a human decides, or never probed).
    pub next_probe_at: Option<Timestamp>,
    /// Probes decided `resend` so far: what `reconcile.max_resends` is counted against.
    pub resends: u32,
}

#[derive(Debug, sqlx::FromRow)]
struct ResendsRow {
    resends: i64,
}

/// Probes of a call decided `resend` (in `c`'s transaction).
async fn count_resends(
    c: &mut crate::conn::Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    tool_call_id: &str,
) -> Result<u32, Error> {
    let s = ledger.scope();
    let row = c
        .optional::<ResendsRow>(
            "SELECT COUNT(*) AS resends FROM call_probes
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
               AND decision = $5",
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                tool_call_id,
                ProbeDecision::Resend.as_str()
            ],
        )
        .await?;
    Ok(row.map_or(0, |r| u32::try_from(r.resends).unwrap_or(u32::MAX)))
}

/// The usage row of a probe's requests (none when it sent nothing).
async fn insert_usage(
    c: &mut crate::conn::Conn<'_>,
    ledger: &Ledger,
    p: &NewProbe,
    now: Timestamp,
) -> Result<(), Error> {
    if p.requests_sent == 0 {
        return Ok(());
    }
    let s = ledger.scope();
    c.execute(
        "INSERT INTO usage (tenant, workspace, id, run_id, tool_call_id, tool, attempt,
            sent_key, kind, quantity, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        args![
            &s.tenant,
            &s.workspace,
            format!("use_{}", ulid::Ulid::generate()),
            &p.run_id,
            &p.tool_call_id,
            &p.tool,
            p.attempt,
            &p.sent_key,
            crate::model::UsageKind::Probe.as_str(),
            p.requests_sent,
            now,
        ],
    )
    .await?;
    Ok(())
}

impl Ledger {
    /// Records one probe of an in-doubt call: its row, the call's schedule and a
    /// `tool_call.probed` event (and `tool_call.needs_operator` when the probes are
    /// spent), in one transaction. Returns the probe's number and decision (a `Resend`
    /// past `max_resends` becomes `NeedsOperator`). Refused with `InvalidTransition`
    /// when the call is no longer in doubt (someone settled it meanwhile: the answer is
    /// moot).
    pub async fn record_probe(&self, p: NewProbe, now: Timestamp) -> Result<RecordedProbe, Error> {
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let status = c
                    .optional::<StatusRow>(
                        "SELECT status FROM tool_calls
                         WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4",
                        args![&s.tenant, &s.workspace, &p.run_id, &p.tool_call_id],
                    )
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: format!("tool call {}/{}", p.run_id, p.tool_call_id),
                    })?;
                if status.status != CallStatus::InDoubt.as_str() {
                    return Err(Error::InvalidTransition {
                        what: "tool call",
                        from: status.status,
                        to: "probed".into(),
                    });
                }
                let count = c
                    .optional::<CountRow>(
                        "INSERT INTO call_reconcile (tenant, workspace, run_id, tool_call_id, probes,
                            next_probe_at, updated_at)
                         VALUES ($1, $2, $3, $4, 1, $5, $6)
                         ON CONFLICT (tenant, workspace, run_id, tool_call_id) DO UPDATE
                           SET probes = call_reconcile.probes + 1, next_probe_at = $5, updated_at = $6
                         RETURNING probes",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &p.run_id,
                            &p.tool_call_id,
                            p.next_probe_at,
                            now
                        ],
                    )
                    .await?
                    .map_or(1, |r| r.probes);
                // The upsert above holds the schedule row's lock until commit, so the
                // budget check sees every other prober's committed re-send.
                let mut p = p;
                enforce_resend_budget(c, &ledger, &mut p).await?;
                let response = p.response.as_ref().map(Json::to_string);
                c.execute(
                    "INSERT INTO call_probes (tenant, workspace, id, run_id, tool_call_id, probe,
                        sent_key, probed_at, observed, decision, http_status, detail, response,
                        next_probe_at, by_worker)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
                    args![
                        &s.tenant,
                        &s.workspace,
                        format!("prb_{}", ulid::Ulid::generate()),
                        &p.run_id,
                        &p.tool_call_id,
                        count,
                        &p.sent_key,
                        now,
                        p.observed.as_str(),
                        p.decision.as_str(),
                        p.http_status.map(i64::from),
                        p.detail.clone(),
                        response,
                        p.next_probe_at,
                        &p.by,
                    ],
                )
                .await?;
                insert_usage(c, &ledger, &p, now).await?;
                let payload = json!({
                    "probe": count,
                    "sent_key": p.sent_key,
                    "observed": p.observed.as_str(),
                    "decision": p.decision.as_str(),
                    "http_status": p.http_status,
                    "detail": p.detail,
                    "next_probe_at": p.next_probe_at.map(|t| t.to_rfc3339()),
                    "by": p.by,
                });
                let mut types = vec![EventType::ToolCallProbed];
                if p.decision == ProbeDecision::NeedsOperator {
                    types.push(EventType::ToolCallNeedsOperator);
                }
                for event_type in types {
                    emit(
                        c,
                        s,
                        now,
                        NewEvent {
                            event_type,
                            run_id: &p.run_id,
                            step_id: None,
                            tool_call_id: Some(&p.tool_call_id),
                            payload: payload.clone(),
                        },
                    )
                    .await?;
                }
                Ok(RecordedProbe {
                    number: u32::try_from(count).unwrap_or(u32::MAX),
                    decision: p.decision,
                })
            })
        })
        .await
    }

    /// How many probes a call has had and when the next is due.
    pub async fn probe_schedule(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<ProbeSchedule, Error> {
        #[derive(Debug, sqlx::FromRow)]
        struct Row {
            probes: i64,
            next_probe_at: Option<i64>,
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let row = pc
            .conn()
            .optional::<Row>(
                "SELECT probes, next_probe_at FROM call_reconcile
                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4",
                args![&s.tenant, &s.workspace, run_id, tool_call_id],
            )
            .await?;
        let resends = count_resends(&mut pc.conn(), self, run_id, tool_call_id).await?;
        Ok(row.map_or(
            ProbeSchedule {
                probes: 0,
                next_probe_at: None,
                resends,
            },
            |r| ProbeSchedule {
                probes: u32::try_from(r.probes).unwrap_or(u32::MAX),
                next_probe_at: r.next_probe_at.map(Timestamp),
                resends,
            },
        ))
    }

    /// Every probe of a run, by call and number.
    pub async fn list_probes(&self, run_id: &str) -> Result<Vec<Probe>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<ProbeRow>(
                "SELECT tool_call_id, probe, sent_key, probed_at, observed, decision, http_status,
                    detail, response, next_probe_at, by_worker
                 FROM call_probes WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                 ORDER BY tool_call_id, probe",
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?;
        rows.into_iter().map(ProbeRow::into_probe).collect()
    }
}
