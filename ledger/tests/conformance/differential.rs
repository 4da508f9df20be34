//! The same seeded random operations on SQLite and PostgreSQL give the same answers and
//! end in the same state. Replay a failure with `FLOW_TEST_SEED=<seed>`.

use std::collections::BTreeMap;
use std::time::Duration;

use flow_ledger::{
    CallLease, CallOutcome, ClaimRuns, CompleteCall, ErrorKind, EventFilter, InDoubtReport, Ledger,
    NewStep, PureCall, RateAcquire, Resolution, Resolve, RunFinish, RunLease, RunStatus, StepError,
    StepFinish, StepStatus, Timestamp, Window, canonical_hash,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::common::*;

const OPS: usize = 400;
const NODES: [&str; 3] = ["a", "b", "c"];

#[derive(Default)]
struct Model {
    runs: Vec<String>,
    run_leases: BTreeMap<String, RunLease>,
    /// Leases of claimed calls, of outbound calls, and spent or lost ones (which still
    /// get used now and then: fencing must refuse them identically on both backends).
    claimed: Vec<CallLease>,
    outbound: Vec<CallLease>,
    stale: Vec<CallLease>,
}

impl Model {
    fn all_calls(&self) -> Vec<CallLease> {
        self.claimed
            .iter()
            .chain(&self.outbound)
            .chain(&self.stale)
            .cloned()
            .collect()
    }

    /// Moves `lease` after an operation answered `ok` (or not).
    fn track(&mut self, op: &Op, ok: bool) {
        let take = |v: &mut Vec<CallLease>, l: &CallLease| v.retain(|x| x != l);
        match op {
            Op::Outbound(l) => {
                take(&mut self.claimed, l);
                if ok {
                    self.outbound.push(l.clone())
                } else if !self.stale.contains(l) {
                    self.stale.push(l.clone())
                }
            }
            Op::Complete(l, ..) | Op::InDoubt(l) | Op::Release(l) => {
                take(&mut self.claimed, l);
                take(&mut self.outbound, l);
                if !self.stale.contains(l) {
                    self.stale.push(l.clone());
                }
            }
            _ => {}
        }
    }
}

fn pick<'a, T>(rng: &mut StdRng, v: &'a [T]) -> Option<&'a T> {
    if v.is_empty() {
        None
    } else {
        Some(&v[rng.random_range(0..v.len())])
    }
}

