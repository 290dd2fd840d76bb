//! The controller's ES256 tokens for Clients and Exporters (upstream's internal OIDC issuer).

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::{
    rand::SystemRandom,
    signature::{self, EcdsaKeyPair, KeyPair},
};

use jumpstarter_core::auth::{
    DEFAULT_ISSUER, Subject, TokenError,
    jwt::{self, Alg, Claims, Key, check_times, unix_seconds},
    pem::{pem_encode, write_secret_file},
};
use jumpstarter_core::{Because, BoxError};

/// `aud` of controller tokens.
pub const DEFAULT_AUDIENCE: &str = "jumpstarter";
/// Default token lifetime: 365 days, as upstream.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// Prefix upstream puts before the subject to form the username of internal tokens.
pub const INTERNAL_USERNAME_PREFIX: &str = "internal:";
/// `kid` of the signing key (upstream's JWKS has one key, "default").
const KEY_ID: &str = "default";

/// A freshly minted token and when it stops being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The compact JWT.
    pub token: String,
    /// Its `exp`.
    pub expires_at: SystemTime,
}

/// Mints and verifies controller tokens with one P-256 key.
///
/// The key is kept as a PKCS#8 PEM file (mode 0600); [`TokenIssuer::load_or_generate`] makes
/// it on first start and reuses it afterwards, so tokens stay valid across restarts.
pub struct TokenIssuer {
    pair: EcdsaKeyPair,
    pkcs8: Vec<u8>,
    issuer: String,
    audience: String,
    lifetime: Duration,
    /// Tokens whose signature, issuer and audience were checked (see [`VerifiedTokens`]).
    verified: VerifiedTokens,
}

/// The most tokens [`VerifiedTokens`] remembers; when full it starts again empty.
const VERIFIED_TOKENS_MAX: usize = 16_384;

/// Tokens already verified, with what their times allow: an exporter or a `jmp` session
/// authenticates every call with the same token, and checking its ES256 signature again
/// each time cost about a tenth of the controller's CPU with 1,000 leases granted at once.
/// Only tokens that passed are kept (keyed by the whole token, so a changed byte is a
/// different token); their `exp` and `nbf` are still checked on every use.
#[derive(Default)]
struct VerifiedTokens(std::sync::Mutex<std::collections::HashMap<String, VerifiedToken>>);

#[derive(Clone)]
struct VerifiedToken {
    subject: Subject,
    exp: i64,
    nbf: Option<i64>,
}

impl VerifiedTokens {
    fn get(&self, token: &str) -> Option<VerifiedToken> {
        use jumpstarter_core::sync::LockExt;
        self.0.lock_or_recover().get(token).cloned()
    }

    fn insert(&self, token: &str, verified: VerifiedToken) {
        use jumpstarter_core::sync::LockExt;
        let mut map = self.0.lock_or_recover();
        if map.len() >= VERIFIED_TOKENS_MAX {
            map.clear();
        }
        map.insert(token.to_owned(), verified);
    }

    fn clear(&self) {
        use jumpstarter_core::sync::LockExt;
        self.0.lock_or_recover().clear();
    }
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("TokenIssuer")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl TokenIssuer {
    /// An issuer with a new random key, the upstream issuer/audience and the default lifetime.
    pub fn generate() -> Result<Self, TokenError> {
        let doc = EcdsaKeyPair::generate_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &SystemRandom::new(),
        )
        .map_err(|_| TokenError::Key {
            path: "<generated>".into(),
            source: "P-256 key generation failed".into(),
        })?;
        Self::from_pkcs8(doc.as_ref().to_vec(), "<generated>")
    }

