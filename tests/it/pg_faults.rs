//! PostgreSQL faults between flow and its ledger, made by a proxy that reads the wire
//! protocol ([`PgProxy`]): the server commits a statement and the acknowledgement never
//! reaches flow, or the connection is cut under a statement and the server refuses new
//! ones for a while. Issue 49, break 9: a lost acknowledgement of the outbound mark made
//! a false doubt — the server had the mark, flow saw a reset, nothing had been sent, and
//! a person was asked to decide. The process knows it never wrote the request: it gives
//! the call back unsent and sends it once. Break 8: an outage while the answer is being
//! recorded threw answered calls into doubt; the outcome write is retried while the
//! worker holds the call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::approvals::events;
use crate::support::{Backend, TestDb, call, output, postgres_admin, postgres_available};
use crate::support::{run_id, runtime, show, stderr};

/// A loopback proxy in front of PostgreSQL that can swallow the server's answer to one
/// committed statement, then cut the connection: the commit happened, the client never
/// hears of it. It parses the protocol's framing (type byte, length) in both directions
/// and needs `sslmode=disable` on the client (it cannot read TLS).
pub struct PgProxy {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicU32>,
    cut: Arc<Cut>,
}

/// The cut fault: the first statement binding `pattern` is never forwarded; its
/// connection is closed and new connections are refused until `until`.
#[derive(Default)]
struct Cut {
    pattern: Mutex<Option<&'static [u8]>>,
    until: Mutex<Option<Instant>>,
    done: AtomicU32,
}

/// The server's transaction status from its last `ReadyForQuery`: `I` idle (a statement
/// sent now commits on its own), `T` in a transaction, `E` failed.
const IDLE: u8 = b'I';

impl PgProxy {
    /// Listens on an ephemeral loopback port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<PgProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let armed = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU32::new(0));
        let cut = Arc::new(Cut::default());
        let (a, d, k) = (armed.clone(), dropped.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let refusing = k
                    .until
                    .lock()
                    .ok()
                    .and_then(|u| *u)
                    .is_some_and(|u| Instant::now() < u);
                if refusing {
                    drop(client);
                    continue;
                }
                let (a, d, k) = (a.clone(), d.clone(), k.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = relay(client, server, a, d, k).await;
                    }
                });
            }
        });
        Ok(PgProxy {
            addr,
            armed,
            dropped,
            cut,
        })
    }

    /// The next statement that commits on its own (outside a transaction) and binds the
    /// text `outbound` — the outbound mark — is committed by the server and its answer
    /// swallowed; the connection is then cut.
    pub fn drop_next_outbound_ack(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// The next statement that binds the text `pattern` (in or out of a transaction) is
    /// never forwarded: its connection is cut and new connections are refused for
    /// `outage` — a database gone for a moment exactly then.
    pub fn cut_next(&self, pattern: &'static [u8], outage: Duration) {
        if let Ok(mut p) = self.cut.pattern.lock() {
            *p = Some(pattern);
        }
        if let Ok(mut u) = self.cut.until.lock() {
            *u = None;
        }
        // The outage starts when the statement is cut.
        self.cut.done.store(0, Ordering::SeqCst);
        OUTAGE_MS.store(
            u32::try_from(outage.as_millis()).unwrap_or(u32::MAX),
            Ordering::SeqCst,
        );
    }

    /// How many statements were cut.
    pub fn cuts(&self) -> u32 {
        self.cut.done.load(Ordering::SeqCst)
    }

    /// How many acknowledgements were swallowed.
    pub fn dropped(&self) -> u32 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// `url` (a `postgres://` URL) pointed at this proxy, without TLS.
    pub fn url(&self, url: &str) -> String {
        let (host, port) = postgres_admin();
        let url = url.replace(&format!("@{host}:{port}/"), &format!("@{}/", self.addr));
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}sslmode=disable")
    }
}

/// One typed message: its type byte and the whole frame (type, length, body).
async fn frame(r: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut frame = head.to_vec();
    frame.resize(1 + len.max(4), 0);
    r.read_exact(&mut frame[5..]).await?;
    Ok((head[0], frame))
}

/// How long the cut fault's outage lasts (one proxy per test).
static OUTAGE_MS: AtomicU32 = AtomicU32::new(0);