/// Applies one random operation to a ledger and describes the result.
async fn apply(l: &Ledger, op: &Op, now: Timestamp) -> (String, Option<CallLease>) {
    let mut lease_out = None;
    let r = match op {
        Op::Enqueue(id, prio, delay) => {
            let mut run = new_run(id);
            run.priority = *prio;
            run.not_before = Some(now.plus(Duration::from_millis(*delay)));
            format!(
                "{:?}",
                l.enqueue(run, now).await.map(|e| (e.created, e.run))
            )
        }
        Op::ClaimNext(w, limit) => {
            let w = worker(w);
            format!(
                "{:?}",
                l.claim_next(
                    ClaimRuns {
                        worker: &w,
                        lease: LEASE,
                        limit: *limit
                    },
                    now
                )
                .await
            )
        }
        Op::Heartbeat(lease) => format!("{:?}", l.heartbeat(lease, LEASE, now).await),
        Op::CreateStep(lease, step) => {
            format!("{:?}", l.create_step(lease, step.clone(), now).await)
        }
        Op::Claim(lease, node, key, req, retry_failed) => {
            let created = l
                .create_step(lease, step(node, node, 0), now)
                .await
                .map(|s| s.status);
            let mut c = claim(lease, node, node, key, json!({ "v": req }));
            c.retry_failed = *retry_failed;
            let r = l.claim_call(c, now).await;
            if let Ok(flow_ledger::CallClaim::Claimed(lease)) = &r {
                lease_out = Some(lease.clone());
            }
            format!("{created:?} {r:?}")
        }
        Op::Outbound(c) => format!("{:?}", l.mark_outbound(c, now).await),
        Op::Complete(c, ok, n) => {
            format!("{:?}", l.complete_call(complete(c, *ok, *n), now).await)
        }
        Op::InDoubt(c) => {
            let rep = InDoubtReport {
                requests_sent: 1,
                message: "timeout".into(),
            };
            format!("{:?}", l.mark_in_doubt(c, rep, now).await)
        }
        Op::Release(c) => format!("{:?}", l.release_call(c, now).await),
        Op::Resolve(run, node, how) => {
            let resolution = match how {
                0 => Resolution::Succeeded(json!("ok")),
                1 => Resolution::Failed("no".into()),
                _ => Resolution::Retry,
            };
            let req = Resolve {
                run_id: run.clone(),
                tool_call_id: node.clone(),
                resolution,
                by: "op".into(),
                note: None,
            };
            format!("{:?}", l.resolve_call(req, now).await)
        }
        Op::Finish(lease, st) => {
            let fin = RunFinish {
                status: *st,
                output: Some(json!(1)),
                error: None,
            };
            format!("{:?}", l.finish_run(lease, fin, now).await)
        }
        Op::Pause(lease) => format!("{:?}", l.pause_run(lease, "why", now).await),
        Op::Cancel(run) => format!("{:?}", l.request_cancel(run, now).await),
        Op::Requeue(run) => format!("{:?}", l.requeue_run(run, now).await),
        Op::ClaimRun(run, w) => format!("{:?}", l.claim_run(run, &worker(w), LEASE, now).await),
        Op::Rate(key, limit) => {
            let req = RateAcquire {
                key: key.clone(),
                window: Window::Minute,
                limit: *limit,
            };
            format!("{:?}", l.rate_acquire(req, now).await)
        }
        Op::Pure(lease, node, ok) => {
            format!(
                "{:?}",
                l.record_pure_call(pure(lease, node, *ok), now).await
            )
        }
        Op::Expire => format!("{:?}", l.expire_dead_local_workers(now).await),
    };
    (r, lease_out)
}

/// The completion of `c`: succeeded with `{"n": n}` or failed transiently, sending `n`
/// requests (with a step finish unless exactly one).
fn complete(c: &CallLease, ok: bool, n: u32) -> CompleteCall<'_> {
    let outcome = if ok {
        CallOutcome::Succeeded(json!({"n": n}))
    } else {
        CallOutcome::Failed(StepError {
            kind: ErrorKind::Transient,
            message: "503".into(),
        })
    };
    let step = StepFinish {
        step_id: c.step_id.clone(),
        status: if ok {
            StepStatus::Succeeded
        } else {
            StepStatus::Failed
        },
        output: ok.then(|| json!({"n": n})),
        error: None,
    };
    CompleteCall {
        lease: c,
        outcome,
        requests_sent: n,
        step: (n != 1).then_some(step),
        next_step: None,
    }
}

/// A pure call of node `p_<node>` under `lease`, succeeded or failed permanently.
fn pure<'a>(lease: &'a RunLease, node: &str, ok: bool) -> PureCall<'a> {
    let request = json!({"p": node});
    let outcome = if ok {
        CallOutcome::Succeeded(json!("p"))
    } else {
        CallOutcome::Failed(StepError {
            kind: ErrorKind::Permanent,
            message: "bad".into(),
        })
    };
    PureCall {
        run: lease,
        step: step(&format!("p_{node}"), &format!("p_{node}"), 0),
        tool_call_id: format!("p_{node}"),
        tool: "core.echo".into(),
        idempotency_key: format!("{}:p_{node}", lease.run_id),
        request_hash: canonical_hash(&request),
        request,
        outcome,
        retry_failed: false,
        next_step: None,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue(String, i32, u64),
    ClaimNext(String, u32),
    Heartbeat(RunLease),
    CreateStep(RunLease, NewStep),
    Claim(RunLease, String, String, u8, bool),
    Outbound(CallLease),
    Complete(CallLease, bool, u32),
    InDoubt(CallLease),
    Release(CallLease),
    Resolve(String, String, u8),
    Finish(RunLease, RunStatus),
    Pause(RunLease),
    Cancel(String),
    Requeue(String),
    ClaimRun(String, String),
    Rate(String, u32),
    Pure(RunLease, String, bool),
    Expire,
}

