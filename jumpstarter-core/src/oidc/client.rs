//! The client side of OIDC for `jmp login` and `jmp auth refresh`: discovery, the token
//! grants (password, authorization code with PKCE, refresh, Dex token exchange, and the
//! device authorization grant of RFC 8628).

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::rand::SecureRandom;
use serde_json::{Map, Value};

use crate::auth::{TokenError, jwt};

use super::{HttpsClient, OidcError, http::snippet};

/// What `jmp login` needs from an issuer's discovery document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// `issuer`.
    pub issuer: String,
    /// `authorization_endpoint` (for the browser flow).
    pub authorization_endpoint: Option<String>,
    /// `token_endpoint`.
    pub token_endpoint: String,
    /// `device_authorization_endpoint` (RFC 8628), when the issuer offers the device flow.
    pub device_authorization_endpoint: Option<String>,
}

/// Fetches `<issuer>/.well-known/openid-configuration`.
pub async fn discover(http: &HttpsClient, issuer: &str) -> Result<Discovery, OidcError> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let doc = http.get_json(&url).await?;
    let field = |name: &str| doc.get(name).and_then(Value::as_str).map(str::to_owned);
    Ok(Discovery {
        issuer: field("issuer").unwrap_or_else(|| issuer.to_owned()),
        authorization_endpoint: field("authorization_endpoint"),
        token_endpoint: field("token_endpoint").ok_or_else(|| OidcError::Json {
            url: url.clone(),
            reason: "no \"token_endpoint\"".into(),
        })?,
        device_authorization_endpoint: field("device_authorization_endpoint"),
    })
}

/// A device authorization endpoint's answer (RFC 8628 section 3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAuthorization {
    /// `device_code`, polled for at the token endpoint.
    pub device_code: String,
    /// `user_code`, to enter at `verification_uri`.
    pub user_code: Option<String>,
    /// `verification_uri`.
    pub verification_uri: Option<String>,
    /// `verification_uri_complete` (the URI with the code in it), when sent.
    pub verification_uri_complete: Option<String>,
    /// `expires_in` seconds (default 600, as upstream).
    pub expires_in: u64,
    /// `interval` seconds between polls (default 5, RFC 8628).
    pub interval: u64,
}

/// Asks `endpoint` (the issuer's `device_authorization_endpoint`) for a device code.
pub async fn device_authorization(
    http: &HttpsClient,
    endpoint: &str,
    client_id: &str,
    scope: &str,
) -> Result<DeviceAuthorization, OidcError> {
    let resp = http
        .post_form(endpoint, &[("client_id", client_id), ("scope", scope)])
        .await?;
    if !resp.status.is_success() {
        return Err(OidcError::Status {
            url: endpoint.to_owned(),
            status: resp.status.as_u16(),
            body: snippet(&resp.body),
        });
    }
    let doc = resp.json(endpoint)?;
    let text = |name: &str| {
        doc.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let secs = |name: &str, default: u64| doc.get(name).and_then(Value::as_u64).unwrap_or(default);
    let device_code = text("device_code").ok_or_else(|| OidcError::Json {
        url: endpoint.to_owned(),
        reason: "no \"device_code\"".into(),
    })?;
    let (verification_uri, verification_uri_complete) =
        (text("verification_uri"), text("verification_uri_complete"));
    if verification_uri.is_none() && verification_uri_complete.is_none() {
        return Err(OidcError::Json {
            url: endpoint.to_owned(),
            reason: "no \"verification_uri\"".into(),
        });
    }
    Ok(DeviceAuthorization {
        device_code,
        user_code: text("user_code"),
        verification_uri,
        verification_uri_complete,
        expires_in: secs("expires_in", 600),
        interval: secs("interval", 5).max(1),
    })
}

/// One poll of the token endpoint for a device code (RFC 8628 section 3.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevicePoll {
    /// The user approved: the tokens.
    Tokens(TokenResponse),
    /// `authorization_pending`: ask again after the interval.
    Pending,
    /// `slow_down`: ask again, with the interval 5 s longer from now on.
    SlowDown,
}

/// Polls the token endpoint for `device_code`. `expired_token`, `access_denied` and any
/// other error are [`OidcError::Grant`] naming it.
pub async fn device_token_poll(
    http: &HttpsClient,
    token_endpoint: &str,
    client_id: &str,
    device_code: &str,
) -> Result<DevicePoll, OidcError> {
    let r = token_request(
        http,
        token_endpoint,
        &[
            ("grant_type", DEVICE_CODE_GRANT),
            ("device_code", device_code),
            ("client_id", client_id),
        ],
    )
    .await;
    match r {
        Ok(tokens) => Ok(DevicePoll::Tokens(tokens)),
        Err(OidcError::Grant { error, .. }) if error == "authorization_pending" => {
            Ok(DevicePoll::Pending)
        }
        Err(OidcError::Grant { error, .. }) if error == "slow_down" => Ok(DevicePoll::SlowDown),
        Err(e) => Err(e),
    }
}

/// The device code grant type (RFC 8628).
pub const DEVICE_CODE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// A token endpoint's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenResponse {
    /// `access_token`.
    pub access_token: String,
    /// `id_token`, when the issuer sent one.
    pub id_token: Option<String>,
    /// `refresh_token`, when the issuer sent one (scope `offline_access`).
    pub refresh_token: Option<String>,
}

