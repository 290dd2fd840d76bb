//! Router tokens: HS256 JWTs, minted by the controller on `Dial`, presented by both the client
//! and the exporter to the router, whose `sub` (the stream id) pairs the two streams.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use jumpstarter_core::auth::{
    TokenError,
    jwt::{self, Alg, Claims, Key, unix_seconds},
};

/// `iss` of router tokens.
pub const ROUTER_ISSUER: &str = "https://jumpstarter.dev/stream";
/// `aud` of router tokens.
pub const ROUTER_AUDIENCE: &str = "https://jumpstarter.dev/router";
/// How long a router token is valid after minting (30 minutes, as upstream).
pub const ROUTER_TOKEN_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// A minted router token and the stream id it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterToken {
    /// The compact JWT (sent as `authorization: Bearer <token>` to the router).
    pub token: String,
    /// The `sub` claim: the id that pairs the two streams.
    pub stream_id: String,
}

/// The secret shared by the controller and all routers (upstream's `ROUTER_KEY`).
#[derive(Clone)]
pub struct RouterTokenKey {
    secret: Vec<u8>,
}

impl std::fmt::Debug for RouterTokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouterTokenKey(<secret>)")
    }
}

impl RouterTokenKey {
    /// A key from the shared secret (upstream uses the bytes of the `ROUTER_KEY` string).
    /// An empty secret is refused: anybody could mint tokens for it.
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, TokenError> {
        let secret = secret.into();
        if secret.is_empty() {
            return Err(TokenError::Key {
                path: "<router key>".into(),
                source: "the router key is empty".into(),
            });
        }
        Ok(RouterTokenKey { secret })
    }

    /// A random 32-byte key, hex-encoded so it can be passed around as `ROUTER_KEY`.
    pub fn generate() -> Result<(Self, String), TokenError> {
        let mut bytes = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(
            |_| TokenError::Key {
                path: "<generated>".into(),
                source: "random number generator failed".into(),
            },
        )?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok((Self::new(hex.clone())?, hex))
    }

    /// Mints a token for a new random stream id, valid for [`ROUTER_TOKEN_LIFETIME`].
    pub fn issue(&self) -> Result<RouterToken, TokenError> {
        self.issue_at(&uuid::Uuid::new_v4().to_string(), SystemTime::now())
    }

    /// [`RouterTokenKey::issue`] for a tunnel of `lease` (`namespace/name`), which the token
    /// carries in [`LEASE_CLAIM`], with the lease's context (`spec.context`) in
    /// [`LEASE_CONTEXT_CLAIM`] when it has one, so that the router's log lines name them.
    /// Upstream's router ignores both claims.
    pub fn issue_for_lease(
        &self,
        lease: &str,
        context: &BTreeMap<String, String>,
    ) -> Result<RouterToken, TokenError> {
        self.issue_with(
            &uuid::Uuid::new_v4().to_string(),
            Some((lease, context)),
            SystemTime::now(),
        )
    }

    /// Mints a token for `stream_id` as if the clock read `now`.
    pub fn issue_at(&self, stream_id: &str, now: SystemTime) -> Result<RouterToken, TokenError> {
        self.issue_with(stream_id, None, now)
    }

