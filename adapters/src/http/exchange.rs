//! A request whose every answer is data: what a reconciliation probe needs. A tool call
//! turns a 404 into a permanent error; a probe must see the 404 (the effect is not
//! there) as plainly as a 200 (it is), so [`HttpTool::exchange`] returns the status,
//! headers and body of whatever final answer came, under the same rules of sending
//! (timeouts, redirects within the allow-list, the body cap) as a call.

use serde_json::{Map, Value};

use super::{Answer, HttpTool, ReadError, parse_body, read_capped};
use crate::{Call, Error};

/// One final answer, whatever its status.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// The HTTP status.
    pub status: u16,
    /// Response headers, names lower-case (values that are not text are skipped).
    pub headers: Map<String, Value>,
    /// The body: JSON when it parses, else the text; empty → `null`.
    pub body: Value,
    /// Requests sent (one per redirect hop).
    pub requests_sent: u32,
}

impl HttpTool {
    /// Sends `call` and returns the final answer as data; an error (connection refused,
    /// timeout, a body over the cap, a redirect not allowed) with the requests sent.
    pub async fn exchange(&self, call: Call) -> Result<Exchange, (Error, u32)> {
        let Answer {
            hop,
            mut response,
            deadline,
            sent,
        } = self.final_response(&call).await.map_err(|o| {
            (
                o.result
                    .err()
                    .unwrap_or_else(|| Error::unknown("no answer")),
                o.requests_sent,
            )
        })?;
        let status = response.status();
        let headers: Map<String, Value> = response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), Value::from(v.to_str().ok()?))))
            .collect();
        let cap = self.spec.max_response_bytes;
        let what = hop.describe();
        let body = match tokio::time::timeout_at(deadline, read_capped(&mut response, cap)).await {
            Ok(Ok(body)) => parse_body(&body),
            Ok(Err(ReadError::TooLarge)) => {
                let message = format!("{what}: HTTP {status} with a body over the {cap}-byte cap");
                return Err((Error::permanent(message), sent));
            }
            Ok(Err(ReadError::Transport(e))) => {
                return Err((
                    Error::unknown(format!("{what}: reading the body: {e}")),
                    sent,
                ));
            }
            Err(_) => {
                return Err((
                    Error::unknown(format!("{what}: timed out reading the body")),
                    sent,
                ));
            }
        };
        Ok(Exchange {
            status: status.as_u16(),
            headers,
            body,
            requests_sent: sent,
        })
    }
}
