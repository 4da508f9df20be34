//! Sealing a connection's tokens: AES-256-GCM (aws-lc-rs) under the installation's
//! connections key, a fresh random nonce per write, the connection's tenant, workspace,
//! name and key id as associated data — a sealed row copied to another connection or
//! another tenant does not open.
//!
//! The key is the secret `CONNECTIONS_KEY` (`FLOW_SECRET_CONNECTIONS_KEY` or a
//! `--secrets-file` line): 32 random bytes as base64 or hex (`flow connections keygen`
//! prints one). Its id is a hash of it, stored with each row, so a row sealed under
//! another key says so instead of failing as "tampered".

use aws_lc_rs::aead::{AES_256_GCM, Aad, NONCE_LEN, Nonce, RandomizedNonceKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::secrets::Secrets;

/// A sealed record as stored: its text (base64 of nonce ‖ AES-256-GCM output) and the
/// id of the key it was sealed under; the two only open together.
#[derive(Debug, Clone, Copy)]
pub struct Sealed<'a> {
    /// The sealed text.
    pub text: &'a str,
    /// The id of its key.
    pub key_id: &'a str,
}

impl<'a> Sealed<'a> {
    /// `text` sealed under key `key_id`.
    pub fn new(text: &'a str, key_id: &'a str) -> Self {
        Self { text, key_id }
    }
}

impl<'a> From<&'a flow_ledger::Sealed> for Sealed<'a> {
    fn from(s: &'a flow_ledger::Sealed) -> Self {
        Self::new(&s.sealed, &s.key_id)
    }
}

/// The secret that holds the key.
pub const KEY_SECRET: &str = "CONNECTIONS_KEY";

/// The secret that holds the key before a rotation: rows sealed under it still open,
/// and `flow connections rekey` reseals them under [`KEY_SECRET`]'s.
pub const OLD_KEY_SECRET: &str = "CONNECTIONS_KEY_OLD";

/// Why tokens cannot be sealed or opened. None of them carries key or token bytes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No key is configured.
    #[error(
        "no connections key: set FLOW_SECRET_{KEY_SECRET} (or a `{KEY_SECRET}=` line in --secrets-file) to 32 random bytes in base64; `flow connections keygen` prints one"
    )]
    NoKey,
    /// The key is not 32 bytes of base64 or hex.
    #[error("the connections key ({KEY_SECRET}) is not 32 bytes in base64 or hex: {0}")]
    BadKey(String),
    /// The row was sealed under another key.
    #[error(
        "connection `{name}` is sealed under key {stored}, but the configured {KEY_SECRET} is key {configured}: configure the key it was sealed with (or run `flow connect {name}` again)"
    )]
    OtherKey {
        /// The connection.
        name: String,
        /// The key id in the row.
        stored: String,
        /// The configured key's id.
        configured: String,
    },
    /// Decryption failed under the right key: the row was altered.
    #[error(
        "connection `{0}`: its sealed tokens do not open under the configured key (the stored row was altered); run `flow connect {0}` again"
    )]
    Tampered(String),
}

/// What a connection's sealed text holds.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct Tokens {
    /// The access token.
    pub access_token: String,
    /// The refresh token, if one was issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// A registered (RFC 7591) or configured client's secret, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens(…)")
    }
}

/// The connections key, ready to seal and open.
pub struct Key {
    key: RandomizedNonceKey,
    id: String,
}

impl Key {
    /// The key configured in `secrets`.
    pub fn from_secrets(secrets: &Secrets) -> Result<Key, Error> {
        let text = secrets.get(KEY_SECRET).ok_or(Error::NoKey)?;
        Key::parse(text)
    }