    fn issue_with(
        &self,
        stream_id: &str,
        lease: Option<(&str, &BTreeMap<String, String>)>,
        now: SystemTime,
    ) -> Result<RouterToken, TokenError> {
        let now = unix_seconds(now);
        let life = i64::try_from(ROUTER_TOKEN_LIFETIME.as_secs()).unwrap_or(i64::MAX);
        let claims = serde_json::json!({
            "iss": ROUTER_ISSUER,
            "sub": stream_id,
            "aud": [ROUTER_AUDIENCE],
            "exp": now.saturating_add(life),
            "nbf": now,
            "iat": now,
            "jti": uuid::Uuid::new_v4().to_string(),
        });
        let mut claims = claims;
        if let (Some((lease, context)), Some(map)) = (lease, claims.as_object_mut()) {
            map.insert(LEASE_CLAIM.into(), lease.into());
            if !context.is_empty() {
                let context: serde_json::Map<String, serde_json::Value> = context
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone().into()))
                    .collect();
                map.insert(LEASE_CONTEXT_CLAIM.into(), context.into());
            }
        }
        let token = jwt::encode(Alg::Hs256, Key::Hmac(&self.secret), None, &claims)?;
        Ok(RouterToken {
            token,
            stream_id: stream_id.to_owned(),
        })
    }

    /// Verifies a router token as upstream's router does (HS256/384/512, issuer, audience,
    /// `iat` not in the future, `exp` present and unexpired, `nbf` reached) and returns the
    /// stream id. Map any error with [`TokenError::to_router_status`].
    pub fn verify(&self, token: &str) -> Result<String, TokenError> {
        self.verify_at(token, SystemTime::now())
    }

    /// [`RouterTokenKey::verify`], with the lease the token names ([`LEASE_CLAIM`]), if any.
    pub fn verify_stream(&self, token: &str) -> Result<VerifiedStream, TokenError> {
        self.verify_claims(token, SystemTime::now())
    }

    /// [`RouterTokenKey::verify`] as if the clock read `now`.
    pub fn verify_at(&self, token: &str, now: SystemTime) -> Result<String, TokenError> {
        self.verify_claims(token, now).map(|v| v.stream_id)
    }

    fn verify_claims(&self, token: &str, now: SystemTime) -> Result<VerifiedStream, TokenError> {
        let claims = Claims(jwt::verify(
            token,
            Key::Hmac(&self.secret),
            &[Alg::Hs256, Alg::Hs384, Alg::Hs512],
        )?);
        let now = unix_seconds(now);
        claims.check_issuer(ROUTER_ISSUER)?;
        claims.check_audience(ROUTER_AUDIENCE)?;
        claims.check_times(now)?;
        if let Some(iat) = claims.time("iat")?
            && iat > now
        {
            return Err(TokenError::IssuedInFuture { iat, now });
        }
        let sub = claims.string("sub")?;
        if sub.is_empty() {
            return Err(TokenError::MissingClaim("sub"));
        }
        let lease = claims.string(LEASE_CLAIM).ok().map(str::to_owned);
        Ok(VerifiedStream {
            stream_id: sub.to_owned(),
            lease,
            context: lease_context(&claims),
        })
    }
}

/// The lease context a token carries ([`LEASE_CONTEXT_CLAIM`]): only string entries, at most
/// [`MAX_CONTEXT_ENTRIES`] (the controller signs what it checked; this only keeps a token of
/// another issuer sharing the key from adding unbounded log fields).
fn lease_context(claims: &Claims) -> BTreeMap<String, String> {
    let Some(serde_json::Value::Object(map)) = claims.0.get(LEASE_CONTEXT_CLAIM) else {
        return BTreeMap::new();
    };
    map.iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .take(MAX_CONTEXT_ENTRIES)
        .collect()
}

/// The claim of our router tokens that carries the lease's context (`spec.context`), an
/// object of strings.
pub const LEASE_CONTEXT_CLAIM: &str = "jumpstarter.dev/lease-context";

/// Context entries taken from a token, at most (the controller allows 8).
pub const MAX_CONTEXT_ENTRIES: usize = 16;

/// The claim of our router tokens that names the lease a tunnel serves (`namespace/name`).
pub const LEASE_CLAIM: &str = "jumpstarter.dev/lease";

