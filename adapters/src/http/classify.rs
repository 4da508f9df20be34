//! How an HTTP answer or a transport failure becomes an [`FailureKind`].

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use crate::error::chain;
use crate::{Error, FailureKind};

/// The kind of a non-2xx, non-3xx status: the retryable statuses of RFC 9110 (408
/// Request Timeout, 425 Too Early, 429 Too Many Requests, every 5xx) are `Transient`,
/// every other 4xx is `Permanent`.
pub(crate) fn status_kind(status: StatusCode, headers: &HeaderMap) -> FailureKind {
    let code = status.as_u16();
    if matches!(code, 408 | 425 | 429) || status.is_server_error() {
        FailureKind::Transient {
            retry_after: retry_after(headers),
        }
    } else {
        FailureKind::Permanent
    }
}

/// `Retry-After` as a delay: delta-seconds or an HTTP date (a date in the past is no
/// delay). An unparsable value is ignored rather than trusted.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(value, SystemTime::now())
}

/// [`retry_after`] on a raw value, with the clock as an input for tests.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Where a transport failure happened, which decides whether the request left.
pub(crate) enum Failure {
    /// Connecting failed (refused, DNS, TLS handshake): nothing was written.
    Connect(Error),
    /// The request could not even be built: nothing was written, and retrying cannot help.
    Invalid(Error),
    /// After the connection was made: the request may have been processed.
    Sent(Error),
}

/// Classifies a reqwest error from sending or reading; `what` names the request
/// ("POST http://host/path") without its query, which may carry credentials.
pub(crate) fn transport(error: &reqwest::Error, what: &str) -> Failure {
    let detail = detail(error);
    if error.is_connect() {
        return Failure::Connect(Error::not_sent(format!(
            "{what}: could not connect: {detail}"
        )));
    }
    if error.is_builder() {
        return Failure::Invalid(Error::permanent(format!(
            "{what}: invalid request: {detail}"
        )));
    }
    if error.is_timeout() {
        return Failure::Sent(Error::unknown(format!(
            "{what}: timed out after the request was sent; the downstream may have processed it"
        )));
    }
    Failure::Sent(Error::unknown(format!(
        "{what}: connection failed after the request was sent; the downstream may have processed it: {detail}"
    )))
}

/// A reqwest error and its sources as one line, credentials in its URL removed.
pub(crate) fn detail(error: &reqwest::Error) -> String {
    chain(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn statuses() {
        let none = HeaderMap::new();
        for code in [408, 425, 429, 500, 502, 503, 504] {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
            assert_eq!(
                status_kind(status, &none),
                FailureKind::Transient { retry_after: None },
                "{code}"
            );
        }
        for code in [400, 401, 403, 404, 409, 410, 422] {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
            assert_eq!(status_kind(status, &none), FailureKind::Permanent, "{code}");
        }
    }
}
