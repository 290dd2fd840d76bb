//! The dashboard's sessions: a login (see `login`) is kept server-side in a bounded session
//! table; the browser gets only a random session id in an `HttpOnly; Secure;
//! SameSite=Strict` cookie. Each session has its own CSRF token, which every POST must carry.
//! An OIDC login waiting for the issuer's answer is kept in [`PendingLogins`], bound to the
//! browser that began it by a cookie of its own.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, header};
use jumpstarter_core::sync::LockExt;
use ring::rand::SecureRandom;
use serde::Deserialize;
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "jmp_ui";
/// Sessions kept at once; a new login beyond it ends the oldest.
pub const MAX_SESSIONS: usize = 1000;
/// How long a login lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Random bytes of a session id and of a CSRF token.
const ID_BYTES: usize = 32;
/// How often a client session's token is checked again as the client API checks it (its
/// client must still exist with the token's uid); its signature and expiry are checked on
/// every request.
pub const CLIENT_RECHECK: Duration = Duration::from_secs(60);
/// Characters a pasted token may have (the body limit bounds it too).
pub const MAX_TOKEN: usize = 8 * 1024;

/// Who is logged in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The admin token: every page and every action.
    Admin,
    /// A client token: every page, no action.
    Client {
        /// The client's namespace.
        namespace: String,
        /// The client's name.
        name: String,
    },
}

impl Role {
    /// `admin` or `client` (the `<body data-role>`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Client { .. } => "client",
        }
    }
}

/// One login, as kept server-side.
struct Session {
    role: Role,
    /// The token presented at login (checked again on every request: a rotated admin token
    /// or an expired client token ends the session).
    token: String,
    /// For a token of an external OIDC issuer: its `exp` (Unix seconds), checked on every
    /// request; its signature and client are checked again every [`CLIENT_RECHECK`].
    external_exp: Option<i64>,
    csrf: String,
    created: Instant,
    /// When the token was last checked against the store.
    checked: Instant,
}

/// A live session, as [`Sessions::get`] returns it.
#[derive(Debug, Clone)]
pub struct Found {
    /// Who.
    pub role: Role,
    /// The session's CSRF token.
    pub csrf: String,
    /// The token presented at login.
    pub token: String,
    /// The `exp` of an external issuer's token (`None`: the admin token or one of ours).
    pub external_exp: Option<i64>,
    /// When the token was last checked against the store.
    pub checked: Instant,
}

/// A request's login, for the handlers.
#[derive(Debug, Clone)]
pub struct Login {
    /// Who.
    pub role: Role,
    /// The session's CSRF token (put into every form).
    pub csrf: String,
    /// Who, in words, for the logs: `admin (session ab12cd34)` or `client ns/name`.
    pub who: String,
}

impl Login {
    /// Whether this login may act.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether `presented` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, presented: &str) -> bool {
        secrets_match(&self.csrf, presented)
    }
}

/// The session table (bounded by [`MAX_SESSIONS`], each for [`SESSION_LIFETIME`]).
#[derive(Default)]
pub struct Sessions {
    table: Mutex<HashMap<String, Session>>,
}

/// `n` random bytes as hex, or `None` when the system has no randomness to give.
fn random_hex(n: usize) -> Option<String> {
    let mut bytes = vec![0u8; n];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Sessions {
    /// A new session for `role` (logged in with `token`, an external issuer's token expiring
    /// at `external_exp`): its id, or `None` without randomness.
    pub fn create(&self, role: Role, token: String, external_exp: Option<i64>) -> Option<String> {
        let id = random_hex(ID_BYTES)?;
        let csrf = random_hex(ID_BYTES)?;
        let now = Instant::now();
        let mut table = self.table.lock_or_recover();
        table.retain(|_, s| now.duration_since(s.created) < SESSION_LIFETIME);
        if table.len() >= MAX_SESSIONS {
            let oldest = table
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                table.remove(&k);
            }
        }
        table.insert(
            id.clone(),
            Session {
                role,
                token,
                external_exp,
                csrf,
                created: now,
                checked: now,
            },
        );
        Some(id)
    }

    /// The live session `id`.
    pub fn get(&self, id: &str) -> Option<Found> {
        let mut table = self.table.lock_or_recover();
        let s = table.get(id)?;
        if s.created.elapsed() >= SESSION_LIFETIME {
            table.remove(id);
            return None;
        }
        Some(Found {
            role: s.role.clone(),
            csrf: s.csrf.clone(),
            token: s.token.clone(),
            external_exp: s.external_exp,
            checked: s.checked,
        })
    }

    /// Notes that session `id`'s token was just checked against the store.
    pub fn checked(&self, id: &str) {
        if let Some(s) = self.table.lock_or_recover().get_mut(id) {
            s.checked = Instant::now();
        }
    }

    /// Ends session `id`.
    pub fn remove(&self, id: &str) {
        self.table.lock_or_recover().remove(id);
    }

    /// How many sessions are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock_or_recover().len()
    }
}