/// Usually a lease from `live` (the latest first), sometimes a stale one.
fn lease_from(rng: &mut StdRng, live: &[CallLease], stale: &[CallLease]) -> Option<CallLease> {
    if !live.is_empty() && (stale.is_empty() || rng.random_bool(0.85)) {
        let n = live.len();
        let i = n - 1 - rng.random_range(0..n.min(2));
        return Some(live[i].clone());
    }
    pick(rng, stale).cloned()
}

fn gen_op(rng: &mut StdRng, m: &Model, next_run: &mut usize) -> Option<Op> {
    let leases: Vec<RunLease> = m.run_leases.values().cloned().collect();
    let w = ["w1", "w2", "w3"][rng.random_range(0..3)].to_owned();
    let node = NODES[rng.random_range(0..NODES.len())].to_owned();
    Some(match rng.random_range(0..20) {
        0 | 1 => {
            *next_run += 1;
            Op::Enqueue(
                format!("run_{next_run:03}"),
                rng.random_range(0..3),
                rng.random_range(0..3) * 1000,
            )
        }
        2 => Op::ClaimNext(w, rng.random_range(1..4)),
        3 => Op::Heartbeat(pick(rng, &leases)?.clone()),
        4 => {
            let retry = rng.random_range(0..2);
            let id = if retry == 0 {
                node.clone()
            } else {
                format!("{node}_retry1")
            };
            let status = if retry == 0 {
                StepStatus::Running
            } else {
                StepStatus::Pending
            };
            Op::CreateStep(
                pick(rng, &leases)?.clone(),
                NewStep {
                    step_id: id,
                    node_id: node,
                    retry,
                    not_before: None,
                    status,
                },
            )
        }
        5..=7 => {
            let lease = pick(rng, &leases)?.clone();
            let key = if rng.random_bool(0.3) {
                format!("shared-{node}")
            } else {
                format!("{}:{node}", lease.run_id)
            };
            Op::Claim(
                lease,
                node,
                key,
                rng.random_range(0..2),
                rng.random_bool(0.3),
            )
        }
        8 | 9 => Op::Outbound(lease_from(rng, &m.claimed, &m.stale)?),
        10 | 11 => Op::Complete(
            lease_from(rng, &m.outbound, &m.stale)?,
            rng.random_bool(0.6),
            rng.random_range(0..3),
        ),
        12 => Op::InDoubt(lease_from(rng, &m.outbound, &m.stale)?),
        13 => Op::Release(lease_from(rng, &m.claimed, &m.stale)?),
        14 => match pick(rng, &m.all_calls()) {
            Some(c) if rng.random_bool(0.7) => Op::Resolve(
                c.run_id.clone(),
                c.tool_call_id.clone(),
                rng.random_range(0..3),
            ),
            _ => Op::Resolve(pick(rng, &m.runs)?.clone(), node, rng.random_range(0..3)),
        },
        15 => {
            let st = [
                RunStatus::Succeeded,
                RunStatus::Failed,
                RunStatus::Cancelled,
            ][rng.random_range(0..3)];
            Op::Finish(pick(rng, &leases)?.clone(), st)
        }
        16 => match rng.random_range(0..4) {
            0 => Op::Pause(pick(rng, &leases)?.clone()),
            1 => Op::Cancel(pick(rng, &m.runs)?.clone()),
            2 => Op::Requeue(pick(rng, &m.runs)?.clone()),
            _ => Op::ClaimRun(pick(rng, &m.runs)?.clone(), w),
        },
        17 => Op::Rate(
            format!("k{}", rng.random_range(0..2)),
            rng.random_range(0..4),
        ),
        18 => Op::Pure(pick(rng, &leases)?.clone(), node, rng.random_bool(0.7)),
        _ => Op::Expire,
    })
}

