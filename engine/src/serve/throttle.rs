//! Throttling of failed authentications, per client address.
//!
//! A token's value is an operator's secret, not always a long random one, and an API
//! that answers every wrong guess at full speed invites trying, fills logs and hides a
//! misconfigured client hammering the server. So each client address (an IPv6 one by
//! its /64) may fail [`MAX_FAILURES`] times per [`WINDOW`]; after that every
//! authentication from it — right or wrong, so a blocked guesser learns nothing — is
//! answered 429 with `Retry-After` until its window ends. Failures are counted in
//! `flow_api_auth_failures_total`. The table is bounded ([`MAX_ADDRESSES`]): a flood
//! from many addresses forgets the oldest windows instead of growing memory.
//!
//! Behind a reverse proxy every request comes from the proxy's address: the proxy should
//! throttle by the real client itself (flow does not trust `X-Forwarded-For`, which any
//! client can send).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed authentications one address may make per window before it is refused.
pub const MAX_FAILURES: u32 = 10;
/// How long a window of failures lasts (and so the longest a client is refused).
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most addresses remembered at once.
const MAX_ADDRESSES: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Window {
    since: Instant,
    failures: u32,
}

/// The failures of each client address in its current window.
#[derive(Debug, Default)]
pub struct Throttle {
    windows: Mutex<HashMap<IpAddr, Window>>,
}

/// The window a peer counts against: its IPv4 address, or its IPv6 /64 (one host
/// usually holds a whole /64, so counting single IPv6 addresses would let it rotate
/// through them); unspecified for a request without a known peer (a router driven
/// in-process).
fn key(addr: Option<IpAddr>) -> IpAddr {
    match addr {
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(
                u128::from(v6) & 0xffff_ffff_ffff_ffff_0000_0000_0000_0000,
            )),
        },
        Some(v4) => v4,
        None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    }
}

impl Throttle {
    /// `Err(retry_after)` while `addr` has used up its failures in its window.
    pub fn check(&self, addr: Option<IpAddr>) -> Result<(), Duration> {
        self.check_at(addr, Instant::now())
    }

    fn check_at(&self, addr: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        match windows.get(&key(addr)) {
            Some(w) if w.failures >= MAX_FAILURES => {
                let left = WINDOW.saturating_sub(now.saturating_duration_since(w.since));
                if left.is_zero() { Ok(()) } else { Err(left) }
            }
            _ => Ok(()),
        }
    }

    /// Records one failed authentication from `addr`.
    pub fn failed(&self, addr: Option<IpAddr>) {
        self.failed_at(addr, Instant::now());
    }

    fn failed_at(&self, addr: Option<IpAddr>, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let k = key(addr);
        if !windows.contains_key(&k) && windows.len() >= MAX_ADDRESSES {
            windows.retain(|_, w| now.saturating_duration_since(w.since) < WINDOW);
            if windows.len() >= MAX_ADDRESSES
                && let Some(oldest) = windows.iter().min_by_key(|(_, w)| w.since).map(|(a, _)| *a)
            {
                windows.remove(&oldest);
            }
        }
        let w = windows.entry(k).or_insert(Window {
            since: now,
            failures: 0,
        });
        if now.saturating_duration_since(w.since) >= WINDOW {
            *w = Window {
                since: now,
                failures: 0,
            };
        }
        w.failures = w.failures.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_refused_after_its_failures_until_the_window_ends() {
        let t = Throttle::default();
        let a = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        let b = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        let start = Instant::now();
        for _ in 0..MAX_FAILURES {
            assert_eq!(t.check_at(a, start), Ok(()));
            t.failed_at(a, start);
        }
        let left = t.check_at(a, start + Duration::from_secs(1));
        assert_eq!(left, Err(WINDOW - Duration::from_secs(1)));
        assert_eq!(
            t.check_at(b, start),
            Ok(()),
            "other addresses are not affected"
        );
        assert_eq!(t.check_at(a, start + WINDOW), Ok(()), "the window ended");
        t.failed_at(a, start + WINDOW);
        assert_eq!(t.check_at(a, start + WINDOW), Ok(()), "a new window");
    }

    #[test]
    fn an_ipv6_host_counts_as_its_slash_64() {
        let t = Throttle::default();
        let now = Instant::now();
        let one: Ipv6Addr = "2001:db8:1:2::1".parse().unwrap_or(Ipv6Addr::LOCALHOST);
        let same_64: Ipv6Addr = "2001:db8:1:2:ffff::9"
            .parse()
            .unwrap_or(Ipv6Addr::LOCALHOST);
        let other_64: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap_or(Ipv6Addr::LOCALHOST);
        for _ in 0..MAX_FAILURES {
            t.failed_at(Some(IpAddr::V6(one)), now);
        }
        assert!(t.check_at(Some(IpAddr::V6(same_64)), now).is_err());
        assert!(t.check_at(Some(IpAddr::V6(other_64)), now).is_ok());
    }

    #[test]
    fn the_table_is_bounded() {
        let t = Throttle::default();
        let now = Instant::now();
        for i in 0..(MAX_ADDRESSES as u32 + 5) {
            t.failed_at(Some(IpAddr::V4(Ipv4Addr::from(i))), now);
        }
        let len = t.windows.lock().map(|w| w.len()).unwrap_or_default();
        assert_eq!(len, MAX_ADDRESSES);
    }
}
