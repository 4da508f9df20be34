//! A webhook receiver on loopback that keeps the raw body bytes (signatures are over
//! bytes) and fails or holds requests on demand.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

/// One request as the webhook got it: headers and the raw body bytes.
#[derive(Debug, Clone)]
pub struct Received {
    pub event_id: String,
    pub signature: String,
    pub idempotency_key: String,
    pub body: Vec<u8>,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON: {e}"))
    }
}

#[derive(Default)]
pub struct HookState {
    pub received: Vec<Received>,
    /// Requests still to fail with 500.
    pub fail: u32,
    /// Hold requests (never answer) while set.
    pub hold: bool,
}

/// A webhook receiver on loopback that keeps raw bodies (signatures are over bytes).
pub struct Hook {
    addr: SocketAddr,
    state: Arc<Mutex<HookState>>,
}

async fn receive(
    State(state): State<Arc<Mutex<HookState>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (fail, hold) = {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.received.push(Received {
            event_id: header("flow-event-id"),
            signature: header("flow-signature"),
            idempotency_key: header("idempotency-key"),
            body: body.to_vec(),
        });
        let fail = s.fail > 0;
        if fail {
            s.fail -= 1;
        }
        (fail, s.hold)
    };
    if hold {
        // Never answers: the dispatcher is killed while it waits.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if fail {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "failing on purpose".into(),
        )
    } else {
        (StatusCode::NO_CONTENT, String::new())
    }
}

impl Hook {
    pub fn start(rt: &tokio::runtime::Runtime) -> Hook {
        let state = Arc::new(Mutex::new(HookState::default()));
        let router = axum::Router::new()
            .fallback(receive)
            .with_state(state.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        rt.spawn(async move { axum::serve(listener, router).await });
        Hook { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}/flow-events", self.addr)
    }

    pub fn set(&self, f: impl FnOnce(&mut HookState)) {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn received(&self) -> Vec<Received> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .received
            .clone()
    }

    /// Waits until `pred` holds for what arrived, or fails the test after `within`.
    pub fn wait_for(&self, within: Duration, what: &str, pred: impl Fn(&[Received]) -> bool) {
        let start = Instant::now();
        while !pred(&self.received()) {
            assert!(
                start.elapsed() < within,
                "timed out waiting for {what}; got {:?}",
                self.received()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
