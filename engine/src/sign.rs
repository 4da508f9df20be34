//! HMAC-SHA256, the one keyed digest flow computes: an event delivery's
//! `Flow-Signature` (keyed by the consumer's secret) and an approval's digest over the
//! secret values its request reads (keyed by `APPROVAL_DIGEST_KEY`). Below the events
//! and the gateway both, so neither reaches into the other for it.
//!
//! `Flow-Signature` is the HMAC of the exact body bytes.
//! The header reads `sha256=<64 lower-case hex digits>` (GitHub's webhook format, so
//! existing verifiers work). A receiver recomputes the HMAC over the raw body it read —
//! before parsing it — and compares in constant time. The body carries the event id and
//! time; receivers dedupe on `Flow-Event-Id` anyway (delivery is at least once).

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "Flow-Signature";
/// The header carrying the event id (what consumers dedupe on).
pub const EVENT_ID_HEADER: &str = "Flow-Event-Id";
/// The header carrying the event type (for routing without parsing the body).
pub const EVENT_TYPE_HEADER: &str = "Flow-Event-Type";

/// A signing key. `Debug` never shows it: it is a secret value.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl Key {
    /// A key from the secret's value.
    pub fn new(secret: &str) -> Self {
        Key(secret.as_bytes().to_vec())
    }

    /// `sha256=<hex>` of `body`.
    pub fn sign(&self, body: &[u8]) -> String {
        format!("sha256={:x}", self.mac(body).finalize().into_bytes())
    }

    /// Whether `header` is this key's signature of `body` (constant-time compare).
    pub fn verify(&self, body: &[u8], header: &str) -> bool {
        let Some(hex) = header.strip_prefix("sha256=") else {
            return false;
        };
        let Some(bytes) = decode_hex(hex) else {
            return false;
        };
        self.mac(body).verify_slice(&bytes).is_ok()
    }

    /// `text` with this key's value replaced by the placeholder of secret `name`, for
    /// error messages of a downstream that echoes what it got.
    pub fn scrub(&self, text: &str, name: &str) -> String {
        match std::str::from_utf8(&self.0) {
            Ok(value) if !value.is_empty() => {
                text.replace(value, &crate::secrets::placeholder_text(name))
            }
            _ => text.to_string(),
        }
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
        mac.update(body);
        mac
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_4231_test_case_2() {
        // HMAC-SHA256 with key "Jefe" over "what do ya want for nothing?".
        let key = Key::new("Jefe");
        let sig = key.sign(b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(key.verify(b"what do ya want for nothing?", &sig));
        assert!(!key.verify(b"what do ya want for nothing!", &sig));
        assert!(!Key::new("jefe").verify(b"what do ya want for nothing?", &sig));
        assert!(!key.verify(b"x", "sha1=00"));
        assert!(!key.verify(b"x", "sha256=zz"));
        assert_eq!(format!("{key:?}"), "Key(<redacted>)");
    }
}