/// What a verified router token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedStream {
    /// The `sub` claim: the id that pairs the two streams.
    pub stream_id: String,
    /// The lease the tunnel serves, when the controller named it ([`LEASE_CLAIM`]).
    pub lease: Option<String>,
    /// The lease's context, when the token carries it ([`LEASE_CONTEXT_CLAIM`]).
    pub context: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};

    use super::*;

    fn key() -> RouterTokenKey {
        RouterTokenKey::new("shared-secret").unwrap()
    }

    fn sign(alg: Alg, claims: serde_json::Value) -> String {
        jwt::encode(alg, Key::Hmac(b"shared-secret"), None, &claims).unwrap()
    }

    #[test]
    fn a_token_for_a_lease_names_it_and_a_plain_one_does_not() {
        let k = key();
        let context = BTreeMap::from([("build_id".to_string(), "123".to_string())]);
        let t = k.issue_for_lease("default/lease-1", &context).unwrap();
        let v = k.verify_stream(&t.token).unwrap();
        assert_eq!(v.stream_id, t.stream_id);
        assert_eq!(v.lease.as_deref(), Some("default/lease-1"));
        assert_eq!(v.context, context);
        let bare = k
            .issue_for_lease("default/lease-2", &BTreeMap::new())
            .unwrap();
        assert!(k.verify_stream(&bare.token).unwrap().context.is_empty());
        assert_eq!(k.verify(&t.token).unwrap(), t.stream_id);
        let plain = k.issue().unwrap();
        assert_eq!(k.verify_stream(&plain.token).unwrap().lease, None);
        assert!(
            RouterTokenKey::new("other-secret")
                .unwrap()
                .verify_stream(&t.token)
                .is_err()
        );
    }

    #[test]
    fn round_trip_with_upstream_claims() {
        let now = SystemTime::now();
        let t = key().issue_at("stream-1", now).unwrap();
        let claims: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(t.token.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["iss"], ROUTER_ISSUER);
        assert_eq!(claims["aud"], serde_json::json!([ROUTER_AUDIENCE]));
        assert_eq!(claims["sub"], "stream-1");
        let iat = claims["iat"].as_i64().unwrap();
        assert_eq!(claims["nbf"].as_i64(), Some(iat));
        assert_eq!(claims["exp"].as_i64(), Some(iat + 1800));
        assert!(claims["jti"].as_str().is_some_and(|j| !j.is_empty()));
        assert_eq!(key().verify_at(&t.token, now).unwrap(), "stream-1");
        let fresh = key().issue().unwrap();
        assert_eq!(key().verify(&fresh.token).unwrap(), fresh.stream_id);
    }

    #[test]
    fn hs384_and_hs512_are_accepted_es256_is_not() {
        let now = unix_seconds(SystemTime::now());
        let claims = serde_json::json!({"iss": ROUTER_ISSUER, "aud": ROUTER_AUDIENCE,
            "sub": "s", "exp": now + 60, "iat": now});
        assert_eq!(
            key().verify(&sign(Alg::Hs384, claims.clone())).unwrap(),
            "s"
        );
        assert_eq!(
            key().verify(&sign(Alg::Hs512, claims.clone())).unwrap(),
            "s"
        );
        let pair = es256_pair();
        let es = jwt::encode(Alg::Es256, Key::EcdsaSigner(&pair), None, &claims);
        assert!(matches!(
            key().verify(&es.unwrap()),
            Err(TokenError::Algorithm(_))
        ));
    }

    fn es256_pair() -> ring::signature::EcdsaKeyPair {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let rng = ring::rand::SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref(), &rng).unwrap()
    }

    #[test]
    fn expired_future_and_wrong_claims_are_rejected() {
        let now_t = SystemTime::now();
        let now = unix_seconds(now_t);
        let t = key().issue_at("s", now_t).unwrap().token;
        assert!(matches!(
            key().verify_at(&t, now_t + ROUTER_TOKEN_LIFETIME + Duration::from_secs(1)),
            Err(TokenError::Expired { .. })
        ));
        let base = serde_json::json!({"iss": ROUTER_ISSUER, "aud": ROUTER_AUDIENCE, "sub": "s",
            "exp": now + 60, "iat": now});
        let with = |k: &str, v: serde_json::Value| {
            let mut c = base.clone();
            c[k] = v;
            sign(Alg::Hs256, c)
        };
        assert!(matches!(
            key().verify(&with("iat", (now + 600).into())),
            Err(TokenError::IssuedInFuture { .. })
        ));
        assert!(matches!(
            key().verify(&with("aud", "https://jumpstarter.dev/other".into())),
            Err(TokenError::Audience { .. })
        ));
        assert!(matches!(
            key().verify(&with("iss", "https://localhost:8085".into())),
            Err(TokenError::Issuer { .. })
        ));
        assert!(matches!(
            key().verify(&with("nbf", (now + 600).into())),
            Err(TokenError::NotYetValid { .. })
        ));
        assert!(matches!(
            key().verify(&with("sub", "".into())),
            Err(TokenError::MissingClaim("sub"))
        ));
        let mut no_exp = base.clone();
        no_exp.as_object_mut().unwrap().remove("exp");
        assert!(matches!(
            key().verify(&sign(Alg::Hs256, no_exp)),
            Err(TokenError::MissingClaim("exp"))
        ));
    }

    #[test]
    fn forged_and_garbage_tokens_map_to_invalid_jwt_token() {
        let other = RouterTokenKey::new("another-secret").unwrap();
        let forged = other.issue().unwrap().token;
        let err = key().verify(&forged).unwrap_err();
        assert!(matches!(err, TokenError::Signature));
        let st = err.to_router_status();
        assert_eq!(st.code(), tonic::Code::Unauthenticated);
        assert_eq!(st.message(), "invalid jwt token");
        for g in ["", "x", "a.b.c", "Bearer abc.def.ghi"] {
            assert!(key().verify(g).is_err(), "{g:?}");
        }
        assert!(RouterTokenKey::new("").is_err());
        let (k, hex) = RouterTokenKey::generate().unwrap();
        assert_eq!(hex.len(), 64);
        let t = k.issue().unwrap();
        assert!(RouterTokenKey::new(hex).unwrap().verify(&t.token).is_ok());
    }
}