async fn token_request(
    http: &HttpsClient,
    endpoint: &str,
    form: &[(&str, &str)],
) -> Result<TokenResponse, OidcError> {
    let resp = http.post_form(endpoint, form).await?;
    let doc: Option<Value> = serde_json::from_slice(&resp.body).ok();
    if !resp.status.is_success() {
        if let Some(error) = doc
            .as_ref()
            .and_then(|d| d.get("error"))
            .and_then(Value::as_str)
        {
            return Err(OidcError::Grant {
                endpoint: endpoint.to_owned(),
                error: error.to_owned(),
                description: doc
                    .as_ref()
                    .and_then(|d| d.get("error_description"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            });
        }
        return Err(OidcError::Status {
            url: endpoint.to_owned(),
            status: resp.status.as_u16(),
            body: snippet(&resp.body),
        });
    }
    let doc = resp.json(endpoint)?;
    let field = |name: &str| {
        doc.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    Ok(TokenResponse {
        access_token: field("access_token").ok_or_else(|| OidcError::Json {
            url: endpoint.to_owned(),
            reason: "no \"access_token\"".into(),
        })?,
        id_token: field("id_token"),
        refresh_token: field("refresh_token"),
    })
}

/// The resource-owner password grant.
pub async fn password_grant(
    http: &HttpsClient,
    token_endpoint: &str,
    client_id: &str,
    username: &str,
    password: &str,
    scope: &str,
) -> Result<TokenResponse, OidcError> {
    token_request(
        http,
        token_endpoint,
        &[
            ("grant_type", "password"),
            ("client_id", client_id),
            ("username", username),
            ("password", password),
            ("scope", scope),
        ],
    )
    .await
}

/// The refresh-token grant.
pub async fn refresh_grant(
    http: &HttpsClient,
    token_endpoint: &str,
    client_id: &str,
    refresh_token: &str,
) -> Result<TokenResponse, OidcError> {
    token_request(
        http,
        token_endpoint,
        &[
            ("grant_type", "refresh_token"),
            ("client_id", client_id),
            ("refresh_token", refresh_token),
        ],
    )
    .await
}

/// The authorization-code grant (with the PKCE verifier).
pub async fn code_grant(
    http: &HttpsClient,
    token_endpoint: &str,
    client_id: &str,
    code: &str,
    redirect_uri: &str,
    code_verifier: &str,
) -> Result<TokenResponse, OidcError> {
    token_request(
        http,
        token_endpoint,
        &[
            ("grant_type", "authorization_code"),
            ("client_id", client_id),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", code_verifier),
        ],
    )
    .await
}

/// RFC 8693 token exchange of an ID token (Dex: `connector_id` names the upstream connector).
pub async fn token_exchange_grant(
    http: &HttpsClient,
    token_endpoint: &str,
    client_id: &str,
    subject_token: &str,
    connector_id: &str,
    scope: &str,
) -> Result<TokenResponse, OidcError> {
    token_request(
        http,
        token_endpoint,
        &[
            (
                "grant_type",
                "urn:ietf:params:oauth:grant-type:token-exchange",
            ),
            ("client_id", client_id),
            ("subject_token", subject_token),
            (
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:id_token",
            ),
            (
                "requested_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            ),
            ("connector_id", connector_id),
            ("scope", scope),
        ],
    )
    .await
}

fn random_b64(len: usize) -> Result<String, OidcError> {
    let mut bytes = vec![0u8; len];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| OidcError::Tls("the system random source failed".into()))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// A PKCE pair (RFC 7636, S256): `(code_verifier, code_challenge)`.
pub fn pkce_pair() -> Result<(String, String), OidcError> {
    let verifier = random_b64(32)?;
    let challenge = URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        verifier.as_bytes(),
    ));
    Ok((verifier, challenge))
}

/// A random `state` value for the authorization request.
pub fn random_state() -> Result<String, OidcError> {
    random_b64(16)
}

/// The claims of `token` WITHOUT verification (for display, or to pick a verifier).
pub fn unverified_claims(token: &str) -> Result<Map<String, Value>, TokenError> {
    jwt::peek(token).map(|(_, claims)| claims)
}

/// The `iss` of `token` WITHOUT verification; `None` when it is not a JWT with an issuer.
pub fn token_issuer(token: &str) -> Option<String> {
    unverified_claims(token)
        .ok()?
        .get("iss")?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_challenge_is_the_sha256_of_the_verifier() {
        let (v, c) = pkce_pair().unwrap();
        assert_eq!(v.len(), 43);
        let expected =
            URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, v.as_bytes()));
        assert_eq!(c, expected);
        assert_ne!(pkce_pair().unwrap().0, v);
        assert_ne!(random_state().unwrap(), random_state().unwrap());
    }

    #[test]
    fn issuer_of_a_token_is_read_without_verification() {
        let t = format!(
            "{}.{}.x",
            URL_SAFE_NO_PAD.encode("{}"),
            URL_SAFE_NO_PAD.encode(r#"{"iss":"https://a"}"#)
        );
        assert_eq!(token_issuer(&t).as_deref(), Some("https://a"));
        assert_eq!(token_issuer("garbage"), None);
    }
}