    fn from_pkcs8(pkcs8: Vec<u8>, origin: &str) -> Result<Self, TokenError> {
        let pair = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &pkcs8,
            &SystemRandom::new(),
        )
        .map_err(|e| TokenError::Key {
            path: origin.to_owned(),
            // ring's `KeyRejected` is not a `std::error::Error` (ring is built without `std`).
            source: format!("not a PKCS#8 ECDSA P-256 key: {e}").into(),
        })?;
        Ok(TokenIssuer {
            pair,
            pkcs8,
            issuer: DEFAULT_ISSUER.to_owned(),
            audience: DEFAULT_AUDIENCE.to_owned(),
            lifetime: DEFAULT_TOKEN_LIFETIME,
            verified: VerifiedTokens::default(),
        })
    }

    /// An issuer from a PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`) P-256 key; `origin` names
    /// the source in errors.
    pub fn from_pem(pem: &str, origin: &str) -> Result<Self, TokenError> {
        let key_err = |source: BoxError| TokenError::Key {
            path: origin.to_owned(),
            source,
        };
        use jumpstarter_core::auth::pem::{self, PemError, PemObject};
        use tokio_rustls::rustls::pki_types::PrivatePkcs8KeyDer;
        match PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()) {
            Ok(key) => Self::from_pkcs8(key.secret_pkcs8_der().to_vec(), origin),
            Err(PemError::NoItemsFound) => Err(key_err(if pem::private_key(pem).is_ok() {
                "expected a PKCS#8 \"PRIVATE KEY\" block (convert with `openssl pkcs8 -topk8 -nocrypt`)"
                    .into()
            } else {
                "no \"PRIVATE KEY\" PEM block".into()
            })),
            Err(e) => Err(key_err(Because::boxed("not valid PEM", e))),
        }
    }

    /// Reads the key from a PEM file.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        let pem = std::fs::read_to_string(path).map_err(|source| TokenError::KeyFile {
            path: path.display().to_string(),
            what: "cannot read",
            source,
        })?;
        Self::from_pem(&pem, &path.display().to_string())
    }

    /// Loads the key at `path`, or generates one and writes it there (mode 0600) when the file
    /// does not exist. A file that exists but is unusable is an error, never overwritten.
    pub fn load_or_generate(path: &Path) -> Result<Self, TokenError> {
        if path.exists() {
            return Self::load(path);
        }
        let issuer = Self::generate()?;
        issuer.save(path)?;
        Ok(issuer)
    }

    /// Writes the key as PKCS#8 PEM with mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), TokenError> {
        write_secret_file(path, self.to_pem().as_bytes()).map_err(|source| TokenError::KeyFile {
            path: path.display().to_string(),
            what: "cannot write",
            source,
        })
    }

    /// The private key as PKCS#8 PEM.
    pub fn to_pem(&self) -> String {
        pem_encode("PRIVATE KEY", &self.pkcs8)
    }

    /// Replaces the token lifetime (upstream `authentication.internal.tokenLifetime`).
    pub fn with_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Replaces `iss` (for tests or a non-default deployment; upstream always uses the default).
    pub fn with_issuer(mut self, issuer: impl Into<String>) -> Self {
        self.issuer = issuer.into();
        self.verified.clear();
        self
    }

    /// Replaces `aud`.
    pub fn with_audience(mut self, audience: impl Into<String>) -> Self {
        self.audience = audience.into();
        self.verified.clear();
        self
    }

    /// The token lifetime.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Mints a token for `subject`, valid from now for the lifetime.
    pub fn issue(&self, subject: &Subject) -> Result<IssuedToken, TokenError> {
        self.issue_at(subject, SystemTime::now())
    }

    /// Mints a token as if the clock read `now`.
    pub fn issue_at(&self, subject: &Subject, now: SystemTime) -> Result<IssuedToken, TokenError> {
        let iat = unix_seconds(now);
        let life = i64::try_from(self.lifetime.as_secs()).unwrap_or(i64::MAX);
        let exp = iat.saturating_add(life);
        let claims = serde_json::json!({
            "iss": self.issuer,
            "sub": subject.to_string(),
            "aud": [self.audience],
            "iat": iat,
            "exp": exp,
        });
        let token = jwt::encode(
            Alg::Es256,
            Key::EcdsaSigner(&self.pair),
            Some(KEY_ID),
            &claims,
        )?;
        Ok(IssuedToken {
            token,
            expires_at: now + self.lifetime,
        })
    }

    /// Verifies a token (signature, ES256 only, issuer, audience, `exp`, `nbf`) and returns its
    /// subject. Errors keep upstream's texts where the Python client matches them
    /// ("token is expired").
    pub fn verify(&self, token: &str) -> Result<Subject, TokenError> {
        self.verify_at(token, SystemTime::now())
    }

    /// [`TokenIssuer::verify`] as if the clock read `now`.
    pub fn verify_at(&self, token: &str, now: SystemTime) -> Result<Subject, TokenError> {
        let now = unix_seconds(now);
        if let Some(known) = self.verified.get(token) {
            check_times(known.exp, known.nbf, now)?;
            return Ok(known.subject);
        }
        let claims = Claims(jwt::verify(
            token,
            Key::EcdsaPublic(self.pair.public_key().as_ref()),
            &[Alg::Es256],
        )?);
        claims.check_issuer(&self.issuer)?;
        claims.check_audience(&self.audience)?;
        let (exp, nbf) = claims.times()?;
        check_times(exp, nbf, now)?;
        let subject = Subject::parse(claims.string("sub")?)?;
        self.verified.insert(
            token,
            VerifiedToken {
                subject: subject.clone(),
                exp,
                nbf,
            },
        );
        Ok(subject)
    }

    /// The public key as a JWK Set (what upstream serves at `/jwks`), for external verifiers.
    pub fn jwks(&self) -> serde_json::Value {
        // An uncompressed P-256 point is 0x04 || X (32 bytes) || Y (32 bytes).
        let coords = self.pair.public_key().as_ref().get(1..).unwrap_or_default();
        let (x, y) = coords.split_at(coords.len() / 2);
        serde_json::json!({"keys": [{
            "kty": "EC",
            "crv": "P-256",
            "alg": "ES256",
            "use": "sig",
            "kid": KEY_ID,
            "x": URL_SAFE_NO_PAD.encode(x),
            "y": URL_SAFE_NO_PAD.encode(y),
        }]})
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use jumpstarter_core::auth::ObjectKind;

    use super::*;

    fn subject() -> Subject {
        Subject::new(ObjectKind::Client, "lab", "alice", "0b6e-uid")
    }

    fn claims_of(token: &str) -> serde_json::Value {
        let payload = token.split('.').nth(1).unwrap();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
    }

    #[test]
    fn issues_upstream_claims_and_verifies() {
        let issuer = TokenIssuer::generate().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let t = issuer.issue_at(&subject(), now).unwrap();
        let c = claims_of(&t.token);
        assert_eq!(c["iss"], "https://localhost:8085");
        assert_eq!(c["aud"], serde_json::json!(["jumpstarter"]));
        assert_eq!(c["sub"], "client:lab:alice:0b6e-uid");
        assert_eq!(c["iat"], 1_800_000_000);
        assert_eq!(c["exp"], 1_800_000_000 + 365 * 86400);
        assert!(c.get("nbf").is_none() && c.get("jti").is_none());
        assert_eq!(t.expires_at, now + DEFAULT_TOKEN_LIFETIME);
        let header: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(t.token.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(header["alg"], "ES256");
        assert_eq!(header["kid"], "default");
        assert_eq!(
            issuer
                .verify_at(&t.token, now + Duration::from_secs(60))
                .unwrap(),
            subject()
        );
    }

    #[test]
    fn expired_token_says_token_is_expired() {
        let issuer = TokenIssuer::generate()
            .unwrap()
            .with_lifetime(Duration::from_secs(10));
        let now = SystemTime::now();
        let t = issuer.issue_at(&subject(), now).unwrap();
        let err = issuer
            .verify_at(&t.token, now + Duration::from_secs(11))
            .unwrap_err();
        assert!(err.to_string().contains("token is expired"), "{err}");
        assert!(
            issuer
                .verify_at(&t.token, now + Duration::from_secs(9))
                .is_ok()
        );
    }

    #[test]
    fn a_remembered_token_still_expires_and_a_changed_signature_is_refused() {
        let issuer = TokenIssuer::generate()
            .unwrap()
            .with_lifetime(Duration::from_secs(10));
        let now = SystemTime::now();
        let t = issuer.issue_at(&subject(), now).unwrap();
        // Verified once, so remembered.
        assert_eq!(issuer.verify_at(&t.token, now).unwrap(), subject());
        assert!(issuer.verified.get(&t.token).is_some());
        assert_eq!(
            issuer
                .verify_at(&t.token, now + Duration::from_secs(9))
                .unwrap(),
            subject()
        );
        let err = issuer
            .verify_at(&t.token, now + Duration::from_secs(11))
            .unwrap_err();
        assert!(err.to_string().contains("token is expired"), "{err}");
        // The same token with the last signature character changed is another token.
        let mut forged = t.token.clone();
        let last = forged.pop().unwrap();
        forged.push(if last == 'A' { 'B' } else { 'A' });
        assert!(issuer.verify_at(&forged, now).is_err());
        assert!(issuer.verified.get(&forged).is_none());
        // Another issuer's key: refused, although this issuer remembers the token.
        let other = TokenIssuer::generate().unwrap();
        assert!(other.verify_at(&t.token, now).is_err());
    }

    #[test]
    fn forged_tokens_are_rejected() {
        let issuer = TokenIssuer::generate().unwrap();
        let other = TokenIssuer::generate().unwrap();
        let t = other.issue(&subject()).unwrap();
        assert!(matches!(
            issuer.verify(&t.token),
            Err(TokenError::Signature)
        ));

        // Tampered claims with the original signature.
        let good = issuer.issue(&subject()).unwrap().token;
        let mut parts: Vec<&str> = good.split('.').collect();
        let forged_claims = URL_SAFE_NO_PAD.encode(
            serde_json::to_vec(&serde_json::json!({
                "iss": DEFAULT_ISSUER, "aud": [DEFAULT_AUDIENCE],
                "sub": "client:lab:mallory:x", "exp": i64::MAX / 2,
            }))
            .unwrap(),
        );
        parts[1] = &forged_claims;
        assert!(matches!(
            issuer.verify(&parts.join(".")),
            Err(TokenError::Signature)
        ));

        // An HS256 token keyed with the public key (algorithm confusion) is refused.
        let public = issuer.pair.public_key().as_ref().to_vec();
        let confused =
            jwt::encode(Alg::Hs256, Key::Hmac(&public), None, &claims_of(&good)).unwrap();
        assert!(matches!(
            issuer.verify(&confused),
            Err(TokenError::Algorithm(a)) if a == "HS256"
        ));
    }

    #[test]
    fn wrong_audience_issuer_and_subject_are_rejected() {
        let issuer = TokenIssuer::generate().unwrap();
        let pem = issuer.to_pem();
        let other_aud = TokenIssuer::from_pem(&pem, "mem")
            .unwrap()
            .with_audience("somebody-else");
        let t = other_aud.issue(&subject()).unwrap();
        assert!(matches!(
            issuer.verify(&t.token),
            Err(TokenError::Audience { .. })
        ));
        let other_iss = TokenIssuer::from_pem(&pem, "mem")
            .unwrap()
            .with_issuer("https://evil");
        let t = other_iss.issue(&subject()).unwrap();
        assert!(matches!(
            issuer.verify(&t.token),
            Err(TokenError::Issuer { .. })
        ));

        let claims = serde_json::json!({
            "iss": DEFAULT_ISSUER, "aud": DEFAULT_AUDIENCE, "sub": "robot:lab:x:y",
            "exp": unix_seconds(SystemTime::now()) + 100,
        });
        let t = jwt::encode(Alg::Es256, Key::EcdsaSigner(&issuer.pair), None, &claims).unwrap();
        assert!(matches!(issuer.verify(&t), Err(TokenError::Subject(_))));

        let claims = serde_json::json!({"iss": DEFAULT_ISSUER, "aud": DEFAULT_AUDIENCE, "sub": "client:a:b:c"});
        let t = jwt::encode(Alg::Es256, Key::EcdsaSigner(&issuer.pair), None, &claims).unwrap();
        assert!(matches!(
            issuer.verify(&t),
            Err(TokenError::MissingClaim("exp"))
        ));
    }

    #[test]
    fn garbage_is_rejected() {
        let issuer = TokenIssuer::generate().unwrap();
        for g in [
            "",
            "Bearer x",
            "a.b.c",
            "....",
            "\u{0}",
            "eyJhbGciOiJFUzI1NiJ9.e30.AAAA",
        ] {
            assert!(issuer.verify(g).is_err(), "{g:?}");
        }
    }

    #[test]
    fn key_persists_with_private_mode_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/controller.pem");
        let first = TokenIssuer::load_or_generate(&path).unwrap();
        let t = first.issue(&subject()).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let second = TokenIssuer::load_or_generate(&path).unwrap();
        assert_eq!(second.verify(&t.token).unwrap(), subject());
        assert_eq!(first.jwks(), second.jwks());
        let jwk = &second.jwks()["keys"][0];
        assert_eq!(
            URL_SAFE_NO_PAD
                .decode(jwk["x"].as_str().unwrap())
                .unwrap()
                .len(),
            32
        );
        assert_eq!(
            URL_SAFE_NO_PAD
                .decode(jwk["y"].as_str().unwrap())
                .unwrap()
                .len(),
            32
        );
    }

    #[test]
    fn bad_key_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.pem");
        std::fs::write(&path, "not a key").unwrap();
        let err = TokenIssuer::load_or_generate(&path).unwrap_err();
        assert!(err.to_string().contains("broken.pem"), "{err}");
        // Not overwritten.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a key");
        let err = TokenIssuer::load(&dir.path().join("missing.pem")).unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");
        // An RSA/Ed25519 key is not a P-256 key.
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let err = TokenIssuer::from_pem(&ed.serialize_pem(), "ed.pem").unwrap_err();
        assert!(err.to_string().contains("ed.pem"), "{err}");
    }
}
