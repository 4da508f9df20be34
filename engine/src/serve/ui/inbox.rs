//! The In doubt worklist: `GET /ui/in-doubt` (a table of [`InboxRow`]s under the
//! filters: run, run id prefix, node, tool, minimum age) and `POST
//! /ui/in-doubt/selected` (settle the ticked calls one way, with a dry run that lists
//! exactly the calls it would settle and those it would skip, writing nothing).
//!
//! Settling goes through `api::steer::settle`, call by call, paced like the API's bulk
//! resolve: a call someone settled meanwhile is refused by the ledger and reported as
//! skipped, never an error for the rest.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, RawForm, State};
use axum::http::StatusCode;
use flow_ledger::inbox::InboxFilter;
use flow_ledger::{Error as LedgerError, Resolution, RunStatus};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use super::forms::{how, reason, url};
use super::live::last_seq;
use super::session::Signed;
use super::{Page, Ui, who};
use crate::role::Role;
use crate::serve::App;
use crate::serve::api::in_doubt::{CallFilter, MAX_CALLS};
use crate::serve::api::steer::{resolve_refused, settle};
use crate::serve::auth::Caller;
use crate::serve::problem::Problem;
use crate::view::InboxRow;

/// Rows the worklist shows at once (the oldest): enough to work through, few enough to
/// stay a light page; the filters narrow the rest.
const PAGE_ROWS: u32 = 200;

/// The pause between two settlements of one "resolve selected": the API's bulk pace
/// (50 a second), so a long selection cannot crowd the daemons' writes out.
const PACE: Duration = Duration::from_millis(20);

/// The query of the inbox (its filter).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct InboxQuery {
    /// Only calls of this run.
    pub(super) run: String,
    /// Only calls of runs whose id starts with this.
    pub(super) prefix: String,
    /// Only calls of this node.
    pub(super) node: String,
    /// Only calls of this tool.
    pub(super) tool: String,
    /// Only calls in doubt for at least this many minutes (empty: any).
    pub(super) age: String,
}

