//! How rmcp's errors and results become flow's [`Error`] kinds and JSON outputs.

use std::time::SystemTime;

use rmcp::ServiceError;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::ClientInitializeError;
use rmcp::transport::streamable_http_client::StreamableHttpError;
use serde_json::Value;

use crate::Error;
use crate::error::chain;
use crate::http::classify::parse_retry_after;

/// A classified failure of a request on an established session.
pub(crate) struct Failure {
    pub(crate) error: Error,
    /// The request left the process (counted in `requests_sent`).
    pub(crate) sent: bool,
    /// The session is unusable; the next call starts a new one.
    pub(crate) discard: bool,
    /// A `WWW-Authenticate` challenge (HTTP 401, or 403 `insufficient_scope`).
    pub(crate) challenge: Option<String>,
}

impl Failure {
    fn sent(error: Error) -> Self {
        Failure {
            error,
            sent: true,
            discard: false,
            challenge: None,
        }
    }

    fn discard(mut self) -> Self {
        self.discard = true;
        self
    }
}

type HttpError = StreamableHttpError<reqwest::Error>;

/// The streamable-HTTP error inside a transport error, if that is what it is.
fn http_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a HttpError> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<HttpError>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// Classifies the failure of a request (`tools/call`, `tools/list`) handed to a live
/// session. `what` names the server and tool for the message.
pub(crate) fn request_error(error: &ServiceError, what: &str) -> Failure {
    let detail = chain(error);
    match error {
        ServiceError::McpError(data) => Failure::sent(Error::permanent(format!(
            "{what}: the server answered JSON-RPC error {}: {}",
            data.code.0, data.message
        ))),
        ServiceError::TransportSend(transport) => match http_error(transport.error.as_ref()) {
            Some(http) => http_failure(http, what, &detail),
            // stdio: writing to the child failed, so it is gone; a line may have been
            // half-written before it died.
            None => Failure::sent(Error::unknown(format!(
                "{what}: the transport failed while sending; the server may have received the call: {detail}"
            )))
            .discard(),
        },
        ServiceError::TransportClosed => Failure::sent(Error::unknown(format!(
            "{what}: the session closed before the answer arrived (server exited or connection lost); the call may have been processed"
        )))
        .discard(),
        ServiceError::UnexpectedResponse => Failure::sent(Error::permanent(format!(
            "{what}: the server answered with something other than a tool result (tasks and input requests are not supported)"
        ))),
        _ => Failure::sent(Error::unknown(format!("{what}: {detail}"))),
    }
}

fn http_failure(error: &HttpError, what: &str, detail: &str) -> Failure {
    match error {
        StreamableHttpError::AuthRequired(auth) => Failure {
            challenge: Some(auth.www_authenticate_header.clone()),
            ..Failure::sent(Error::permanent(format!(
                "{what}: HTTP 401 unauthorized: {}",
                auth.www_authenticate_header
            )))
        },
        StreamableHttpError::InsufficientScope(scope) => Failure {
            challenge: Some(scope.www_authenticate_header.clone()),
            ..Failure::sent(Error::permanent(format!(
                "{what}: HTTP 403 insufficient scope: {}",
                scope.www_authenticate_header
            )))
        },
        StreamableHttpError::HttpStatus(status) => {
            let message = format!("{what}: HTTP {}", status.status);
            if status.status == 429 || (500..600).contains(&status.status) {
                let retry_after = status
                    .retry_after
                    .as_deref()
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                Failure::sent(Error::transient(message, retry_after))
            } else {
                Failure::sent(Error::permanent(message))
            }
        }
        StreamableHttpError::SessionExpired => Failure::sent(Error::transient(
            format!("{what}: the server no longer knows this session (HTTP 404); the call was not processed and the next one starts a new session"),
            None,
        ))
        .discard(),
        StreamableHttpError::Client(inner) if inner.is_connect() => Failure {
            error: Error::not_sent(format!("{what}: could not connect: {detail}")),
            sent: false,
            discard: true,
            challenge: None,
        },
        StreamableHttpError::Client(inner) if inner.is_builder() => Failure {
            error: Error::permanent(format!("{what}: invalid request: {detail}")),
            sent: false,
            discard: false,
            challenge: None,
        },
        StreamableHttpError::ReservedHeaderConflict(name) => Failure {
            error: Error::permanent(format!(
                "{what}: header `{name}` is reserved by the MCP transport"
            )),
            sent: false,
            discard: false,
            challenge: None,
        },
        StreamableHttpError::ResponseBodyTooLarge { max_size } => oversized(what, *max_size),
        StreamableHttpError::UnexpectedServerResponse(text) if text.starts_with("HTTP 4") => {
            Failure::sent(Error::permanent(format!("{what}: {text}")))
        }
        StreamableHttpError::UnexpectedContentType(content_type) => Failure::sent(Error::permanent(
            format!(
                "{what}: the server answered content type {content_type:?}; is the url an MCP endpoint?"
            ),
        )),
        StreamableHttpError::TransportChannelClosed => Failure::sent(Error::unknown(format!(
            "{what}: the session closed before the answer arrived; the call may have been processed"
        )))
        .discard(),
        _ => Failure::sent(Error::unknown(format!(
            "{what}: the request failed after it was sent; the server may have processed it: {detail}"
        ))),
    }
}

