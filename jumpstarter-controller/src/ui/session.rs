//! The dashboard's sessions: a login (see `login`) is kept server-side in a bounded session
//! table; the browser gets only a random session id in an `HttpOnly; Secure;
//! SameSite=Strict` cookie. Each session has its own CSRF token, which every POST must carry.

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
    csrf: String,
    created: Instant,
    /// When the token was last checked against the store.
    checked: Instant,
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
        let (a, b) = (self.csrf.as_bytes(), presented.as_bytes());
        a.len() == b.len() && bool::from(a.ct_eq(b))
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
    /// A new session for `role` (logged in with `token`): its id, or `None` without
    /// randomness.
    pub fn create(&self, role: Role, token: String) -> Option<String> {
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
                csrf,
                created: now,
                checked: now,
            },
        );
        Some(id)
    }

    /// The live session `id`: its role, CSRF token, token, and when the token was last
    /// checked against the store.
    pub fn get(&self, id: &str) -> Option<(Role, String, String, Instant)> {
        let mut table = self.table.lock_or_recover();
        let s = table.get(id)?;
        if s.created.elapsed() >= SESSION_LIFETIME {
            table.remove(id);
            return None;
        }
        Some((s.role.clone(), s.csrf.clone(), s.token.clone(), s.checked))
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
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| v.len() == ID_BYTES * 2 && v.bytes().all(|b| b.is_ascii_hexdigit()))
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
            let id = s.create(Role::Admin, "t".into());
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