/// Learns new leases from an operation's (identical) result.
async fn learn(m: &mut Model, l: &Ledger, op: &Op) {
    if let Op::Enqueue(id, ..) = op
        && !m.runs.contains(id)
    {
        m.runs.push(id.clone());
    }
    // Re-derive the leases from the database: the run leases as stored, and the call
    // leases from the claims that succeeded.
    for run in &m.runs {
        let r = l.get_run(run).await.expect("run");
        match (r.status, r.worker, r.lease_expires_at) {
            (RunStatus::Running, Some(w), Some(exp)) => {
                m.run_leases.insert(
                    run.clone(),
                    RunLease {
                        run_id: run.clone(),
                        worker: w,
                        token: r.lease_token,
                        expires_at: exp,
                        parent: None,
                    },
                );
            }
            _ => {
                m.run_leases.remove(run);
            }
        }
    }
}

async fn dump(l: &Ledger, runs: &[String]) -> String {
    let mut out = String::new();
    for run in runs {
        out.push_str(&format!("{:?}\n", l.get_run(run).await));
        out.push_str(&format!("{:?}\n", l.list_steps(run).await));
        out.push_str(&format!("{:?}\n", l.list_calls(run).await));
        let mut attempts: Vec<String> = l
            .list_attempts(run)
            .await
            .unwrap()
            .iter()
            .map(|a| format!("{a:?}"))
            .collect();
        attempts.sort();
        out.push_str(&format!("{attempts:?}\n"));
        let mut usage: Vec<String> = l
            .list_usage(run)
            .await
            .unwrap()
            .iter()
            .map(|u| format!("{u:?}"))
            .collect();
        usage.sort();
        out.push_str(&format!("{usage:?}\n"));
        let events = l
            .list_events(EventFilter {
                run_id: Some(run.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        for e in events {
            out.push_str(&format!(
                "{} {} {:?} {:?} {}\n",
                e.event_type.as_str(),
                e.time.0,
                e.step_id,
                e.tool_call_id,
                e.payload
            ));
        }
    }
    out.push_str(&format!("{:?}\n", l.count_runs_by_status().await));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_postgres_agree_on_random_operations() {
    let seed: u64 = std::env::var("FLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("differential seed: {seed} (replay with FLOW_TEST_SEED={seed})");
    let Some(pg) = open(Backend::Postgres, options()).await else {
        return;
    };
    let lite = open(Backend::Sqlite, options()).await.expect("sqlite");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::default();
    let mut next_run = 0usize;
    let mut now = T0;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..OPS {
        if rng.random_range(0..8) == 0 {
            // Mostly small steps; sometimes past every lease (30 s), to force takeovers.
            let ms = if rng.random_bool(0.8) {
                rng.random_range(0..5_000)
            } else {
                rng.random_range(31_000..40_000)
            };
            now = now.plus(Duration::from_millis(ms));
        }
        let Some(op) = gen_op(&mut rng, &model, &mut next_run) else {
            continue;
        };
        let (a, lease) = apply(&lite.ledger, &op, now).await;
        let (b, _) = apply(&pg.ledger, &op, now).await;
        assert_eq!(a, b, "seed {seed}: op {i} {op:?} answered differently");
        let op_name = format!("{op:?}");
        let op_name = op_name.split('(').next().unwrap_or("");
        let outcome = if a.starts_with("Err(") {
            a.split(['(', ' ', '{']).nth(1).unwrap_or("")
        } else {
            "Ok"
        };
        *kinds.entry(format!("{op_name}:{outcome}")).or_default() += 1;
        if let Some(lease) = lease {
            model.claimed.push(lease);
        }
        model.track(&op, a.starts_with("Ok"));
        learn(&mut model, &lite.ledger, &op).await;
    }
    let (a, b) = (
        dump(&lite.ledger, &model.runs).await,
        dump(&pg.ledger, &model.runs).await,
    );
    assert!(
        a == b,
        "seed {seed}: final states differ\n--- sqlite\n{a}\n--- postgres\n{b}"
    );
    eprintln!("differential outcomes: {kinds:?}");
    eprintln!(
        "differential: {} runs, {} call leases, {} bytes of state compared",
        model.runs.len(),
        model.all_calls().len(),
        a.len()
    );
}
