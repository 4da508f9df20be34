//! Rate limits and daily quotas, counted in the database.

use std::time::Duration;

use flow_ledger::{RateAcquire, RateDecision, Timestamp, Window};

use crate::common::*;

crate::conformance!(
    minute_window_limits_and_reopens,
    daily_quota_is_aligned_to_utc_days,
    rate_add_counts_extra_requests
);

fn req(key: &str, window: Window, limit: u32) -> RateAcquire {
    RateAcquire {
        key: key.into(),
        window,
        limit,
    }
}

async fn minute_window_limits_and_reopens(db: TestDb) {
    // T0 is on a minute boundary; start 10 s into the minute.
    let start = db.advance(Duration::from_secs(10));
    let minute_end = Timestamp(T0.0 + 60_000);
    for n in 1..=3 {
        assert_eq!(
            db.ledger
                .rate_acquire(req("http", Window::Minute, 3), start)
                .await
                .unwrap(),
            RateDecision::Granted { count: n }
        );
    }
    assert_eq!(
        db.ledger
            .rate_acquire(
                req("http", Window::Minute, 3),
                db.advance(Duration::from_secs(49))
            )
            .await
            .unwrap(),
        RateDecision::Limited {
            retry_at: minute_end
        }
    );
    // Another key is independent; a zero limit is always limited.
    assert!(matches!(
        db.ledger
            .rate_acquire(req("mcp", Window::Minute, 3), db.now())
            .await
            .unwrap(),
        RateDecision::Granted { count: 1 }
    ));
    assert!(matches!(
        db.ledger
            .rate_acquire(req("off", Window::Minute, 0), db.now())
            .await
            .unwrap(),
        RateDecision::Limited { .. }
    ));
    // The next minute opens a new window.
    db.clock.set(minute_end);
    assert_eq!(
        db.ledger
            .rate_acquire(req("http", Window::Minute, 3), db.now())
            .await
            .unwrap(),
        RateDecision::Granted { count: 1 }
    );
    assert_eq!(
        db.ledger
            .rate_count("http", Window::Minute, db.now())
            .await
            .unwrap(),
        1
    );
}

async fn daily_quota_is_aligned_to_utc_days(db: TestDb) {
    let day = 86_400_000;
    let midnight = Timestamp((T0.0 / day + 1) * day);
    db.clock.set(Timestamp(midnight.0 - 1000));
    assert!(matches!(
        db.ledger
            .rate_acquire(req("pay", Window::Day, 2), db.now())
            .await
            .unwrap(),
        RateDecision::Granted { .. }
    ));
    assert!(matches!(
        db.ledger
            .rate_acquire(req("pay", Window::Day, 2), db.now())
            .await
            .unwrap(),
        RateDecision::Granted { count: 2 }
    ));
    assert_eq!(
        db.ledger
            .rate_acquire(req("pay", Window::Day, 2), db.now())
            .await
            .unwrap(),
        RateDecision::Limited { retry_at: midnight }
    );
    assert_eq!(midnight.to_rfc3339().get(11..), Some("00:00:00.000Z"));
    db.clock.set(midnight);
    assert_eq!(
        db.ledger
            .rate_acquire(req("pay", Window::Day, 2), db.now())
            .await
            .unwrap(),
        RateDecision::Granted { count: 1 }
    );
}

async fn rate_add_counts_extra_requests(db: TestDb) {
    assert!(matches!(
        db.ledger
            .rate_acquire(req("mcp", Window::Minute, 3), db.now())
            .await
            .unwrap(),
        RateDecision::Granted { count: 1 }
    ));
    // An MCP re-auth sent two more requests: counted even over the limit.
    assert_eq!(
        db.ledger
            .rate_add("mcp", Window::Minute, 3, db.now())
            .await
            .unwrap(),
        4
    );
    assert!(matches!(
        db.ledger
            .rate_acquire(req("mcp", Window::Minute, 3), db.now())
            .await
            .unwrap(),
        RateDecision::Limited { .. }
    ));
    assert_eq!(
        db.ledger
            .rate_add("fresh", Window::Day, 2, db.now())
            .await
            .unwrap(),
        2
    );
}
