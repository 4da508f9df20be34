//! Callbacks, and what a wait's state means for its step (`wait_result`, shared with a
//! `wait:` node's step, which the executor runs: `executor/wait.rs`). A node with
//! `callback:` mints a single-use token before its call is rendered
//! (`${{ callback.url }}`, `${{ callback.token }}`), sends the call as any other, and then
//! waits for that token to be called. Both rows are in the ledger before anything
//! leaves, so a callback that comes back before the call's response is recorded is kept.

use base64::Engine as _;
use flow_ledger::{BeginWait, ErrorKind, StepFinish, StepStatus, Wait, WaitKind, WaitStatus};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

use super::{Gateway, NodeStep, StepCall, StepResult};
use crate::duration_text::whole_millis;
use crate::workflow::model::{CallbackDecl, OnTimeout};

/// What a waiting node waits for (progress lines, metrics, the pause reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Awaited {
    /// A published event of this name.
    Event(String),
    /// A callback to the node's token.
    Callback,
    /// A sub-workflow's run (its id) to end.
    Child(String),
    /// A sub-workflow's run (its id) paused with a call in doubt: nothing of it is in
    /// flight, so, like a tool item in doubt, it holds no `for_each` slot; it waits for
    /// that call's resolution in the child.
    ChildInDoubt(String),
}

/// The token a callback node hands its downstream, and the context it renders in.
pub(super) struct Minted {
    /// The token itself (never stored; scrubbed from everything that is).
    pub(super) token: String,
    /// The URL built from it (scrubbed whole: `public_url` may differ between
    /// workers, and must not change the stored request's digest).
    pub(super) url: String,
    /// `{"url": …, "token": …}` for `${{ callback.* }}`.
    pub(super) ctx: Json,
}