/// An answer over the transport's limit, over HTTP or stdio alike: the server processed
/// the call (it answered), so re-sending cannot help and the outcome is not unknown; the
/// session is replaced (a stdio stream that tripped the limit is closed).
pub(crate) fn oversized(what: &str, max_size: usize) -> Failure {
    Failure::sent(Error::permanent(format!(
        "{what}: the answer exceeded {max_size} bytes; the server did process the call"
    )))
    .discard()
}

/// Classifies a failure to start a session. Nothing of the tool call has left yet, so
/// the kind is `NotSent` unless the server's answer says retrying cannot help
/// (`Permanent`) or asks to wait (`Transient`). The challenge, if any, is returned for
/// a re-authentication.
pub(crate) fn initialize_error(
    error: &ClientInitializeError,
    what: &str,
) -> (Error, Option<String>) {
    let detail = chain(error);
    if let Some(challenge) = error.auth_challenge() {
        let error = Error::permanent(format!(
            "{what}: the server refused the credentials while initializing: {challenge}"
        ));
        return (error, Some(challenge.to_string()));
    }
    let http = match error {
        ClientInitializeError::TransportError { error, .. } => http_error(error.error.as_ref()),
        _ => None,
    };
    let error = match (error, http) {
        (
            ClientInitializeError::NoCompatibleProtocolVersion {
                server_supported, ..
            },
            _,
        ) => super::version::no_common_version(server_supported, what),
        (ClientInitializeError::JsonRpcError(data), _) => Error::permanent(format!(
            "{what}: the server refused to initialize: JSON-RPC error {}: {}",
            data.code.0, data.message
        )),
        (_, Some(StreamableHttpError::HttpStatus(status))) => {
            let retry_after = status
                .retry_after
                .as_deref()
                .and_then(|v| parse_retry_after(v, SystemTime::now()));
            Error::transient(
                format!(
                    "{what}: HTTP {} while initializing; the tool call was not sent",
                    status.status
                ),
                retry_after,
            )
        }
        (_, Some(StreamableHttpError::UnexpectedServerResponse(text)))
            if text.starts_with("HTTP 4") =>
        {
            Error::permanent(format!("{what}: {text} while initializing"))
        }
        (_, Some(StreamableHttpError::ReservedHeaderConflict(name))) => Error::permanent(format!(
            "{what}: header `{name}` is reserved by the MCP transport"
        )),
        _ => Error::not_sent(format!(
            "{what}: could not start the session; the tool call was not sent: {detail}"
        )),
    };
    (error, None)
}

/// A tool result as flow output.
///
/// - `isError: true` → `Permanent`, carrying the tool's text;
/// - `structuredContent` when present;
/// - otherwise the content: one text block → its text, parsed as JSON when it is JSON;
///   several text blocks → an array of them (each parsed the same way); no content →
///   `null`; any non-text block (image, resource…) → the whole content array as MCP
///   JSON, so nothing is lost.
pub(crate) fn output(result: CallToolResult, what: &str) -> Result<Value, Error> {
    if result.is_error == Some(true) {
        let mut text = texts(&result.content).join("\n");
        if text.is_empty() {
            text = result
                .structured_content
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_else(|| "(no message)".to_string());
        }
        return Err(Error::permanent(format!(
            "{what}: the tool reported an error: {text}"
        )));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    let all_text = result
        .content
        .iter()
        .all(|block| matches!(block, ContentBlock::Text(_)));
    if !all_text {
        return serde_json::to_value(&result.content)
            .map_err(|e| Error::permanent(format!("{what}: {e}")));
    }
    let mut parts: Vec<Value> = texts(&result.content).into_iter().map(parse_text).collect();
    Ok(match parts.len() {
        0 => Value::Null,
        1 => parts.remove(0),
        _ => Value::Array(parts),
    })
}

fn texts(content: &[ContentBlock]) -> Vec<&str> {
    content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.as_str()))
        .collect()
}

fn parse_text(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|_| Value::String(text.to_string()))
}
