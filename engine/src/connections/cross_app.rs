//! Cross-app access (SEP-990, "enterprise-managed authorization"): where a company's
//! identity provider vouches for its people, `flow connect NAME` signs in without a
//! browser. The person's ID token (a secret named by `cross_app.id_token_secret`) is
//! exchanged at the identity provider (RFC 8693) for an ID-JAG — an identity assertion
//! authorization grant for the MCP server's authorization server and resource — which
//! that server takes as a JWT bearer grant (RFC 7523 §2.1) from the configured client.
//! The tokens are sealed and stored like any connection's; when they expire without a
//! refresh token, a fresh ID token and `flow connect` sign in again.

use flow_adapters::mcp::{OAuthClient, TokenFailure};
use flow_ledger::{Endpoints, Ledger};

use super::grant::{self, Connected, SignInWith, client_for, scope_for, store};
use super::seal::{Key, Tokens};
use crate::secrets::Secrets;

fn failure(name: &str, at: &str) -> impl Fn(TokenFailure) -> grant::Error {
    move |f| match f {
        TokenFailure::Refused(m) => {
            grant::Error::Refused(format!("connection `{name}`: {at} refused: {m}"))
        }
        TokenFailure::Other(e) => {
            grant::Error::Server(format!("connection `{name}`: {}", e.message))
        }
    }
}

fn secret<'a>(secrets: &'a Secrets, name: &str, what: &str) -> Result<&'a str, grant::Error> {
    secrets.get(name).ok_or_else(|| {
        grant::Error::Setup(format!(
            "{what}: secret `{name}` has no value (set FLOW_SECRET_{name} or a --secrets-file line)"
        ))
    })
}

/// Signs in to `config` (which has `cross_app`) as `by` and stores the tokens.
pub async fn connect(
    ledger: &Ledger,
    with: SignInWith<'_>,
    by: &str,
) -> Result<Connected, grant::Error> {
    let SignInWith {
        config,
        secrets,
        oauth,
    } = with;
    let name = config.name.as_str();
    let Some(x) = &config.cross_app else {
        return Err(grant::Error::Setup(format!(
            "connection `{name}` has no [connections.cross_app]"
        )));
    };
    let key = Key::from_secrets(secrets).map_err(|e| grant::Error::Setup(e.to_string()))?;
    let id_token = secret(
        secrets,
        &x.id_token_secret,
        &format!("connection `{name}`: the ID token your identity provider issued you"),
    )?;
    let idp_secret = match &x.idp_client_secret_name {
        Some(n) => Some(
            secret(
                secrets,
                n,
                &format!("connection `{name}`: the identity provider's client secret"),
            )?
            .to_owned(),
        ),
        None => None,
    };
    let sign_in = oauth
        .discover(&config.server)
        .await
        .map_err(|e| grant::Error::Server(format!("connection `{name}`: {}", e.message)))?;
    let wanted = ledger
        .connection(name)
        .await
        .map_err(|e| grant::Error::Ledger(format!("cannot read the ledger: {e}")))?
        .and_then(|c| c.scopes_wanted);
    let scope = scope_for(config, wanted.as_deref(), &sign_in);
    // `client_id` is required with `cross_app` (checked on load): no registration.
    let client = client_for(with, &sign_in, "", scope.as_deref()).await?;
    let idp_client = OAuthClient {
        client_id: x.idp_client_id.clone(),
        method: if idp_secret.is_some() {
            "client_secret_basic"
        } else {
            "none"
        }
        .to_owned(),
        secret: idp_secret,
    };
    let jag = oauth
        .exchange_id_token(
            &x.idp_token_endpoint,
            &idp_client,
            id_token,
            &sign_in.issuer,
            &sign_in.resource,
            scope.as_deref(),
        )
        .await
        .map_err(failure(name, "the identity provider"))?;
    let granted = oauth
        .jwt_bearer(&sign_in.token_endpoint, &client, &jag, scope.as_deref())
        .await
        .map_err(failure(name, "the authorization server"))?;
    let tokens = Tokens {
        access_token: granted.access_token,
        refresh_token: granted.refresh_token,
        client_secret: client.secret.clone(),
    };
    let endpoints = Endpoints {
        server: config.server.clone(),
        resource: sign_in.resource,
        issuer: Some(sign_in.issuer),
        token_endpoint: sign_in.token_endpoint,
        revocation_endpoint: sign_in.revocation_endpoint,
        client_id: client.client_id,
        auth_method: client.method,
    };
    let scopes = granted.scope.or(scope);
    store(
        ledger,
        name,
        endpoints,
        &key,
        super::grant::Granted {
            tokens,
            scopes,
            expires_in: granted.expires_in,
        },
        by,
    )
    .await
}