/// The session id in the request's cookies: the value of `jmp_ui` when it has the shape of an
/// id (anything else counts as no cookie).
pub fn session_id(headers: &HeaderMap) -> Option<String> {
    random_cookie(headers, COOKIE)
}

/// The value of cookie `name` when it has the shape of [`random_id`]'s ids.
fn random_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| v.len() == ID_BYTES * 2 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A random id as session ids are made (hex), or `None` when the system has no randomness to
/// give: the `state`, `nonce` and browser binding of an OIDC login.
pub fn random_id() -> Option<String> {
    random_hex(ID_BYTES)
}

/// The cookie binding an OIDC login to the browser that began it.
pub const OIDC_COOKIE: &str = "jmp_ui_oidc";
/// OIDC logins waiting for the issuer at once; one more ends the oldest.
pub const MAX_PENDING: usize = 256;
/// How long an OIDC login may wait for the issuer's answer.
pub const PENDING_LIFETIME: Duration = Duration::from_secs(600);

/// An OIDC login sent to the issuer and not back yet.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The issuer's URL.
    pub issuer: String,
    /// The client id the authorization request named.
    pub client_id: String,
    /// The redirect URI the authorization request named (the code exchange names it again).
    pub redirect_uri: String,
    /// Where the code is exchanged (from the issuer's discovery document).
    pub token_endpoint: String,
    /// The PKCE verifier.
    pub code_verifier: String,
    /// The `nonce` the ID token must carry.
    pub nonce: String,
    /// The value of the [`OIDC_COOKIE`] of the browser that began it.
    pub browser: String,
    /// When it began.
    pub created: Instant,
}

/// The OIDC logins waiting for the issuer, by `state` (bounded by [`MAX_PENDING`], each for
/// [`PENDING_LIFETIME`], and each taken once).
#[derive(Default)]
pub struct PendingLogins {
    table: Mutex<HashMap<String, Pending>>,
}

impl PendingLogins {
    /// Keeps `pending` under `state`.
    pub fn insert(&self, state: String, pending: Pending) {
        let now = Instant::now();
        let mut table = self.table.lock_or_recover();
        table.retain(|_, p| now.duration_since(p.created) < PENDING_LIFETIME);
        if table.len() >= MAX_PENDING {
            let oldest = table
                .iter()
                .min_by_key(|(_, p)| p.created)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                table.remove(&k);
            }
        }
        table.insert(state, pending);
    }

    /// Takes the login of `state` (it cannot be used again), unless it expired.
    pub fn take(&self, state: &str) -> Option<Pending> {
        let p = self.table.lock_or_recover().remove(state)?;
        (p.created.elapsed() < PENDING_LIFETIME).then_some(p)
    }

    /// How many are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock_or_recover().len()
    }
}

/// The browser binding of an OIDC login in the request's cookies.
pub fn oidc_browser(headers: &HeaderMap) -> Option<String> {
    random_cookie(headers, OIDC_COOKIE)
}

/// The `Set-Cookie` value binding an OIDC login to the browser (`None`: the one that ends
/// it). `SameSite=Lax`, not `Strict`: the issuer's redirect back is a navigation from
/// another site, on which a `Strict` cookie is not sent.
pub fn oidc_cookie(value: Option<&str>) -> String {
    match value {
        Some(v) => format!(
            "{OIDC_COOKIE}={v}; Path=/ui/login/oidc; HttpOnly; Secure; SameSite=Lax; Max-Age={}",
            PENDING_LIFETIME.as_secs()
        ),
        None => format!(
            "{OIDC_COOKIE}=; Path=/ui/login/oidc; HttpOnly; Secure; SameSite=Lax; Max-Age=0"
        ),
    }
}