/// The SHA-256 (hex) a callback token is stored and looked up as.
pub fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Gateway {
    /// `[api] public_url`, if set.
    pub fn public_url(&self) -> Option<&str> {
        self.inner.public_url.as_deref()
    }

    /// Mints the token of a callback node's step and records its wait (pending from now,
    /// or as it stands if this step already waits): done before the call is rendered.
    /// `Err` with the step's result when the wait is over already (timed out while the
    /// run was away) or `[api] public_url` is not set: nothing is sent then.
    pub(super) async fn mint_callback(
        &self,
        c: &StepCall<'_>,
        cb: &CallbackDecl,
    ) -> Result<Result<Minted, StepResult>, flow_ledger::Error> {
        // Only a step that never claimed a call may end here without one: a step left
        // running may have its call outbound, which the claim must see (in doubt).
        let fresh = c.origin != super::StepOrigin::Running;
        let Some(base) = &self.inner.public_url else {
            let message = "`callback.url` needs `[api] public_url` in flow.toml (the address downstreams reach `flow serve` at); nothing was sent".to_owned();
            return self
                .fail_without_claim(c, ErrorKind::Permanent, message)
                .await
                .map(Err);
        };
        let token =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        let url = format!("{base}/api/v1/callbacks/{token}");
        let minted = Minted {
            ctx: json!({ "url": url, "token": token }),
            token,
            url,
        };
        // Resumed after its callback came: the call went out (a token only leaves in a
        // request marked outbound), so this render only replays it; the token is never
        // stored, since nothing will send it (`callback_expired` refuses a send).
        if !fresh
            && let Some(w) = self
                .inner
                .ledger
                .get_wait(&c.run().run_id, &c.node.id)
                .await?
            && w.step_id == c.step_id
            && matches!(w.status, WaitStatus::Completed | WaitStatus::Failed)
        {
            return Ok(Ok(minted));
        }
        let begin = BeginWait {
            node_id: c.node.id.clone(),
            step_id: c.step_id.clone(),
            kind: WaitKind::Callback,
            event_name: None,
            matcher: None,
            lookback_ms: 0,
            timeout_ms: whole_millis(cb.timeout),
            heartbeat_ms: cb.heartbeat.map(whole_millis),
            token_hash: Some(token_hash(&minted.token)),
        };
        let wait = self
            .inner
            .ledger
            .begin_wait(c.run(), begin, self.now())
            .await?;
        if fresh && matches!(wait.status, WaitStatus::TimedOut | WaitStatus::Cancelled) {
            let step = self.new_step(c, StepStatus::Running);
            c.writer.open_step(c.origin, step, self.now()).await?;
            return self.wait_result(c, wait, cb.on_timeout).await.map(Err);
        }
        Ok(Ok(minted))
    }

    /// A callback node's call was claimed to be sent, but its wait is settled already
    /// (timed out while the run was away, the run finished, or the callback came): the
    /// claim is released unsent and the wait's result applies. `None` when the call may
    /// go.
    pub(super) async fn callback_expired(
        &self,
        c: &StepCall<'_>,
        lease: &flow_ledger::CallLease,
    ) -> Result<Option<StepResult>, flow_ledger::Error> {
        let Some(cb) = c.node.callback() else {
            return Ok(None);
        };
        let wait = self
            .inner
            .ledger
            .get_wait(&c.run().run_id, &c.node.id)
            .await?;
        match wait {
            // Over already (timed out, cancelled), or its callback came (the call went
            // out; never send it again).
            Some(w) if w.step_id == c.step_id && w.status != WaitStatus::Pending => {
                self.inner.ledger.release_call(lease, self.now()).await?;
                self.wait_result(c, w, cb.on_timeout).await.map(Some)
            }
            _ => Ok(None),
        }
    }

    /// After a callback node's call succeeded (sent now or replayed): the callback's
    /// result if it came (even before the call's response), else wait.
    pub(super) async fn after_callback_call(
        &self,
        c: &StepCall<'_>,
        cb: &CallbackDecl,
    ) -> Result<StepResult, flow_ledger::Error> {
        let wait = self
            .inner
            .ledger
            .get_wait(&c.run().run_id, &c.node.id)
            .await?
            .filter(|w| w.step_id == c.step_id)
            .ok_or(flow_ledger::Error::LeaseLost)?;
        self.wait_result(c, wait, cb.on_timeout).await
    }

    /// What a wait's state means for its step: the output, a failure, a timeout's
    /// `on_timeout`, or still waiting.
    pub(crate) async fn wait_result(
        &self,
        c: &NodeStep<'_>,
        wait: Wait,
        on_timeout: OnTimeout,
    ) -> Result<StepResult, flow_ledger::Error> {
        let on = match &wait.event_name {
            Some(name) => Awaited::Event(name.clone()),
            None => Awaited::Callback,
        };
        let what = match &on {
            Awaited::Event(name) => format!("no `{name}` event matched"),
            Awaited::Callback | Awaited::Child(_) | Awaited::ChildInDoubt(_) => {
                "no callback came".to_owned()
            }
        };
        match wait.status {
            WaitStatus::Pending => Ok(StepResult::Waiting {
                deadline: wait.deadline,
                on,
            }),
            WaitStatus::Completed => {
                let output = wait.output.unwrap_or(Json::Null);
                let finish = StepFinish {
                    step_id: c.step_id.clone(),
                    status: StepStatus::Succeeded,
                    output: Some(output.clone()),
                    error: None,
                };
                c.writer.finish_step(finish, self.now()).await?;
                Ok(StepResult::Succeeded { output })
            }
            WaitStatus::Failed => {
                let why = wait.error.unwrap_or_else(|| "no reason given".into());
                let message = format!("the callback reported a failure: {why}");
                self.fail_claimed_step(c, ErrorKind::Permanent, message)
                    .await
            }
            WaitStatus::TimedOut | WaitStatus::Cancelled => {
                let late = wait.last_beat_at.is_some() && wait.deadline < wait.hard_deadline;
                let why = if late {
                    "timed out: a heartbeat was missed".to_owned()
                } else {
                    format!("timed out: {what} before {}", wait.deadline.to_rfc3339())
                };
                match on_timeout {
                    OnTimeout::Fail => self.fail_claimed_step(c, ErrorKind::Permanent, why).await,
                    OnTimeout::Skip => self.skip_claimed_step(c, why).await,
                }
            }
        }
    }
}
