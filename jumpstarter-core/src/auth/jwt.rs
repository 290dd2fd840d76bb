//! Compact JWS (RFC 7515) encoding and verification over `ring`, for the few algorithms
//! Jumpstarter uses. Claims are checked by the callers; this module only proves that the
//! bytes were signed by the expected key with an algorithm the caller allowed.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::{hmac, rand::SystemRandom, signature};
use serde_json::{Map, Value};

use super::TokenError;

/// Tokens longer than this are rejected before any decoding (a bound on work per request).
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The signature algorithms accepted anywhere in Jumpstarter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// ECDSA P-256 with SHA-256.
    Es256,
    /// RSA PKCS#1 v1.5 with SHA-256 (verification only).
    Rs256,
    /// HMAC with SHA-256.
    Hs256,
    /// HMAC with SHA-384.
    Hs384,
    /// HMAC with SHA-512.
    Hs512,
}

impl Alg {
    /// The `alg` header value (`ES256`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Alg::Es256 => "ES256",
            Alg::Rs256 => "RS256",
            Alg::Hs256 => "HS256",
            Alg::Hs384 => "HS384",
            Alg::Hs512 => "HS512",
        }
    }

    /// The algorithm of an `alg` header value; `None` for any other.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "ES256" => Some(Alg::Es256),
            "RS256" => Some(Alg::Rs256),
            "HS256" => Some(Alg::Hs256),
            "HS384" => Some(Alg::Hs384),
            "HS512" => Some(Alg::Hs512),
            _ => None,
        }
    }

    fn hmac(self) -> Option<hmac::Algorithm> {
        match self {
            Alg::Es256 | Alg::Rs256 => None,
            Alg::Hs256 => Some(hmac::HMAC_SHA256),
            Alg::Hs384 => Some(hmac::HMAC_SHA384),
            Alg::Hs512 => Some(hmac::HMAC_SHA512),
        }
    }
}