/// Whether two secrets are equal (constant time).
pub fn secrets_match(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Why a request has no usable login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoLogin {
    /// No cookie, an unknown or expired session, or its token is no longer valid.
    Missing,
}

/// The `Set-Cookie` value of session `id` (`None`: the one that ends it).
pub fn cookie(id: Option<&str>) -> String {
    match id {
        Some(id) => format!(
            "{COOKIE}={id}; Path=/ui; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
            SESSION_LIFETIME.as_secs()
        ),
        None => format!("{COOKIE}=; Path=/ui; HttpOnly; Secure; SameSite=Strict; Max-Age=0"),
    }
}

/// The logout form's fields.
#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cookie_headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, v.parse().unwrap_or_else(|_| unreachable!()));
        h
    }

    #[test]
    fn the_session_id_is_read_only_in_its_shape() {
        let id = "ab".repeat(ID_BYTES);
        assert_eq!(
            session_id(&cookie_headers(&format!("x=1; jmp_ui={id}; y=2"))),
            Some(id.clone())
        );
        assert_eq!(session_id(&cookie_headers("jmp_ui=short")), None);
        assert_eq!(
            session_id(&cookie_headers(&format!(
                "jmp_ui={}",
                "zz".repeat(ID_BYTES)
            ))),
            None
        );
        assert_eq!(session_id(&cookie_headers("jmp_ui")), None);
        assert_eq!(session_id(&HeaderMap::new()), None);
    }

    #[test]
    fn the_table_is_bounded_and_sessions_are_distinct() {
        let s = Sessions::default();
        let mut ids = std::collections::HashSet::new();
        for _ in 0..(MAX_SESSIONS + 10) {
            let id = s.create(Role::Admin, "t".into(), None);
            assert!(id.as_ref().is_some_and(|i| ids.insert(i.clone())));
        }
        assert_eq!(s.len(), MAX_SESSIONS);
    }

    #[test]
    fn the_cookie_is_http_only_secure_strict_and_never_holds_the_token() {
        let c = cookie(Some("abc"));
        for part in [
            "jmp_ui=abc",
            "HttpOnly",
            "Secure",
            "SameSite=Strict",
            "Path=/ui",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(cookie(None).contains("Max-Age=0"));
    }

    fn pending(created: Instant) -> Pending {
        Pending {
            issuer: "https://i.example".into(),
            client_id: "c".into(),
            redirect_uri: "http://127.0.0.1/ui/login/oidc/callback".into(),
            token_endpoint: "https://i.example/token".into(),
            code_verifier: "v".into(),
            nonce: "n".into(),
            browser: "b".into(),
            created,
        }
    }

    #[test]
    fn pending_logins_are_bounded_taken_once_and_expire() {
        let p = PendingLogins::default();
        for i in 0..(MAX_PENDING + 10) {
            p.insert(format!("s{i}"), pending(Instant::now()));
        }
        assert_eq!(p.len(), MAX_PENDING);
        // The oldest were ended to make room.
        assert!(p.take("s0").is_none());
        let last = format!("s{}", MAX_PENDING + 9);
        assert!(p.take(&last).is_some());
        assert!(p.take(&last).is_none(), "a state is used once");
        if let Some(old) = Instant::now().checked_sub(PENDING_LIFETIME) {
            p.insert("old".into(), pending(old));
            assert!(p.take("old").is_none(), "an expired login is refused");
        }
    }

    #[test]
    fn the_oidc_cookie_is_lax_and_scoped_to_the_callback() {
        let c = oidc_cookie(Some("abc"));
        for part in [
            "jmp_ui_oidc=abc",
            "HttpOnly",
            "Secure",
            "SameSite=Lax",
            "Path=/ui/login/oidc",
            "Max-Age=600",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(oidc_cookie(None).contains("Max-Age=0"));
        let id = "cd".repeat(ID_BYTES);
        assert_eq!(
            oidc_browser(&cookie_headers(&format!("jmp_ui=x; jmp_ui_oidc={id}"))),
            Some(id)
        );
        assert_eq!(oidc_browser(&cookie_headers("jmp_ui_oidc=short")), None);
    }

    #[test]
    fn csrf_comparison() {
        let l = Login {
            role: Role::Admin,
            csrf: "abc".into(),
            who: "admin".into(),
        };
        assert!(l.csrf_matches("abc"));
        assert!(!l.csrf_matches("abd"));
        assert!(!l.csrf_matches(""));
    }
}
