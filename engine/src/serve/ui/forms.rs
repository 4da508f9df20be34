//! What the console's forms share: a form body read (its rejection a 400 page), the
//! body of a form that carries only its CSRF token, reading a form's resolution as the
//! JSON API would, a typed reason, and the URL escaping of the addresses the pages link
//! to. Its own
//! file so that both the POST handlers (`actions.rs`) and the worklist (`inbox.rs`)
//! use one reading of a resolution without importing each other.

use axum::extract::Form;
use axum::extract::rejection::FormRejection;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value as Json;

use super::Page;

use crate::serve::api::steer::{Outcome, resolution};

/// A form body, its rejection a 400 page.
pub(super) fn form<T>(f: Result<Form<T>, FormRejection>) -> Result<T, Page> {
    f.map(|Form(v)| v)
        .map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))
}

/// The body of a button form that carries nothing but its CSRF token (probe now, a
/// schedule's pause/resume/run now, a connection's Connect).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CsrfForm {
    /// The session's CSRF token.
    pub(super) csrf: String,
}

/// `s` for a URL's query or path segment.
pub(super) fn url(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The outcome a form names, or 400.
fn outcome(text: &str) -> Result<Outcome, String> {
    match text {
        "succeeded" => Ok(Outcome::Succeeded),
        "failed" => Ok(Outcome::Failed),
        "retry" => Ok(Outcome::Retry),
        other => Err(format!(
            "outcome: `{other}` is not succeeded, failed or retry"
        )),
    }
}

/// The resolution a form asks for, checked as the JSON API checks it (the output must
/// be JSON; `failed` records the reason as the error).
pub(super) fn how(
    outcome_text: &str,
    output: &str,
    reason: &str,
) -> Result<flow_ledger::Resolution, String> {
    let outcome = outcome(outcome_text)?;
    let output = match outcome {
        Outcome::Succeeded => Some(serde_json::from_str::<Json>(output).map_err(|e| {
            format!("output: not JSON ({e}); give the call's output, e.g. {{\"id\": \"re_1\"}}")
        })?),
        _ => None,
    };
    let error = (outcome == Outcome::Failed && !reason.trim().is_empty())
        .then(|| reason.trim().to_string());
    resolution(outcome, output, error).map_err(|p| p.detail)
}

/// A reason as typed, `None` when blank.
pub(super) fn reason(text: &str) -> Option<String> {
    Some(text.trim().to_string()).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn forms_resolve_as_the_api_does() {
        assert!(matches!(
            how("succeeded", r#"{"id": 1}"#, ""),
            Ok(flow_ledger::Resolution::Succeeded(v)) if v == json!({"id": 1})
        ));
        assert!(
            how("succeeded", "{not json", "").is_err_and(|e| e.starts_with("output: not JSON"))
        );
        assert!(how("succeeded", "", "").is_err());
        assert!(matches!(
            how("failed", "", " declined "),
            Ok(flow_ledger::Resolution::Failed(e)) if e == "declined"
        ));
        assert!(matches!(
            how("retry", "", ""),
            Ok(flow_ledger::Resolution::Retry)
        ));
        assert!(how("maybe", "", "").is_err_and(|e| e.contains("`maybe`")));
        assert_eq!(url("run 1/&"), "run+1%2F%26");
    }
}
