//! `GET /api/v1/runs/{id}/items`: every item of a `for_each` node, paged by key — the
//! run's view groups them (counts and the items that did not simply succeed); this is
//! where all 10,000 can be read, a page at a time.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use flow_ledger::StepStatus;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::serve::App;
use crate::serve::auth::{Authed, Viewer};
use crate::serve::problem::{ApiQuery, Problem};
use crate::view::ItemView;

/// Which items, from where.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemQuery {
    /// The `for_each` node.
    pub(crate) node: String,
    /// Only items whose latest step is in this state (empty: any).
    #[serde(default, deserialize_with = "empty_is_none")]
    #[schemars(with = "Option<StepStatus>")]
    pub(crate) status: Option<StepStatus>,
    /// Items after this key (the `next` of the previous page).
    pub(crate) after: Option<String>,
    /// At most this many, 1 to 1,000 (default 100).
    #[schemars(range(min = 1, max = 1000))]
    pub(crate) limit: Option<u32>,
}

/// `status=` (a form's "any") is no filter, not an unknown state.
fn empty_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StepStatus>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    match text.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// A page of items, by key.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ItemPage {
    /// Each item's key and latest step.
    pub items: Vec<ItemView>,
    /// The `after` of the next page (`null`: this is the last).
    pub next: Option<String>,
}

/// The items of `q.node` in run `id`, by key, after `q.after`.
pub async fn list(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ItemQuery>,
) -> Result<Response, Problem> {
    let page = page(&app.ledger, &id, &q).await?;
    Ok(Json(page).into_response())
}

/// One page of items (also the console's item table).
pub(crate) async fn page(
    ledger: &flow_ledger::Ledger,
    id: &str,
    q: &ItemQuery,
) -> Result<ItemPage, Problem> {
    let steps = match ledger.list_steps(id).await {
        Ok(steps) => steps,
        Err(flow_ledger::Error::NotFound { .. }) => {
            return Err(Problem::not_found(format!("no run `{id}`")));
        }
        Err(e) => return Err(Problem::ledger(&e)),
    };
    if steps.is_empty() {
        // A run with no step yet, or no run at all: say which.
        ledger.get_run(id).await.map_err(|e| match e {
            flow_ledger::Error::NotFound { .. } => Problem::not_found(format!("no run `{id}`")),
            e => Problem::ledger(&e),
        })?;
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000) as usize;
    let mut items: Vec<ItemView> = crate::view::items::items(&q.node, &steps)
        .into_iter()
        .filter(|i| q.after.as_ref().is_none_or(|a| i.key.as_str() > a.as_str()))
        .filter(|i| q.status.is_none_or(|s| i.status == s))
        .take(limit + 1)
        .collect();
    let next = (items.len() > limit).then(|| {
        items.truncate(limit);
        items.last().map(|i| i.key.clone())
    });
    Ok(ItemPage {
        items,
        next: next.flatten(),
    })
}
