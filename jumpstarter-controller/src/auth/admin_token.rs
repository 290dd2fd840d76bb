//! The admin credential: a random secret the controller creates on first start in its data
//! directory (mode 0600) and reuses afterwards. `AdminService` callers present it as
//! `authorization: Bearer <token>`.
//!
//! A plain secret rather than a signed token: there is exactly one admin identity, nothing to
//! encode in it, and revoking it is deleting the file and restarting.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use ring::rand::SecureRandom;
use subtle::ConstantTimeEq;

/// Every admin token starts with this, so it is recognisable (and never parses as a JWT).
pub const ADMIN_TOKEN_PREFIX: &str = "jsadmin_";
/// Name of the file in the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";
/// Random bytes in a token (hex encoded after the prefix).
const SECRET_BYTES: usize = 32;

/// The admin token file could not be created or read.
#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    /// Reading or writing the file failed.
    #[error("admin token {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file does not hold a token of ours.
    #[error(
        "admin token {path}: not an admin token (expected {ADMIN_TOKEN_PREFIX} followed by \
         {} hex digits); delete the file to have a new one created",
        SECRET_BYTES * 2
    )]
    Malformed {
        /// The file.
        path: PathBuf,
    },
    /// The system random generator failed.
    #[error("admin token {path}: cannot generate random bytes")]
    Random {
        /// The file.
        path: PathBuf,
    },
}

/// The admin secret.
#[derive(Clone)]
pub struct AdminToken {
    token: String,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

fn is_well_formed(token: &str) -> bool {
    token.strip_prefix(ADMIN_TOKEN_PREFIX).is_some_and(|hex| {
        hex.len() == SECRET_BYTES * 2 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

impl AdminToken {
    /// A fresh random token (not saved).
    pub fn generate() -> Option<Self> {
        let mut bytes = [0u8; SECRET_BYTES];
        ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Some(Self {
            token: format!("{ADMIN_TOKEN_PREFIX}{hex}"),
        })
    }

    /// Reads the token at `path`, or creates one there (mode 0600, written to a temporary file
    /// and renamed, so a crash never leaves half a token). A readable file with looser
    /// permissions is tightened to 0600.
    pub fn load_or_create(path: &Path) -> Result<Self, AdminTokenError> {
        let io = |source| AdminTokenError::Io {
            path: path.to_path_buf(),
            source,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let token = text.trim().to_string();
                if !is_well_formed(&token) {
                    return Err(AdminTokenError::Malformed {
                        path: path.to_path_buf(),
                    });
                }
                let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
                if mode & 0o077 != 0 {
                    tracing::warn!(
                        "admin token {} was readable by others (mode {:o}); setting 0600",
                        path.display(),
                        mode & 0o777
                    );
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                        .map_err(io)?;
                }
                Ok(Self { token })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let token = Self::generate().ok_or_else(|| AdminTokenError::Random {
                    path: path.to_path_buf(),
                })?;
                jumpstarter_core::private_file::write_private_file(
                    path,
                    format!("{}\n", token.token).as_bytes(),
                )
                .map_err(io)?;
                Ok(token)
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The token text (what goes after `Bearer `).
    pub fn as_str(&self) -> &str {
        &self.token
    }

    /// Whether `candidate` is this token, compared in constant time.
    pub fn matches(&self, candidate: &str) -> bool {
        let a = self.token.as_bytes();
        let b = candidate.as_bytes();
        a.len() == b.len() && bool::from(a.ct_eq(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_with_mode_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        let a = AdminToken::load_or_create(&path).unwrap();
        assert!(is_well_formed(a.as_str()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = AdminToken::load_or_create(&path).unwrap();
        assert_eq!(a.as_str(), b.as_str());
        assert!(a.matches(b.as_str()));
        assert!(!a.matches(&b.as_str()[1..]));
        assert!(!a.matches(""));
        assert_ne!(
            a.as_str(),
            AdminToken::generate().unwrap().as_str(),
            "tokens must be random"
        );
    }

    #[test]
    fn loose_permissions_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        AdminToken::load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        AdminToken::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn garbage_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        std::fs::write(&path, "hello").unwrap();
        let e = AdminToken::load_or_create(&path).unwrap_err().to_string();
        assert!(e.contains("admin-token"), "{e}");
        assert!(e.contains("not an admin token"), "{e}");
        // Left alone: the operator decides.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello");
    }
}
