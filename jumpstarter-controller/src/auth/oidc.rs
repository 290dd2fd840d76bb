//! Verification of external issuers' tokens, as the Kubernetes API server's JWT authenticator
//! does it for the fields Jumpstarter's configuration uses.

use std::time::{Duration, Instant, SystemTime};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use serde::Deserialize;
use serde_json::Value;

use jumpstarter_core::{
    auth::{
        TokenError,
        jwt::{self, Alg, Claims, Key, unix_seconds},
    },
    oidc::{HttpsClient, OidcError, is_loopback_host},
};

/// Tolerated clock difference for `nbf` and `iat`.
const CLOCK_SKEW: i64 = 60;
/// The JWKS is fetched again for an unknown `kid` at most this often.
const REFRESH_MIN_INTERVAL: Duration = Duration::from_secs(10);
/// Keys older than this are fetched again on the next use.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);

/// `issuer` of a JWTAuthenticator (`apiserver.config.k8s.io/v1beta1`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IssuerConfig {
    /// The issuer URL; must equal the tokens' `iss`.
    pub url: String,
    /// Where the discovery document is, when not under `url`.
    #[serde(default, rename = "discoveryURL")]
    pub discovery_url: Option<String>,
    /// Accepted audiences: a token's `aud` must contain one of them.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// `MatchAny` (the only policy) or absent.
    #[serde(default)]
    pub audience_match_policy: Option<String>,
    /// CA to trust for the issuer's HTTPS: a PEM bundle, or the path of a PEM file.
    #[serde(default)]
    pub certificate_authority: Option<String>,
}

/// `claimMappings.username`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsernameMapping {
    /// The claim holding the username.
    #[serde(default)]
    pub claim: Option<String>,
    /// Prepended to the claim value (e.g. `dex:`).
    #[serde(default)]
    pub prefix: Option<String>,
    /// A CEL expression (not supported).
    #[serde(default)]
    pub expression: Option<String>,
}

/// `claimMappings`. Jumpstarter authorizes by the username alone (as upstream); `groups`,
/// `uid` and `extra` are Kubernetes' other mappings, accepted so that a configuration shared
/// with an API server loads, and with no meaning here. Any other key is refused.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimMappings {
    /// How to form the username.
    #[serde(default)]
    pub username: UsernameMapping,
    /// Kubernetes' group mapping (no meaning to Jumpstarter).
    #[serde(default)]
    pub groups: Option<Value>,
    /// Kubernetes' uid mapping (no meaning to Jumpstarter).
    #[serde(default)]
    pub uid: Option<Value>,
    /// Kubernetes' extra attributes (no meaning to Jumpstarter).
    #[serde(default)]
    pub extra: Option<Value>,
}

/// One of `claimValidationRules`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimValidationRule {
    /// The claim that must be present...
    #[serde(default)]
    pub claim: Option<String>,
    /// ...with this string value.
    #[serde(default)]
    pub required_value: Option<String>,
    /// A CEL expression (not supported).
    #[serde(default)]
    pub expression: Option<String>,
    /// Message for failures of `expression`.
    #[serde(default)]
    pub message: Option<String>,
}

/// One JWTAuthenticator document (the entries of `authentication.jwt`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtAuthenticatorConfig {
    /// The issuer.
    pub issuer: IssuerConfig,
    /// Extra claim requirements.
    #[serde(default)]
    pub claim_validation_rules: Vec<ClaimValidationRule>,
    /// Username mapping.
    #[serde(default)]
    pub claim_mappings: ClaimMappings,
    /// CEL rules on the user (not supported; must be empty).
    #[serde(default)]
    pub user_validation_rules: Vec<Value>,
}

