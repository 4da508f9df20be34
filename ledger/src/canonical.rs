//! Canonical request hashes.
//!
//! A request hash identifies "the same request" across retries, resumes and runs
//! (same key + same hash = the same call). It must not depend on key order
//! or on serde_json's `preserve_order` feature, so objects are written with sorted keys.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `sha256:<hex>` of the canonical JSON of `v` (objects with keys sorted, no spaces).
pub fn canonical_hash(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    format!("sha256:{}", sha256_hex(&out))
}

/// The SHA-256 of `text`, lowercase hex: the one digest form the ledger stores
/// (workflow texts, request hashes, key tombstones).
pub(crate) fn sha256_hex(text: &str) -> String {
    // The digest's own lower-hex form: one formatting pass, not a `format!` per byte
    // (those were most of a pure node's request hash in W2's profile).
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

/// SHA-256 of a workflow's exact text, lowercase hex: a run's identity together with its
/// inputs (idempotent enqueue compares it) and the key of the one stored copy of that
/// text (`workflow_texts`). The ledger computes it from the text itself rather than take
/// it from the caller, so two different texts can never share a stored copy. The same
/// digest flow always stored in `runs.workflow_hash`, so runs from before migration 0007
/// compare equal to a re-submit of the same text.
pub fn workflow_hash(text: &str) -> String {
    sha256_hex(text)
}

/// The canonical JSON text of `v`.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write_canonical(&map[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter() {
        let a = json!({"b": 1, "a": {"y": [1, 2], "x": null}});
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,2]},"b":1}"#).expect("json");
        assert_eq!(canonical_hash(&a), canonical_hash(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"x":null,"y":[1,2]},"b":1}"#);
        assert_ne!(canonical_hash(&a), canonical_hash(&json!({"b": 2})));
        assert!(canonical_hash(&a).starts_with("sha256:"));
        assert_eq!(canonical_hash(&a).len(), 7 + 64);
    }

    #[test]
    fn a_workflow_hash_is_the_plain_sha256_hex_of_the_exact_text() {
        // The digest runs created before migration 0007 carry: it must not change.
        assert_eq!(
            workflow_hash(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            workflow_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(workflow_hash("name: a\n"), workflow_hash("name: a\n "));
    }
}
