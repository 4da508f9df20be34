//! A hold leaves `pending` one way: `holds::settle` (`ledger/src/holds/settle.rs`) runs
//! the kind's compare-and-set and, when it won, the node's event and the run's wake-up.
//! A statement elsewhere that writes a hold table's `status` would be a second settle
//! path, one that skips the event or the wake-up. The two that re-open a decided hold
//! (an approval asked again: a new request, a redrive) are the exceptions, named here.

use regex::Regex;

use super::{read, report, rust_sources};

/// The only files besides `holds/settle.rs` that may write a hold's status, and why.
const REOPENS: &[&str] = &[
    // An approval asked again (its request changed, or its run was redriven): back to
    // `pending`, a new request, a new deadline.
    "ledger/src/approvals/mod.rs",
    // A redrive marks the decided approvals of the nodes it runs again `cancelled`, so
    // they are asked anew.
    "ledger/src/redrive.rs",
];

/// The lines of `text` that set the status of a hold table, as `path:line`.
fn offenders(path: &str, text: &str) -> Vec<String> {
    let write =
        Regex::new(r"(?i)UPDATE\s+(approvals|waits)\s+SET\s+(\w+\s*=\s*[^,]+,\s*)*status\s*=")
            .expect("regex");
    text.lines()
        .enumerate()
        .filter(|(_, l)| write.is_match(l))
        .map(|(i, _)| format!("{path}:{}", i + 1))
        .collect()
}

#[test]
fn a_hold_settles_only_through_the_one_settle() {
    // The rule can fail: a status write is found whichever column comes first; a write
    // of another column is not.
    let planted = "\"UPDATE waits SET status = $5 WHERE\"\n\
                   \"UPDATE approvals SET reason = $1, status = $2\"\n\
                   \"UPDATE waits SET deadline = $5, last_beat_at = $6\"\n";
    assert_eq!(offenders("p.rs", planted), ["p.rs:1", "p.rs:2"]);
    let sources = rust_sources();
    let allowed = |p: &str| p.ends_with("holds/settle.rs") || REOPENS.contains(&p);
    let found: Vec<String> = sources
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        // This file plants offenders of its own, above.
        .filter(|p| !p.ends_with("tidy/holds.rs") && !allowed(p))
        .flat_map(|p| offenders(&p, &read(std::path::Path::new(&p))))
        .collect();
    report("hold statuses written outside holds::settle", &found);
    // Each exception still writes a status (else it is no longer needed).
    for file in REOPENS {
        let text = read(std::path::Path::new(file));
        assert!(
            !offenders(file, &text).is_empty(),
            "{file} no longer writes a hold's status: take it off REOPENS"
        );
    }
}