impl JwtAuthenticatorConfig {
    /// Parses one document (e.g. an entry of `authentication.jwt`).
    pub fn from_value(value: &Value) -> Result<Self, OidcError> {
        serde_json::from_value(value.clone()).map_err(|e| OidcError::Config {
            issuer: value
                .pointer("/issuer/url")
                .and_then(Value::as_str)
                .unwrap_or("<unknown>")
                .to_owned(),
            field: "jwt".into(),
            source: e.into(),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// Uncompressed P-256 point.
    P256(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
struct Jwk {
    kid: Option<String>,
    key: PublicKey,
}

/// The signature keys of a JWKS document; keys of other types or uses are skipped.
fn parse_jwks(doc: &Value, url: &str) -> Result<Vec<Jwk>, OidcError> {
    let bad = |reason: String| OidcError::Json {
        url: url.to_owned(),
        reason,
    };
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"keys\" array".into()))?;
    let b64 = |k: &Value, field: &str| -> Option<Vec<u8>> {
        let s = k.get(field)?.as_str()?;
        URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).ok()
    };
    let mut out = Vec::new();
    for k in keys {
        if k.get("use")
            .and_then(Value::as_str)
            .is_some_and(|u| u != "sig")
        {
            continue;
        }
        let kid = k.get("kid").and_then(Value::as_str).map(str::to_owned);
        let key = match (
            k.get("kty").and_then(Value::as_str),
            k.get("crv").and_then(Value::as_str),
        ) {
            (Some("RSA"), _) => match (b64(k, "n"), b64(k, "e")) {
                (Some(n), Some(e)) => PublicKey::Rsa { n, e },
                _ => continue,
            },
            (Some("EC"), Some("P-256")) => match (b64(k, "x"), b64(k, "y")) {
                (Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => {
                    let mut point = Vec::with_capacity(65);
                    point.push(4);
                    point.extend_from_slice(&x);
                    point.extend_from_slice(&y);
                    PublicKey::P256(point)
                }
                _ => continue,
            },
            _ => continue,
        };
        out.push(Jwk { kid, key });
    }
    Ok(out)
}

#[derive(Default)]
struct KeyCache {
    keys: Vec<Jwk>,
    fetched: Option<Instant>,
}

/// Verifies the tokens of one external issuer: keys from its discovery document's
/// `jwks_uri`, fetched on first use, kept for an hour and fetched again (at most every
/// 10 s) when a token names an unknown `kid`.
pub struct ExternalVerifier {
    config: JwtAuthenticatorConfig,
    username_claim: String,
    http: HttpsClient,
    keys: tokio::sync::Mutex<KeyCache>,
}

impl std::fmt::Debug for ExternalVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalVerifier")
            .field("issuer", &self.config.issuer.url)
            .finish_non_exhaustive()
    }
}

impl ExternalVerifier {
    /// A verifier for one JWTAuthenticator; refuses settings it cannot honour (CEL
    /// expressions, no audiences, a non-HTTPS issuer, an unreadable CA).
    pub fn new(config: JwtAuthenticatorConfig) -> Result<Self, OidcError> {
        let issuer = config.issuer.url.clone();
        let bad = |field: &str, reason: &str| OidcError::Config {
            issuer: issuer.clone(),
            field: field.to_owned(),
            source: reason.into(),
        };
        // Plain http is tolerated for loopback issuers only (local development, tests).
        let loopback_http = issuer
            .parse::<http::Uri>()
            .ok()
            .filter(|u| u.scheme_str() == Some("http"))
            .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
            .is_some_and(|h| is_loopback_host(&h));
        if !issuer.starts_with("https://") && !loopback_http {
            return Err(bad("issuer.url", "must be an https:// URL"));
        }
        if config.issuer.audiences.iter().all(|a| a.is_empty()) {
            return Err(bad("issuer.audiences", "at least one audience is required"));
        }
        if let Some(p) = &config.issuer.audience_match_policy
            && !p.is_empty()
            && p != "MatchAny"
        {
            return Err(bad(
                "issuer.audienceMatchPolicy",
                "only MatchAny is supported",
            ));
        }
        let mapping = &config.claim_mappings.username;
        if mapping.expression.is_some() {
            return Err(bad(
                "claimMappings.username.expression",
                "CEL expressions are not supported; use claim and prefix",
            ));
        }
        let username_claim = mapping
            .claim
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| bad("claimMappings.username.claim", "is required"))?;
        for (i, rule) in config.claim_validation_rules.iter().enumerate() {
            if rule.expression.is_some() || rule.claim.is_none() {
                return Err(bad(
                    &format!("claimValidationRules[{i}]"),
                    "only claim/requiredValue rules are supported (no CEL expressions)",
                ));
            }
        }
        if !config.user_validation_rules.is_empty() {
            return Err(bad(
                "userValidationRules",
                "CEL rules are not supported; leave it empty",
            ));
        }
        let ca = match config.issuer.certificate_authority.as_deref() {
            None | Some("") => None,
            Some(pem) if pem.contains("-----BEGIN") => Some(pem.to_owned()),
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                bad(
                    "issuer.certificateAuthority",
                    &format!(
                        "cannot read {path}: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    ),
                )
            })?),
        };
        let http = HttpsClient::new(ca.as_deref(), false).map_err(|e| {
            bad(
                "issuer.certificateAuthority",
                &jumpstarter_core::error_chain(&e),
            )
        })?;
        Ok(Self {
            config,
            username_claim,
            http,
            keys: tokio::sync::Mutex::new(KeyCache::default()),
        })
    }

    /// The issuer URL (`iss` of its tokens).
    pub fn issuer(&self) -> &str {
        &self.config.issuer.url
    }

    /// The username prefix (`claimMappings.username.prefix`, empty when unset).
    pub fn username_prefix(&self) -> &str {
        self.config
            .claim_mappings
            .username
            .prefix
            .as_deref()
            .unwrap_or("")
    }

    /// The accepted audiences.
    pub fn audiences(&self) -> &[String] {
        &self.config.issuer.audiences
    }

    /// The HTTPS client for this issuer (trusting its `certificateAuthority`), with a
    /// timeout on every request.
    pub fn http(&self) -> &HttpsClient {
        &self.http
    }

    /// The issuer's discovery document (from `discoveryURL`, else
    /// `<url>/.well-known/openid-configuration`), and where it was read; without
    /// `discoveryURL` its `issuer` must be the configured URL.
    pub async fn discovery(&self) -> Result<(Value, String), OidcError> {
        let base = self.config.issuer.url.trim_end_matches('/');
        let discovery_url = self
            .config
            .issuer
            .discovery_url
            .clone()
            .unwrap_or_else(|| format!("{base}/.well-known/openid-configuration"));
        let doc = self.http.get_json(&discovery_url).await?;
        if self.config.issuer.discovery_url.is_none() {
            let found = doc.get("issuer").and_then(Value::as_str).unwrap_or("");
            if found != self.config.issuer.url {
                return Err(OidcError::Json {
                    url: discovery_url,
                    reason: format!(
                        "discovery names issuer {found:?}, not {:?}",
                        self.config.issuer.url
                    ),
                });
            }
        }
        Ok((doc, discovery_url))
    }

    async fn fetch_keys(&self) -> Result<Vec<Jwk>, OidcError> {
        let (doc, discovery_url) = self.discovery().await?;
        let jwks_uri =
            doc.get("jwks_uri")
                .and_then(Value::as_str)
                .ok_or_else(|| OidcError::Json {
                    url: discovery_url.clone(),
                    reason: "no \"jwks_uri\"".into(),
                })?;
        let jwks = self.http.get_json(jwks_uri).await?;
        parse_jwks(&jwks, jwks_uri)
    }

    /// The keys to try for a token with `kid`, fetching the JWKS when needed.
    async fn keys_for(&self, kid: Option<&str>) -> Result<Vec<Jwk>, OidcError> {
        let mut cache = self.keys.lock().await;
        let matching = |keys: &[Jwk]| -> Vec<Jwk> {
            keys.iter()
                .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
                .cloned()
                .collect()
        };
        let stale = cache.fetched.is_none_or(|t| t.elapsed() > KEYS_MAX_AGE);
        let found = matching(&cache.keys);
        let may_refresh = cache
            .fetched
            .is_none_or(|t| t.elapsed() >= REFRESH_MIN_INTERVAL);
        if stale || (found.is_empty() && may_refresh) {
            match self.fetch_keys().await {
                Ok(keys) => {
                    cache.keys = keys;
                    cache.fetched = Some(Instant::now());
                }
                // Old keys stay usable while the issuer is briefly unreachable.
                Err(e) if cache.keys.is_empty() => return Err(e),
                Err(e) => tracing::warn!(
                    "cannot refresh the keys of {}: {e}",
                    self.issuer(),
                    e = jumpstarter_core::error_chain(&e)
                ),
            }
        }
        let found = matching(&cache.keys);
        if found.is_empty() {
            return Err(OidcError::UnknownKey {
                issuer: self.issuer().to_owned(),
                kid: kid.unwrap_or("<none>").to_owned(),
            });
        }
        Ok(found)
    }

    /// Verifies `token` and returns the username (prefix + claim).
    pub async fn verify(&self, token: &str) -> Result<String, OidcError> {
        self.verify_at(token, SystemTime::now()).await
    }

    /// Verifies `token` as if the clock read `now`.
    pub async fn verify_at(&self, token: &str, now: SystemTime) -> Result<String, OidcError> {
        let (header, _) = jwt::peek(token)?;
        let kid = header.get("kid").and_then(Value::as_str);
        let keys = self.keys_for(kid).await?;
        let mut last = TokenError::Signature;
        let mut claims = None;
        for k in &keys {
            let result = match &k.key {
                PublicKey::Rsa { n, e } => {
                    jwt::verify(token, Key::RsaPublic { n, e }, &[Alg::Rs256])
                }
                PublicKey::P256(point) => {
                    jwt::verify(token, Key::EcdsaPublic(point), &[Alg::Es256])
                }
            };
            match result {
                Ok(c) => {
                    claims = Some(c);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let claims = Claims(claims.ok_or(last)?);
        self.check_claims(&claims, unix_seconds(now))
    }

    fn check_claims(&self, claims: &Claims, now: i64) -> Result<String, OidcError> {
        claims.check_issuer(&self.config.issuer.url)?;
        let aud = claims.audience()?;
        let wanted = &self.config.issuer.audiences;
        if !aud.iter().any(|a| wanted.contains(a)) {
            return Err(TokenError::Audience {
                expected: wanted.join(","),
                found: aud,
            }
            .into());
        }
        let exp = claims.time("exp")?.ok_or(TokenError::MissingClaim("exp"))?;
        if now >= exp {
            return Err(TokenError::Expired { exp, now }.into());
        }
        if let Some(nbf) = claims.time("nbf")?
            && now + CLOCK_SKEW < nbf
        {
            return Err(TokenError::NotYetValid { nbf, now }.into());
        }
        if let Some(iat) = claims.time("iat")?
            && now + CLOCK_SKEW < iat
        {
            return Err(TokenError::IssuedInFuture { iat, now }.into());
        }
        for rule in &self.config.claim_validation_rules {
            let (Some(claim), required) = (&rule.claim, rule.required_value.as_deref()) else {
                continue;
            };
            let value = claims.0.get(claim).and_then(Value::as_str);
            if value != Some(required.unwrap_or("")) {
                return Err(OidcError::Claim {
                    claim: claim.clone(),
                    reason: format!("must be {:?}", required.unwrap_or("")),
                });
            }
        }
        let claim = &self.username_claim;
        let value = claims
            .0
            .get(claim)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| OidcError::Claim {
                claim: claim.clone(),
                reason: "missing or not a non-empty string (it is the username claim)".into(),
            })?;
        if claim == "email" && claims.0.get("email_verified") == Some(&Value::Bool(false)) {
            return Err(OidcError::Claim {
                claim: "email_verified".into(),
                reason: "the email is not verified".into(),
            });
        }
        Ok(format!("{}{value}", self.username_prefix()))
    }
}

#[cfg(test)]
mod tests {
    use ring::{
        rand::SystemRandom,
        signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair},
    };

    use super::*;

    /// A 2048-bit RSA test key (PKCS#1 DER, base64); ring cannot generate RSA keys.
    const RSA_PKCS1: &str = include_str!("testdata/rsa2048.pkcs1.b64");

    fn verifier(url: &str) -> ExternalVerifier {
        ExternalVerifier::new(JwtAuthenticatorConfig {
            issuer: IssuerConfig {
                url: url.into(),
                audiences: vec!["jumpstarter-cli".into()],
                ..Default::default()
            },
            claim_mappings: ClaimMappings {
                username: UsernameMapping {
                    claim: Some("sub".into()),
                    prefix: Some("dex:".into()),
                    expression: None,
                },
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap()
    }

    fn sign(alg: &str, kid: &str, claims: &Value, signer: impl Fn(&[u8]) -> Vec<u8>) -> String {
        let h = URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&serde_json::json!({"alg": alg, "kid": kid})).unwrap());
        let c = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap());
        let input = format!("{h}.{c}");
        let sig = signer(input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    async fn with_keys(v: &ExternalVerifier, keys: Vec<Jwk>) {
        let mut cache = v.keys.lock().await;
        cache.keys = keys;
        cache.fetched = Some(Instant::now());
    }

    #[tokio::test]
    async fn rs256_and_es256_tokens_verify_and_map_the_username() {
        let v = verifier("https://issuer.example");
        let rsa = RsaKeyPair::from_der(
            &base64::engine::general_purpose::STANDARD
                .decode(RSA_PKCS1.trim().replace('\n', ""))
                .unwrap(),
        )
        .unwrap();
        let rsa_pub = rsa.public();
        let comps: signature::RsaPublicKeyComponents<Vec<u8>> = rsa_pub.into();
        let ec_doc = EcdsaKeyPair::generate_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &SystemRandom::new(),
        )
        .unwrap();
        let ec = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            ec_doc.as_ref(),
            &SystemRandom::new(),
        )
        .unwrap();
        with_keys(
            &v,
            vec![
                Jwk {
                    kid: Some("r".into()),
                    key: PublicKey::Rsa {
                        n: comps.n.clone(),
                        e: comps.e.clone(),
                    },
                },
                Jwk {
                    kid: Some("e".into()),
                    key: PublicKey::P256(ec.public_key().as_ref().to_vec()),
                },
            ],
        )
        .await;
        let now = 1_800_000_000;
        let claims = serde_json::json!({
            "iss": "https://issuer.example", "aud": "jumpstarter-cli", "sub": "alice",
            "iat": now, "exp": now + 600,
        });
        let rs = |m: &[u8]| {
            let mut sig = vec![0; rsa.public().modulus_len()];
            rsa.sign(
                &signature::RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                m,
                &mut sig,
            )
            .unwrap();
            sig
        };
        let es = |m: &[u8]| ec.sign(&SystemRandom::new(), m).unwrap().as_ref().to_vec();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(now as u64);
        let t = sign("RS256", "r", &claims, rs);
        assert_eq!(v.verify_at(&t, at).await.unwrap(), "dex:alice");
        let t = sign("ES256", "e", &claims, es);
        assert_eq!(v.verify_at(&t, at).await.unwrap(), "dex:alice");
        // An RSA token presented under the EC key's kid, or with the algorithm swapped, fails.
        let t = sign("RS256", "e", &claims, rs);
        assert!(v.verify_at(&t, at).await.is_err());
        let t = sign("HS256", "r", &claims, rs);
        assert!(v.verify_at(&t, at).await.is_err());
        // Tampered claims.
        let t = sign("ES256", "e", &claims, es);
        let mut parts: Vec<&str> = t.split('.').collect();
        let other = URL_SAFE_NO_PAD.encode(
            serde_json::to_vec(&serde_json::json!({
                "iss": "https://issuer.example", "aud": "jumpstarter-cli", "sub": "mallory",
                "exp": now + 600,
            }))
            .unwrap(),
        );
        parts[1] = &other;
        let e = v.verify_at(&parts.join("."), at).await.unwrap_err();
        assert!(matches!(e, OidcError::Token(TokenError::Signature)), "{e}");
        // Expired, wrong audience, wrong issuer, future iat, missing username claim.
        let bad = |patch: Value| {
            let mut c = claims.clone();
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    c.as_object_mut().unwrap().remove(k);
                } else {
                    c[k] = v.clone();
                }
            }
            sign("ES256", "e", &c, es)
        };
        let msg = |t: String| {
            let v = &v;
            async move { v.verify_at(&t, at).await.unwrap_err().to_string() }
        };
        assert!(
            msg(bad(serde_json::json!({"exp": now - 1})))
                .await
                .contains("token is expired")
        );
        assert!(
            msg(bad(serde_json::json!({"aud": ["other"]})))
                .await
                .contains("audience")
        );
        assert!(
            msg(bad(serde_json::json!({"iss": "https://evil"})))
                .await
                .contains("issuer")
        );
        assert!(
            msg(bad(serde_json::json!({"iat": now + 3600})))
                .await
                .contains("before issued")
        );
        assert!(
            msg(bad(serde_json::json!({"nbf": now + 3600})))
                .await
                .contains("not valid yet")
        );
        assert!(
            msg(bad(serde_json::json!({"sub": null})))
                .await
                .contains("\"sub\"")
        );
        // Within the skew, nbf is fine.
        assert!(
            v.verify_at(&bad(serde_json::json!({"nbf": now + 30})), at)
                .await
                .is_ok()
        );
    }

    #[test]
    fn jwks_parsing_skips_unusable_keys() {
        let doc = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "a", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"},
            {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"},
            {"kty": "oct", "k": "AA"},
        ]});
        let keys = parse_jwks(&doc, "u").unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].kid.as_deref(), Some("a"));
        assert!(parse_jwks(&serde_json::json!({}), "u").is_err());
    }

    #[test]
    fn unsupported_settings_are_refused_naming_the_field() {
        let base = |patch: Value| {
            let mut doc = serde_json::json!({
                "issuer": {"url": "https://i.example", "audiences": ["a"]},
                "claimMappings": {"username": {"claim": "email", "prefix": ""}},
            });
            for (k, v) in patch.as_object().unwrap() {
                doc[k] = v.clone();
            }
            ExternalVerifier::new(JwtAuthenticatorConfig::from_value(&doc).unwrap())
                .map(|_| ())
                .map_err(|e| jumpstarter_core::error_chain(&e))
        };
        assert!(base(serde_json::json!({})).is_ok());
        let e =
            base(serde_json::json!({"issuer": {"url": "http://i.example", "audiences": ["a"]}}))
                .unwrap_err();
        assert!(e.contains("issuer.url"), "{e}");
        let e = base(serde_json::json!({"issuer": {"url": "https://i.example", "audiences": []}}))
            .unwrap_err();
        assert!(e.contains("issuer.audiences"), "{e}");
        let e =
            base(serde_json::json!({"claimMappings": {"username": {"expression": "claims.sub"}}}))
                .unwrap_err();
        assert!(e.contains("claimMappings.username"), "{e}");
        let e = base(serde_json::json!({"claimValidationRules": [{"expression": "true"}]}))
            .unwrap_err();
        assert!(e.contains("claimValidationRules[0]"), "{e}");
        let e = base(
            serde_json::json!({"issuer": {"url": "https://i.example", "audiences": ["a"],
            "certificateAuthority": "/nonexistent/ca.pem"}}),
        )
        .unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        assert!(JwtAuthenticatorConfig::from_value(&serde_json::json!({"issuer": 3})).is_err());
    }

    #[test]
    fn an_unknown_field_is_refused_with_the_issuer_and_its_name() {
        let with = |patch: Value| {
            let mut doc = serde_json::json!({
                "issuer": {"url": "https://i.example", "audiences": ["a"]},
                "claimMappings": {"username": {"claim": "email"}},
            });
            for (k, v) in patch.as_object().unwrap() {
                doc[k] = v.clone();
            }
            JwtAuthenticatorConfig::from_value(&doc).map_err(|e| jumpstarter_core::error_chain(&e))
        };
        for (patch, field) in [
            (
                serde_json::json!({"issuer": {"url": "https://i.example", "audiences": ["a"], "bogusField": 1}}),
                "bogusField",
            ),
            (
                serde_json::json!({"claimMappings": {"username": {"claim": "email", "bogus": 1}}}),
                "bogus",
            ),
            (
                serde_json::json!({"claimMappings": {"usernme": {"claim": "email"}}}),
                "usernme",
            ),
            (
                serde_json::json!({"claimValidationRules": [{"clam": "x"}]}),
                "clam",
            ),
            (serde_json::json!({"topLevel": 1}), "topLevel"),
        ] {
            let e = with(patch.clone()).expect_err(&patch.to_string());
            assert!(e.contains("https://i.example") && e.contains(field), "{e}");
        }
        // Kubernetes' other mappings load (Jumpstarter goes by the username alone).
        assert!(
            with(serde_json::json!({"claimMappings": {
                "username": {"claim": "email"},
                "groups": {"claim": "groups", "prefix": ""},
                "uid": {"claim": "sub"},
                "extra": [{"key": "example.com/x", "valueExpression": "claims.x"}],
            }}))
            .is_ok()
        );
    }
}