/// The key a token is signed or verified with.
pub enum Key<'a> {
    /// ES256 signing key.
    EcdsaSigner(&'a signature::EcdsaKeyPair),
    /// ES256 verification: an uncompressed P-256 point.
    EcdsaPublic(&'a [u8]),
    /// RS256 verification: big-endian modulus and exponent.
    RsaPublic {
        /// Modulus.
        n: &'a [u8],
        /// Public exponent.
        e: &'a [u8],
    },
    /// HMAC secret.
    Hmac(&'a [u8]),
}

fn signing_input(header: &Value, claims: &Value) -> Result<String, TokenError> {
    let h = serde_json::to_vec(header).map_err(TokenError::Encode)?;
    let c = serde_json::to_vec(claims).map_err(TokenError::Encode)?;
    Ok(format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(h),
        URL_SAFE_NO_PAD.encode(c)
    ))
}

/// Signs `claims` with `alg`; `kid` goes in the header when given.
pub fn encode(
    alg: Alg,
    key: Key<'_>,
    kid: Option<&str>,
    claims: &Value,
) -> Result<String, TokenError> {
    let mut header = serde_json::json!({"alg": alg.name(), "typ": "JWT"});
    if let (Some(kid), Some(obj)) = (kid, header.as_object_mut()) {
        obj.insert("kid".into(), Value::String(kid.into()));
    }
    let input = signing_input(&header, claims)?;
    let sig = match (alg, key) {
        (Alg::Es256, Key::EcdsaSigner(pair)) => pair
            .sign(&SystemRandom::new(), input.as_bytes())
            .map_err(|_| TokenError::Sign("ECDSA signing failed".into()))?
            .as_ref()
            .to_vec(),
        (alg, Key::Hmac(secret)) if alg.hmac().is_some() => {
            let algorithm = alg.hmac().ok_or(TokenError::Algorithm(alg.name().into()))?;
            hmac::sign(&hmac::Key::new(algorithm, secret), input.as_bytes())
                .as_ref()
                .to_vec()
        }
        _ => {
            return Err(TokenError::Sign(format!(
                "wrong key type for {}",
                alg.name()
            )));
        }
    };
    Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

fn decode_part(part: &str, what: &str) -> Result<Vec<u8>, TokenError> {
    URL_SAFE_NO_PAD.decode(part).map_err(|e| {
        TokenError::Malformed(format!(
            "{what} is not base64url: {e}",
            e = crate::error_chain(&e)
        ))
    })
}

fn decode_json(part: &str, what: &str) -> Result<Map<String, Value>, TokenError> {
    let bytes = decode_part(part, what)?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(TokenError::Malformed(format!(
            "{what} is not a JSON object"
        ))),
        Err(e) => Err(TokenError::Malformed(format!(
            "{what} is not JSON: {e}",
            e = crate::error_chain(&e)
        ))),
    }
}

/// Verifies the signature of `token` with `key`, accepting only the algorithms in `allowed`,
/// and returns the claims. Claim values are not checked here.
pub fn verify(
    token: &str,
    key: Key<'_>,
    allowed: &[Alg],
) -> Result<Map<String, Value>, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed(format!(
            "token is {} bytes, more than {MAX_TOKEN_LEN}",
            token.len()
        )));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed(
            "expected three dot-separated parts".into(),
        ));
    };
    let header = decode_json(h, "header")?;
    let alg_name = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or_else(|| TokenError::Malformed("header has no \"alg\"".into()))?;
    let alg = Alg::from_name(alg_name)
        .filter(|a| allowed.contains(a))
        .ok_or_else(|| TokenError::Algorithm(alg_name.to_owned()))?;
    if header.contains_key("crit") {
        // No extension is understood, so a critical one must fail (RFC 7515 §4.1.11).
        return Err(TokenError::Malformed(
            "header has unsupported \"crit\"".into(),
        ));
    }
    let sig = decode_part(s, "signature")?;
    let input = &token[..h.len() + 1 + c.len()];
    let ok = match (alg, key) {
        (Alg::Es256, Key::EcdsaPublic(public)) => {
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, public)
                .verify(input.as_bytes(), &sig)
                .is_ok()
        }
        (Alg::Rs256, Key::RsaPublic { n, e }) => signature::RsaPublicKeyComponents { n, e }
            .verify(
                &signature::RSA_PKCS1_2048_8192_SHA256,
                input.as_bytes(),
                &sig,
            )
            .is_ok(),
        (alg, Key::Hmac(secret)) => match alg.hmac() {
            Some(algorithm) => {
                hmac::verify(&hmac::Key::new(algorithm, secret), input.as_bytes(), &sig).is_ok()
            }
            None => false,
        },
        _ => false,
    };
    if !ok {
        return Err(TokenError::Signature);
    }
    decode_json(c, "claims")
}

/// A JSON object (a JWT header or claim set).
pub type JsonObject = Map<String, Value>;

/// The header and claims of `token` WITHOUT verifying anything: only for choosing the
/// verifier (by `iss`) and the key (by `kid`).
pub fn peek(token: &str) -> Result<(JsonObject, JsonObject), TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed(format!(
            "token is {} bytes, more than {MAX_TOKEN_LEN}",
            token.len()
        )));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed(
            "expected three dot-separated parts".into(),
        ));
    };
    Ok((decode_json(h, "header")?, decode_json(c, "claims")?))
}

/// Claim accessors with RFC 7519 types.
pub struct Claims(pub Map<String, Value>);

impl Claims {
    /// A string claim; missing or of another type is [`TokenError::MissingClaim`].
    pub fn string(&self, name: &'static str) -> Result<&str, TokenError> {
        self.0
            .get(name)
            .and_then(Value::as_str)
            .ok_or(TokenError::MissingClaim(name))
    }

