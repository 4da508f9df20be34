//! The stdio transport of an MCP server, with the answer limit it shares with HTTP.
//!
//! rmcp's stdio transport drops a line over its limit (16 MiB) and logs it, keeping the
//! session open, so the call it answered waits out its whole timeout and ends "unknown"
//! (in doubt) — while over streamable HTTP the same answer is a permanent failure at
//! once ("the answer exceeded N bytes; the server did process the call"). flow reads the
//! child's stdout through [`Capped`], which ends the stream at such a line and flags it,
//! so the pool classifies both transports alike ([`super::classify::oversized`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};

/// The largest message flow reads from an MCP server: rmcp's own limit on an HTTP JSON
/// body and on an SSE event, applied to a stdio line too.
pub(crate) const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// A reader that ends (EOF) at the first line longer than `limit` bytes and sets `over`.
/// The bytes of that line already passed on form an incomplete message, which rmcp
/// discards at EOF; the session then ends, and the call in flight fails at once.
pub(crate) struct Capped<R> {
    inner: R,
    limit: usize,
    line: usize,
    over: Arc<AtomicBool>,
}

impl<R> Capped<R> {
    /// `inner`, capped at [`MAX_MESSAGE_BYTES`] per line; `over` is set when it trips.
    pub(crate) fn new(inner: R, over: Arc<AtomicBool>) -> Self {
        Self::with_limit(inner, MAX_MESSAGE_BYTES, over)
    }

    fn with_limit(inner: R, limit: usize, over: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            limit,
            line: 0,
            over,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Capped<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.over.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let mut cut = None;
        for (i, byte) in buf.filled()[before..].iter().enumerate() {
            if *byte == b'\n' {
                this.line = 0;
                continue;
            }
            this.line += 1;
            if this.line > this.limit {
                cut = Some(before + i);
                break;
            }
        }
        if let Some(at) = cut {
            buf.set_filled(at);
            this.over.store(true, Ordering::Release);
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn lines_within_the_limit_pass_and_a_longer_one_ends_the_stream() {
        let over = Arc::new(AtomicBool::new(false));
        let data: &[u8] = b"abcd\nabcde\nxyz\n";
        let mut r = Capped::with_limit(data, 4, over.clone());
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.expect("read");
        assert_eq!(out, b"abcd\nabcd");
        assert!(over.load(Ordering::Acquire));

        let over = Arc::new(AtomicBool::new(false));
        let mut r = Capped::with_limit(&b"abcd\nab\n"[..], 4, over.clone());
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.expect("read");
        assert_eq!(out, b"abcd\nab\n");
        assert!(!over.load(Ordering::Acquire));
    }
}
