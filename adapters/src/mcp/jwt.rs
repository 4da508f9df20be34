//! Client assertions for `private_key_jwt` (RFC 7523 §2.2, as OAuth client
//! authentication): a short-lived JWT signed with the client's private key.
//!
//! The key is a PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), P-256 for `ES256` or RSA
//! for `RS256`; aws-lc-rs (already in the build for TLS) signs. The key never appears in
//! an error message.

use std::time::{SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, RSA_PKCS1_SHA256, RsaKeyPair,
};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::json;

use crate::Error;

/// How long an assertion is valid: long enough for one token request.
const LIFETIME_SECS: u64 = 300;

/// A signed assertion with `iss` = `sub` = `client_id` and `aud` = `audience`.
pub(crate) fn assertion(
    client_id: &str,
    audience: &str,
    key_pem: &str,
    algorithm: &str,
) -> Result<String, Error> {
    let der = pem_body(key_pem)?;
    let rng = SystemRandom::new();
    let mut nonce = [0_u8; 16];
    rng.fill(&mut nonce)
        .map_err(|_| Error::permanent("private_key_jwt: no randomness for the jti"))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let header = json!({"alg": algorithm, "typ": "JWT"});
    let claims = json!({
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now,
        "exp": now + LIFETIME_SECS,
        "jti": nonce.iter().map(|b| format!("{b:02x}")).collect::<String>(),
    });
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = match algorithm {
        "ES256" => {
            let key =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der).map_err(|e| {
                    Error::permanent(format!("private_key_jwt: not a P-256 PKCS#8 key: {e}"))
                })?;
            key.sign(&rng, signing_input.as_bytes())
                .map_err(|_| Error::permanent("private_key_jwt: signing failed"))?
                .as_ref()
                .to_vec()
        }
        "RS256" => {
            let key = RsaKeyPair::from_pkcs8(&der).map_err(|e| {
                Error::permanent(format!("private_key_jwt: not an RSA PKCS#8 key: {e}"))
            })?;
            let mut signature = vec![0_u8; key.public_modulus_len()];
            key.sign(
                &RSA_PKCS1_SHA256,
                &rng,
                signing_input.as_bytes(),
                &mut signature,
            )
            .map_err(|_| Error::permanent("private_key_jwt: signing failed"))?;
            signature
        }
        other => {
            return Err(Error::permanent(format!(
                "private_key_jwt: signing algorithm {other:?} is not supported (ES256, RS256)"
            )));
        }
    };
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

/// The DER inside a PEM block.
fn pem_body(pem: &str) -> Result<Vec<u8>, Error> {
    let body: String = pem
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with("-----") && !line.is_empty())
        .collect();
    STANDARD
        .decode(body)
        .map_err(|_| Error::permanent("private_key_jwt: the private key is not PEM"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED, KeyPair, UnparsedPublicKey};

    /// A PKCS#8 DER key as the PEM a workflow's `private_key` holds.
    fn to_pem(der: &[u8]) -> String {
        format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(der)
        )
    }

    #[test]
    fn es256_assertions_verify_and_carry_the_claims() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap_or_else(|e| panic!("{e}"));
        let pem = to_pem(pkcs8.as_ref());
        let jwt = assertion("client-1", "https://as.example", &pem, "ES256")
            .unwrap_or_else(|e| panic!("{e}"));
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(parts[1])
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(claims["iss"], "client-1");
        assert_eq!(claims["sub"], "client-1");
        assert_eq!(claims["aud"], "https://as.example");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref())
            .unwrap_or_else(|e| panic!("{e}"));
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, key.public_key().as_ref());
        let signature = URL_SAFE_NO_PAD
            .decode(parts[2])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            public
                .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
                .is_ok()
        );
        let bad = assertion("c", "a", "not a key", "ES256").unwrap_err();
        assert!(!bad.message.contains("not a key"), "{}", bad.message);
    }

    #[test]
    fn rs256_assertions_verify_and_refuse_a_p256_key() {
        use aws_lc_rs::encoding::AsDer;
        use aws_lc_rs::rsa::KeySize;
        use aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256;
        let key = RsaKeyPair::generate(KeySize::Rsa2048).unwrap_or_else(|e| panic!("{e}"));
        let pkcs8 = key.as_der().unwrap_or_else(|e| panic!("{e}"));
        let pem = to_pem(pkcs8.as_ref());
        let jwt = assertion("client-2", "https://as.example", &pem, "RS256")
            .unwrap_or_else(|e| panic!("{e}"));
        let parts: Vec<&str> = jwt.split('.').collect();
        let header: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(parts[0])
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(header["alg"], "RS256");
        let public = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, key.public_key().as_ref());
        let signature = URL_SAFE_NO_PAD
            .decode(parts[2])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            public
                .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
                .is_ok()
        );
        // A P-256 key declared RS256 is refused, naming what was expected.
        let rng = SystemRandom::new();
        let ec = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap_or_else(|e| panic!("{e}"));
        let ec_pem = to_pem(ec.as_ref());
        let err = assertion("c", "a", &ec_pem, "RS256").unwrap_err();
        assert!(
            err.message.contains("not an RSA PKCS#8 key"),
            "{}",
            err.message
        );
    }
}