    /// A NumericDate claim; `None` when absent, an error when present with another type.
    pub fn time(&self, name: &'static str) -> Result<Option<i64>, TokenError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                // NumericDate may carry a fraction; whole seconds are enough here.
                .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
                .map(Some)
                .ok_or(TokenError::MissingClaim(name)),
        }
    }

    /// `aud` as a list (it may be a single string).
    pub fn audience(&self) -> Result<Vec<String>, TokenError> {
        match self.0.get("aud") {
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or(TokenError::MissingClaim("aud"))
                })
                .collect(),
            _ => Err(TokenError::MissingClaim("aud")),
        }
    }

    /// `iss` must equal `expected`.
    pub fn check_issuer(&self, expected: &str) -> Result<(), TokenError> {
        let found = self.string("iss")?;
        if found != expected {
            return Err(TokenError::Issuer {
                expected: expected.to_owned(),
                found: found.to_owned(),
            });
        }
        Ok(())
    }

    /// `aud` must include `expected`.
    pub fn check_audience(&self, expected: &str) -> Result<(), TokenError> {
        let found = self.audience()?;
        if !found.iter().any(|a| a == expected) {
            return Err(TokenError::Audience {
                expected: expected.to_owned(),
                found,
            });
        }
        Ok(())
    }

    /// `exp` (required) and `nbf` (optional), for [`check_times`].
    pub fn times(&self) -> Result<(i64, Option<i64>), TokenError> {
        let exp = self.time("exp")?.ok_or(TokenError::MissingClaim("exp"))?;
        Ok((exp, self.time("nbf")?))
    }

    /// `exp` must be present and in the future; `nbf`, when present, reached.
    pub fn check_times(&self, now: i64) -> Result<(), TokenError> {
        let (exp, nbf) = self.times()?;
        check_times(exp, nbf, now)
    }
}

/// `now` (seconds) must be before `exp` and, when there is one, not before `nbf`.
pub fn check_times(exp: i64, nbf: Option<i64>, now: i64) -> Result<(), TokenError> {
    if now >= exp {
        return Err(TokenError::Expired { exp, now });
    }
    if let Some(nbf) = nbf
        && now < nbf
    {
        return Err(TokenError::NotYetValid { nbf, now });
    }
    Ok(())
}

/// Seconds since the Unix epoch (negative before it), as JWT `iat`/`exp`/`nbf` count time.
pub fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_round_trip_and_algorithm_pinning() {
        let claims = serde_json::json!({"sub": "x"});
        let t = encode(Alg::Hs384, Key::Hmac(b"k"), None, &claims).unwrap();
        let got = verify(&t, Key::Hmac(b"k"), &[Alg::Hs256, Alg::Hs384]).unwrap();
        assert_eq!(got.get("sub").and_then(Value::as_str), Some("x"));
        // An algorithm the verifier did not allow is refused even with the right key.
        assert!(matches!(
            verify(&t, Key::Hmac(b"k"), &[Alg::Hs256]),
            Err(TokenError::Algorithm(a)) if a == "HS384"
        ));
        assert!(matches!(
            verify(&t, Key::Hmac(b"other"), &[Alg::Hs384]),
            Err(TokenError::Signature)
        ));
    }

    #[test]
    fn alg_none_and_garbage_are_refused() {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#);
        let claims = URL_SAFE_NO_PAD.encode(br#"{"sub":"x"}"#);
        let t = format!("{header}.{claims}.");
        assert!(matches!(
            verify(&t, Key::Hmac(b"k"), &[Alg::Hs256]),
            Err(TokenError::Algorithm(_))
        ));
        for garbage in ["", "abc", "a.b", "a.b.c.d", "!!.??.**", "e30.e30.e30"] {
            assert!(
                verify(garbage, Key::Hmac(b"k"), &[Alg::Hs256]).is_err(),
                "{garbage:?}"
            );
        }
        let huge = "a".repeat(MAX_TOKEN_LEN + 1);
        assert!(matches!(
            verify(&huge, Key::Hmac(b"k"), &[Alg::Hs256]),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn claims_accessors() {
        let c = Claims(
            serde_json::json!({"aud": "a", "exp": 10.5, "nbf": "x"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        assert_eq!(c.audience().unwrap(), vec!["a".to_string()]);
        assert_eq!(c.time("exp").unwrap(), Some(10));
        assert!(c.time("nbf").is_err());
        assert_eq!(c.time("iat").unwrap(), None);
        assert!(matches!(
            c.string("iss"),
            Err(TokenError::MissingClaim("iss"))
        ));
    }
}