    /// A key from its text (base64 or hex of 32 bytes).
    pub fn parse(text: &str) -> Result<Key, Error> {
        let text = text.trim();
        let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            (0..32)
                .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|e| Error::BadKey(e.to_string()))?
        } else {
            STANDARD
                .decode(text)
                .map_err(|_| Error::BadKey("not base64".into()))?
        };
        if bytes.len() != 32 {
            return Err(Error::BadKey(format!("{} bytes", bytes.len())));
        }
        let key = RandomizedNonceKey::new(&AES_256_GCM, &bytes)
            .map_err(|_| Error::BadKey("refused by AES-256-GCM".into()))?;
        let digest = sha2::Sha256::digest([b"flow-connections-key\0".as_slice(), &bytes].concat());
        let id = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Key { key, id })
    }

    /// The key's id (stored with each row).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `tokens` sealed for connection `name` of `scope` (base64 of nonce ‖ ciphertext).
    pub fn seal(&self, scope: (&str, &str), name: &str, tokens: &Tokens) -> String {
        self.seal_value(scope, name, tokens)
    }

    /// The tokens of connection `name` of `scope` sealed under `key_id` as `sealed`.
    pub fn open(
        &self,
        scope: (&str, &str),
        name: &str,
        sealed: Sealed<'_>,
    ) -> Result<Tokens, Error> {
        self.open_value(scope, name, sealed)
    }

    /// Any record sealed for `label` of `scope`: a connection's tokens (label = its
    /// name) or a sign-in waiting for its browser (`pending:<name>`; a name cannot hold
    /// `:`, so the two never open as each other).
    pub fn seal_value<T: Serialize>(&self, scope: (&str, &str), label: &str, value: &T) -> String {
        let mut data = serde_json::to_vec(value).unwrap_or_default();
        let aad = self.aad(scope, label);
        // Sealing fails only for inputs past GCM's length limit (64 GiB).
        match self.key.seal_in_place_append_tag(Aad::from(aad), &mut data) {
            Ok(nonce) => {
                let mut out = nonce.as_ref().to_vec();
                out.extend_from_slice(&data);
                STANDARD.encode(out)
            }
            Err(_) => String::new(),
        }
    }

    /// What [`Key::seal_value`] sealed for `label` under `key_id`.
    pub fn open_value<T: serde::de::DeserializeOwned>(
        &self,
        scope: (&str, &str),
        label: &str,
        sealed: Sealed<'_>,
    ) -> Result<T, Error> {
        let Sealed {
            text: sealed,
            key_id,
        } = sealed;
        if key_id != self.id {
            return Err(Error::OtherKey {
                name: label.to_owned(),
                stored: key_id.to_owned(),
                configured: self.id.clone(),
            });
        }
        let tampered = || Error::Tampered(label.to_owned());
        let mut bytes = STANDARD.decode(sealed).map_err(|_| tampered())?;
        if bytes.len() < NONCE_LEN {
            return Err(tampered());
        }
        let mut data = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| tampered())?;
        let aad = self.aad(scope, label);
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad), &mut data)
            .map_err(|_| tampered())?;
        serde_json::from_slice(plain).map_err(|_| tampered())
    }

    fn aad(&self, scope: (&str, &str), name: &str) -> Vec<u8> {
        let (tenant, workspace) = scope;
        ["flow-conn-v1", tenant, workspace, name, self.id.as_str()]
            .join("\0")
            .into_bytes()
    }
}

/// The configured key, and during a rotation the one before it: rows open under
/// either (picked by the id stored with them), new ones are sealed under the current.
pub struct Keys {
    /// What new rows are sealed under.
    pub current: Key,
    /// The key being rotated out, if configured.
    pub old: Option<Key>,
}

impl Keys {
    /// The keys configured in `secrets` (the current one is required).
    pub fn from_secrets(secrets: &Secrets) -> Result<Keys, Error> {
        let current = Key::from_secrets(secrets)?;
        let old = secrets
            .get(OLD_KEY_SECRET)
            .map(Key::parse)
            .transpose()
            .map_err(|e| match e {
                Error::BadKey(why) => Error::BadKey(format!("{OLD_KEY_SECRET}: {why}")),
                other => other,
            })?;
        Ok(Keys { current, old })
    }

    /// The key a row sealed under `key_id` opens with, if configured.
    pub fn by_id(&self, key_id: &str) -> Option<&Key> {
        std::iter::once(&self.current)
            .chain(&self.old)
            .find(|k| k.id() == key_id)
    }

    /// Opens a row under whichever configured key it names.
    pub fn open(
        &self,
        scope: (&str, &str),
        name: &str,
        sealed: Sealed<'_>,
    ) -> Result<Tokens, Error> {
        self.by_id(sealed.key_id)
            .unwrap_or(&self.current)
            .open(scope, name, sealed)
    }
}

/// A new random key, base64 (what `flow connections keygen` prints).
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens {
            access_token: "at-123".into(),
            refresh_token: Some("rt-456".into()),
            client_secret: None,
        }
    }

    #[test]
    fn seals_and_opens_only_for_its_own_connection() {
        let key = Key::parse(&generate()).expect("key");
        let sealed = key.seal(("t", "w"), "tracker", &tokens());
        assert!(!sealed.contains("at-123"));
        let again = key.seal(("t", "w"), "tracker", &tokens());
        assert_ne!(sealed, again, "a fresh nonce per write");
        let opened = key
            .open(("t", "w"), "tracker", Sealed::new(&sealed, key.id()))
            .expect("opens");
        assert!(opened == tokens());
        for (scope, name) in [(("t", "w"), "other"), (("t2", "w"), "tracker")] {
            let e = key.open(scope, name, Sealed::new(&sealed, key.id())).err();
            assert!(matches!(e, Some(Error::Tampered(_))), "{e:?}");
        }
        let mut flipped = STANDARD.decode(&sealed).expect("b64");
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let e = key
            .open(
                ("t", "w"),
                "tracker",
                Sealed::new(&STANDARD.encode(flipped), key.id()),
            )
            .err();
        assert!(matches!(e, Some(Error::Tampered(_))));
        let other = Key::parse(&generate()).expect("key");
        let e = other
            .open(("t", "w"), "tracker", Sealed::new(&sealed, key.id()))
            .err();
        assert!(matches!(e, Some(Error::OtherKey { .. })), "{e:?}");
    }

    #[test]
    fn keys_are_32_bytes_of_base64_or_hex() {
        assert!(Key::parse(&"ab".repeat(32)).is_ok());
        assert!(matches!(Key::parse("short"), Err(Error::BadKey(_))));
        assert!(matches!(
            Key::parse(&STANDARD.encode([1u8; 16])),
            Err(Error::BadKey(_))
        ));
    }
}