fn some(s: &str) -> Option<String> {
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

impl InboxQuery {
    /// The API's filter (run, node, tool; empty fields match anything): what the
    /// admins' bulk resolve settles.
    pub(super) fn filter(&self) -> CallFilter {
        CallFilter {
            run: some(&self.run),
            node: some(&self.node),
            tool: some(&self.tool),
        }
    }

    /// The minimum age, or why it is not one.
    fn minutes(&self) -> Result<Option<u64>, String> {
        match some(&self.age) {
            None => Ok(None),
            Some(t) => t.parse::<u64>().map(Some).map_err(|_| {
                format!("age: `{t}` is not a whole number of minutes; nothing was filtered")
            }),
        }
    }

    /// The worklist's filter as of `now` (one row more than a page: is there more?).
    fn ledger(&self, now: flow_ledger::Timestamp) -> Result<InboxFilter, String> {
        let before = self
            .minutes()?
            .map(|m| now.minus(Duration::from_secs(m * 60)));
        Ok(InboxFilter {
            run_id: some(&self.run),
            run_prefix: some(&self.prefix),
            node: some(&self.node),
            tool: some(&self.tool),
            in_doubt_before: before,
            limit: PAGE_ROWS + 1,
        })
    }

    /// The fields as the template shows them.
    fn shown(&self) -> Json {
        json!({"run": self.run, "prefix": self.prefix, "node": self.node, "tool": self.tool, "age": self.age})
    }

    /// Whether any field is set.
    fn any(&self) -> bool {
        [&self.run, &self.prefix, &self.node, &self.tool, &self.age]
            .iter()
            .any(|f| !f.trim().is_empty())
    }

    /// The page's own GET address with this filter: what the live script fetches
    /// again, also when the page answered a POST.
    pub(super) fn address(&self) -> String {
        let fields = [
            ("run", &self.run),
            ("prefix", &self.prefix),
            ("node", &self.node),
            ("tool", &self.tool),
            ("age", &self.age),
        ];
        let query: Vec<String> = fields
            .iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .map(|(k, v)| format!("{k}={}", url(v.trim())))
            .collect();
        if query.is_empty() {
            "/ui/in-doubt".into()
        } else {
            format!("/ui/in-doubt?{}", query.join("&"))
        }
    }
}

/// `GET /ui/in-doubt?run=&prefix=&node=&tool=&age=`: the worklist.
pub async fn in_doubt(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let Query(q) = q.map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    inbox(&ui, &signed, &q, StatusCode::OK, json!({})).await
}

/// The worklist under `q`, with `notice` (`{error}`, `{info}`, reports, the form values
/// to keep) from a form that was just posted, answered with `status`.
pub(super) async fn inbox(
    ui: &Ui,
    signed: &Signed,
    q: &InboxQuery,
    status: StatusCode,
    mut notice: Json,
) -> Result<Page, Page> {
    let filter = match q.ledger(super::times::now()) {
        Ok(f) => f,
        Err(why) => return Err(Page::error(StatusCode::BAD_REQUEST, why)),
    };
    let mut rows = InboxRow::load(&ui.app.ledger, filter)
        .await
        .map_err(|e| Page::from(Problem::ledger(&e)))?;
    let more = rows.len() > PAGE_ROWS as usize;
    rows.truncate(PAGE_ROWS as usize);
    if let Some(n) = notice.as_object_mut() {
        n.entry("selected").or_insert_with(|| json!([]));
    }
    let ctx = json!({
        "title": "In doubt",
        "nav": "in-doubt",
        "who": who(signed, ui).await?,
        "rows": rows,
        "more": more,
        "filter": q.shown(),
        "filtered": q.any(),
        "notice": notice,
        "live_url": q.address(),
        "live_after": last_seq(&ui.app.ledger).await?,
    });
    Ok(Page::render(status, "in_doubt.html", &ctx))
}

/// One call of a selection as a report lists it.
#[derive(Debug, Clone, Serialize)]
struct Picked {
    run: String,
    node: String,
    /// The current attempt's key (`None`: no such call).
    key: Option<String>,
    /// Why it is (or would be) skipped.
    detail: Option<String>,
}

/// The "resolve selected" form, read by hand: `call` repeats, which the form
/// extractor cannot take.
#[derive(Debug, Default)]
struct Selection {
    csrf: String,
    outcome: String,
    output: String,
    reason: String,
    confirm: String,
    dry_run: String,
    calls: Vec<(String, String)>,
    bad_call: Option<String>,
    filter: InboxQuery,
}

impl Selection {
    fn parse(body: &[u8]) -> Selection {
        let mut s = Selection::default();
        let mut seen = BTreeSet::new();
        for (k, v) in url::form_urlencoded::parse(body) {
            let v = v.into_owned();
            match k.as_ref() {
                "csrf" => s.csrf = v,
                "outcome" => s.outcome = v,
                "output" => s.output = v,
                "reason" => s.reason = v,
                "confirm" => s.confirm = v,
                "dry_run" => s.dry_run = v,
                "f_run" => s.filter.run = v,
                "f_prefix" => s.filter.prefix = v,
                "f_node" => s.filter.node = v,
                "f_tool" => s.filter.tool = v,
                "f_age" => s.filter.age = v,
                "call" => match v.split_once('/') {
                    Some((r, n)) if !r.is_empty() && !n.is_empty() => {
                        if seen.insert(v.clone()) {
                            s.calls.push((r.to_string(), n.to_string()));
                        }
                    }
                    _ => s.bad_call = Some(v),
                },
                _ => {}
            }
        }
        s
    }

    /// What the page keeps of the form when it shows it again.
    fn kept(&self) -> Json {
        let selected: Vec<String> = self.calls.iter().map(|(r, n)| format!("{r}/{n}")).collect();
        json!({
            "sel_outcome": self.outcome,
            "sel_output": self.output,
            "sel_reason": self.reason,
            "selected": selected,
        })
    }
}

fn with(mut base: Json, extra: Json) -> Json {
    if let (Some(b), Json::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

/// `POST /ui/in-doubt/selected` (operators and admins): with `dry_run=yes`, lists what
/// settling the ticked calls would do; otherwise (confirmed) settles them one by one.
/// Session, CSRF, role, then the values are checked first; a refused form writes
/// nothing and shows the page again with the form as it was.
pub async fn resolve_selected(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    RawForm(body): RawForm,
) -> Result<Page, Page> {
    let f = Selection::parse(&body);
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Operator)?;
    let kept = f.kept();
    let refuse = |why: String, field: Option<&str>| {
        let notice = with(kept.clone(), json!({"error": why, "sel_field": field}));
        inbox(&ui, &signed, &f.filter, StatusCode::BAD_REQUEST, notice)
    };
    if let Some(bad) = &f.bad_call {
        return refuse(
            format!("call: `{bad}` is not RUN/NODE: nothing was written"),
            None,
        )
        .await;
    }
    if f.calls.is_empty() {
        return refuse(
            "tick at least one call to resolve: nothing was written".into(),
            None,
        )
        .await;
    }
    if f.calls.len() > MAX_CALLS as usize {
        let why = format!(
            "{} calls are ticked; at most {MAX_CALLS} at once: nothing was written",
            f.calls.len()
        );
        return refuse(why, None).await;
    }
    let resolution = match how(&f.outcome, &f.output, &f.reason) {
        Ok(r) => r,
        Err(why) => {
            let field = why.starts_with("output:").then_some("output");
            return refuse(format!("{why}: nothing was written"), field).await;
        }
    };
    let dry = f.dry_run == "yes";
    if !dry && f.confirm != "yes" {
        let why = "tick \"I confirm\" to settle the selected calls: nothing was written";
        return refuse(why.into(), None).await;
    }
    let (settle_list, skip) = plan(&ui.app, &f.calls, &resolution).await?;
    if dry {
        let notice = with(kept, json!({"plan": {"settle": settle_list, "skip": skip}}));
        return inbox(&ui, &signed, &f.filter, StatusCode::OK, notice).await;
    }
    let keys: HashMap<(String, String), Option<String>> = settle_list
        .iter()
        .chain(skip.iter())
        .map(|p| ((p.run.clone(), p.node.clone()), p.key.clone()))
        .collect();
    let done = settle_each(
        &ui.app,
        &signed.caller,
        &f.calls,
        &resolution,
        reason(&f.reason),
        &keys,
    )
    .await;
    let info = format!(
        "{} of {} selected call(s) settled as {}; {} skipped{}",
        done.settled.len(),
        f.calls.len(),
        f.outcome,
        done.skipped.len(),
        done.stopped
            .as_ref()
            .map(|e| format!("; stopped: {e}"))
            .unwrap_or_default(),
    );
    let notice = json!({
        "info": info,
        "sel_outcome": f.outcome,
        "done": {"settled": done.settled, "skipped": done.skipped},
    });
    inbox(&ui, &signed, &f.filter, StatusCode::OK, notice).await
}

/// What settling `calls` as `how` would do, read without writing: the calls still in
/// doubt that would be settled, and the rest with why they would be skipped (gone, no
/// longer in doubt, a `retry` of a finished run's call) — the rules the ledger applies
/// when it settles them. Two reads whatever the number of calls.
async fn plan(
    app: &App,
    calls: &[(String, String)],
    how: &Resolution,
) -> Result<(Vec<Picked>, Vec<Picked>), Problem> {
    let found = app
        .ledger
        .calls_by_ids(calls)
        .await
        .map_err(|e| Problem::ledger(&e))?;
    let runs: Vec<String> = calls.iter().map(|(r, _)| r.clone()).collect();
    let names = app
        .ledger
        .run_names(&runs)
        .await
        .map_err(|e| Problem::ledger(&e))?;
    let status: HashMap<&str, RunStatus> =
        names.iter().map(|n| (n.id.as_str(), n.status)).collect();
    let (mut settle_list, mut skip) = (Vec::new(), Vec::new());
    for (run, node) in calls {
        let call = found
            .iter()
            .find(|c| &c.run_id == run && &c.tool_call_id == node);
        let refused = match call {
            None => Some(LedgerError::NotFound {
                what: format!("tool call {run}/{node}"),
            }),
            Some(c) if c.status != flow_ledger::CallStatus::InDoubt => {
                Some(LedgerError::InvalidTransition {
                    what: "tool call",
                    from: c.status.as_str().into(),
                    to: "resolved".into(),
                })
            }
            Some(_) => match status.get(run.as_str()) {
                Some(&s) if matches!(how, Resolution::Retry) && s.is_terminal() => {
                    Some(LedgerError::Terminal { status: s })
                }
                _ => None,
            },
        };
        let picked = Picked {
            run: run.clone(),
            node: node.clone(),
            key: call.map(|c| c.current_key.clone()),
            detail: refused
                .as_ref()
                .map(|e| resolve_refused(e, run, node).detail),
        };
        if refused.is_some() {
            skip.push(picked)
        } else {
            settle_list.push(picked)
        }
    }
    Ok((settle_list, skip))
}

/// What one "resolve selected" did.
#[derive(Debug, Default)]
struct Done {
    settled: Vec<Picked>,
    skipped: Vec<Picked>,
    /// A server-side failure that stopped it (the calls after it were not tried).
    stopped: Option<String>,
}

/// Settles each of `calls` as `how`, in order and paced; a refusal (settled meanwhile,
/// gone, a finished run's retry) skips that call, a server error stops.
async fn settle_each(
    app: &App,
    caller: &Caller,
    calls: &[(String, String)],
    how: &Resolution,
    why: Option<String>,
    keys: &HashMap<(String, String), Option<String>>,
) -> Done {
    let mut done = Done::default();
    for (i, (run, node)) in calls.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(PACE).await;
        }
        let key = keys.get(&(run.clone(), node.clone())).cloned().flatten();
        let picked = |detail: Option<String>| Picked {
            run: run.clone(),
            node: node.clone(),
            key: key.clone(),
            detail,
        };
        match settle(app, caller, run, node, how.clone(), why.clone()).await {
            Ok(()) => done.settled.push(picked(None)),
            Err(p) if p.status.is_server_error() => {
                done.stopped = Some(p.detail);
                break;
            }
            Err(p) => done.skipped.push(picked(Some(p.detail))),
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_is_read_with_its_repeated_calls() {
        let body = b"csrf=t&call=run_1%2Fcharge&call=run.2/ship&call=run_1/charge&outcome=failed&reason=no+such+charge&f_prefix=run&dry_run=yes";
        let s = Selection::parse(body);
        assert_eq!(
            s.calls,
            [
                ("run_1".into(), "charge".into()),
                ("run.2".into(), "ship".into())
            ],
            "in order, once each"
        );
        assert_eq!(
            (s.outcome.as_str(), s.reason.as_str(), s.dry_run.as_str()),
            ("failed", "no such charge", "yes")
        );
        assert_eq!(s.filter.prefix, "run");
        assert!(s.bad_call.is_none());
        assert_eq!(
            Selection::parse(b"call=nonode").bad_call.as_deref(),
            Some("nonode")
        );
        assert_eq!(Selection::parse(b"call=/x").bad_call.as_deref(), Some("/x"));
        assert_eq!(s.kept()["selected"], json!(["run_1/charge", "run.2/ship"]));
    }

    #[test]
    fn the_filter_reads_minutes_and_makes_its_own_address() {
        let now = flow_ledger::Timestamp(10 * 60_000);
        let q = InboxQuery {
            prefix: " batch-7 ".into(),
            age: "5".into(),
            ..InboxQuery::default()
        };
        let f = q.ledger(now).unwrap_or_default();
        assert_eq!(f.run_prefix.as_deref(), Some("batch-7"));
        assert_eq!(f.in_doubt_before, Some(flow_ledger::Timestamp(5 * 60_000)));
        assert_eq!(f.limit, PAGE_ROWS + 1);
        assert_eq!(q.address(), "/ui/in-doubt?prefix=batch-7&age=5");
        assert!(q.any());
        let bad = InboxQuery {
            age: "soon".into(),
            ..InboxQuery::default()
        };
        assert!(bad.ledger(now).is_err_and(|e| e.contains("`soon`")));
        assert_eq!(InboxQuery::default().address(), "/ui/in-doubt");
        assert!(!InboxQuery::default().any());
    }
}