async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicU32>,
    cut: Arc<Cut>,
) -> std::io::Result<()> {
    // Small frames one by one: without this, Nagle's algorithm and delayed ACKs add
    // ~40-200 ms to each statement.
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    // Untyped start: an SSLRequest (answered with one byte) and the startup message.
    loop {
        let mut head = [0u8; 8];
        client.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let mut rest = vec![0u8; len.saturating_sub(8)];
        client.read_exact(&mut rest).await?;
        server.write_all(&head).await?;
        server.write_all(&rest).await?;
        if code == 80_877_103 || code == 80_877_104 {
            let mut answer = [0u8; 1];
            server.read_exact(&mut answer).await?;
            client.write_all(&answer).await?;
            continue;
        }
        break;
    }
    let status = Arc::new(AtomicU8::new(0));
    let swallow = Arc::new(AtomicBool::new(false));
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let (st, sw_flag) = (status.clone(), swallow.clone());
    let up = async move {
        loop {
            let (kind, bytes) = frame(&mut cr).await?;
            if kind == b'B' {
                let hit = cut.pattern.lock().ok().and_then(|mut p| {
                    let pattern = (*p)?;
                    bytes
                        .windows(pattern.len())
                        .any(|w| w == pattern)
                        .then(|| p.take())
                        .flatten()
                });
                if hit.is_some() {
                    let outage = Duration::from_millis(u64::from(OUTAGE_MS.load(Ordering::SeqCst)));
                    if let Ok(mut u) = cut.until.lock() {
                        *u = Some(Instant::now() + outage);
                    }
                    cut.done.fetch_add(1, Ordering::SeqCst);
                    return Err(std::io::Error::other("cut"));
                }
            }
            if kind == b'B'
                && st.load(Ordering::SeqCst) == IDLE
                && bytes.windows(8).any(|w| w == b"outbound")
                && armed.swap(false, Ordering::SeqCst)
            {
                sw_flag.store(true, Ordering::SeqCst);
            }
            sw.write_all(&bytes).await?;
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    };
    let down = async move {
        loop {
            let (kind, bytes) = frame(&mut sr).await?;
            if kind == b'Z' {
                status.store(bytes.get(5).copied().unwrap_or(0), Ordering::SeqCst);
            }
            if swallow.load(Ordering::SeqCst) {
                if kind == b'Z' {
                    // Committed and answered: the client never hears of it.
                    dropped.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
                continue;
            }
            cw.write_all(&bytes).await?;
        }
    };
    // Whichever side ends first ends the connection (both halves are dropped).
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}

/// A PostgreSQL ledger reached through a new [`PgProxy`], a counting downstream, and a
/// one-node workflow `pay.yaml` whose `charge` POSTs to it.
async fn charge_behind_a_proxy() -> (CountingServer, TestDb, PgProxy, std::path::PathBuf) {
    let down = CountingServer::start().await.expect("downstream");
    let db = TestDb::new(Backend::Postgres);
    let (host, port) = postgres_admin();
    let upstream: SocketAddr = format!("{host}:{port}")
        .parse()
        .expect("PostgreSQL address");
    let proxy = PgProxy::start(upstream).await.expect("proxy");
    let file = db.write(
        "pay.yaml",
        &format!(
            "name: pay\ntools:\n  pay: {{ kind: http, method: POST, url: \"{}/pay\" }}\nnodes:\n  charge:\n    tool: pay\n    with: {{ amount: 10 }}\n",
            down.url()
        ),
    );
    (down, db, proxy, file)
}

/// The run ended `succeeded` with `charge` sent once, under its first key, and never in
/// doubt.
fn sent_once_never_in_doubt(down: &CountingServer, db: &TestDb, out: &std::process::Output) {
    let run = run_id(out);
    assert_eq!(down.total(), 1, "sent once");
    assert_eq!(
        down.count(&format!("{run}:charge:1")),
        1,
        "under its first key"
    );
    assert_eq!(call(&show(db, &run), "charge")["status"], "succeeded");
    assert_eq!(events(db, &run, "tool_call.in_doubt"), 0, "never in doubt");
}

/// The outbound mark commits on the server, its acknowledgement is lost and the
/// connection cut: flow knows it wrote nothing, gives the call back unsent, claims it
/// again and sends it once — the run succeeds with no call ever in doubt. Before the
/// fix this call was in doubt and the run paused for a person (exit 3).
#[test]
fn a_lost_acknowledgement_of_the_outbound_mark_sends_once_and_is_no_doubt() {
    if !postgres_available() {
        return;
    }
    let rt = runtime();
    let (down, db, proxy, file) = rt.block_on(charge_behind_a_proxy());
    proxy.drop_next_outbound_ack();
    let out = output(
        db.flow()
            .env("FLOW_DATABASE_URL", proxy.url(&db.url))
            .arg("run")
            .arg(&file),
    );
    assert_eq!(
        proxy.dropped(),
        1,
        "the mark's acknowledgement was swallowed"
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("given back"), "the give-back is said: {said}");
    sent_once_never_in_doubt(&down, &db, &out);
}

/// The downstream answers, and the database goes away exactly as flow records the
/// answer (the connection cut under the outcome's statement, new connections refused
/// for 3 s): flow keeps the answer and retries the write while it holds the call (on a
/// pooled connection still open, or after the outage), so
/// the call ends `succeeded`, sent once, never in doubt. Before the fix the answer was
/// dropped and the call left in doubt for a person.
#[test]
fn an_outage_while_the_answer_is_recorded_keeps_the_answer_not_a_doubt() {
    if !postgres_available() {
        return;
    }
    let rt = runtime();
    let (down, db, proxy, file) = rt.block_on(charge_behind_a_proxy());
    // The outcome's statement binds the call's output: the downstream's echo, the one
    // text holding `"path":"/pay"` (the workflow and the request hold the URL).
    proxy.cut_next(br#""path":"/pay""#, Duration::from_secs(3));
    let out = output(
        db.flow()
            .env("FLOW_DATABASE_URL", proxy.url(&db.url))
            .arg("run")
            .arg(&file),
    );
    let said = stderr(&out);
    assert_eq!(proxy.cuts(), 1, "the outcome's statement was cut: {said}");
    assert!(
        said.contains("cannot record the call's outcome yet; retrying"),
        "the outcome write is retried: {said}"
    );
    // The answer is kept; a later write of the run (its finish) may still meet the
    // outage on another pooled connection the cut reset: then the run stops with exit 5
    // and says how to go on, and a resume finishes it without sending again.
    if out.status.code() == Some(5) {
        assert!(said.contains("resume"), "it says how to continue: {said}");
        let resumed = output(db.flow().arg("resume").arg(run_id(&out)));
        assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    } else {
        assert_eq!(out.status.code(), Some(0), "{said}");
    }
    sent_once_never_in_doubt(&down, &db, &out);
}
