//! The controller's key material (CA, token signing key, router key, admin token) kept in a
//! Secret, so that every replica (and every restart of a pod with an empty data directory)
//! signs and verifies with the same keys; without it, a failover would invalidate every
//! token handed out.
//!
//! Only the leader calls these: [`restore`] before starting (Secret → data directory), and
//! [`save`] after the first start generated the files (data directory → Secret). The server
//! certificate is not kept: each replica issues its own from the shared CA.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::store::{Store, StoreError};

/// Name of the Secret in the controller's namespace.
pub const KEY_SECRET_NAME: &str = "jumpstarter-controller-keys";

/// (Secret key, path in the data directory) of every file kept.
pub const FILES: &[(&str, &str)] = &[
    ("ca.crt", "ca/ca.crt"),
    ("ca.key", "ca/ca.key"),
    ("signing-key.pem", "signing-key.pem"),
    ("router-key", "router-key"),
    ("admin-token", crate::auth::admin_token::ADMIN_TOKEN_FILE),
];

/// Moving key material between the Secret and the data directory failed.
#[derive(Debug, thiserror::Error)]
pub enum KeySecretError {
    /// The Secret could not be read or written.
    #[error("Secret {namespace}/{KEY_SECRET_NAME}")]
    Store {
        /// Namespace.
        namespace: String,
        /// The store's error.
        source: Box<StoreError>,
    },
    /// A file could not be read or written.
    #[error("{path}")]
    File {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn file_err(path: &Path, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> KeySecretError {
    KeySecretError::File {
        path: path.display().to_string(),
        source: e.into(),
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), KeySecretError> {
    jumpstarter_core::private_file::write_private_file(path, bytes).map_err(|e| file_err(path, e))
}

/// Writes the files kept in the Secret into `dir` (replacing what is there); `Ok(false)`
/// when the Secret does not exist yet. A Secret missing some files restores the others.
pub async fn restore<S: Store>(
    store: &S,
    namespace: &str,
    dir: &Path,
) -> Result<bool, KeySecretError> {
    let secret = store
        .get::<Secret>(namespace, KEY_SECRET_NAME)
        .await
        .map_err(|source| KeySecretError::Store {
            namespace: namespace.to_owned(),
            source: Box::new(source),
        })?;
    let Some(secret) = secret else {
        return Ok(false);
    };
    let data = secret.data.unwrap_or_default();
    for (key, rel) in FILES {
        if let Some(bytes) = data.get(*key) {
            write_private(&dir.join(rel), &bytes.0)?;
        }
    }
    Ok(true)
}

/// Creates or updates the Secret from the files in `dir` (those that exist).
pub async fn save<S: Store>(store: &S, namespace: &str, dir: &Path) -> Result<(), KeySecretError> {
    let mut data = BTreeMap::new();
    for (key, rel) in FILES {
        let path = dir.join(rel);
        match std::fs::read(&path) {
            Ok(bytes) => {
                data.insert((*key).to_owned(), ByteString(bytes));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(file_err(&path, e)),
        }
    }
    let store_err = |source| KeySecretError::Store {
        namespace: namespace.to_owned(),
        source: Box::new(source),
    };
    let current = store
        .get::<Secret>(namespace, KEY_SECRET_NAME)
        .await
        .map_err(store_err)?;
    match current {
        Some(mut s) => {
            s.data = Some(data);
            store.update(&s).await.map_err(store_err)?;
        }
        None => {
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(KEY_SECRET_NAME.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..ObjectMeta::default()
                },
                type_: Some("Opaque".to_owned()),
                data: Some(data),
                ..Secret::default()
            };
            store.create(&s).await.map_err(store_err)?;
        }
    }
    Ok(())
}

/// Name of the `kubernetes.io/tls` Secret the router Deployment mounts.
pub const ROUTER_TLS_SECRET_NAME: &str = "jumpstarter-router-tls";
/// Annotation recording the SANs the router certificate was issued for.
const SANS_ANNOTATION: &str = "jumpstarter.dev/sans";

/// Makes sure the Secret [`ROUTER_TLS_SECRET_NAME`] holds a certificate from `ca` for
/// exactly `sans` (`tls.crt`, `tls.key`); re-issues it when the SANs changed. Clients trust
/// it through the CA their configs carry. Returns whether it was (re)written.
pub async fn ensure_router_tls<S: Store>(
    store: &S,
    namespace: &str,
    ca: &jumpstarter_core::auth::CertificateAuthority,
    sans: &[String],
) -> Result<bool, KeySecretError> {
    let store_err = |source| KeySecretError::Store {
        namespace: namespace.to_owned(),
        source: Box::new(source),
    };
    let wanted = sans.join(",");
    let current = store
        .get::<Secret>(namespace, ROUTER_TLS_SECRET_NAME)
        .await
        .map_err(store_err)?;
    let issued_for = current
        .as_ref()
        .and_then(|s| s.metadata.annotations.as_ref())
        .and_then(|a| a.get(SANS_ANNOTATION));
    if issued_for == Some(&wanted) {
        return Ok(false);
    }
    let cert = ca
        .issue_server_cert(sans)
        .map_err(|e| KeySecretError::File {
            path: format!("router certificate for {wanted}"),
            source: e.into(),
        })?;
    let data = BTreeMap::from([
        ("tls.crt".to_owned(), ByteString(cert.cert_pem.into_bytes())),
        ("tls.key".to_owned(), ByteString(cert.key_pem.into_bytes())),
        (
            "ca.crt".to_owned(),
            ByteString(ca.cert_pem().as_bytes().to_vec()),
        ),
    ]);
    let annotations = BTreeMap::from([(SANS_ANNOTATION.to_owned(), wanted)]);
    match current {
        Some(mut s) => {
            s.data = Some(data);
            s.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(annotations);
            store.update(&s).await.map_err(store_err)?;
        }
        None => {
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(ROUTER_TLS_SECRET_NAME.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                },
                type_: Some("kubernetes.io/tls".to_owned()),
                data: Some(data),
                ..Secret::default()
            };
            store.create(&s).await.map_err(store_err)?;
        }
    }
    Ok(true)
}

/// The names a router certificate must cover: the hosts of `routers`' endpoints, the
/// in-cluster Service names of `jumpstarter-router` in `namespace`, and `localhost`.
pub fn router_sans(routers: &[crate::state::RouterEntry], namespace: &str) -> Vec<String> {
    let mut sans: Vec<String> = routers
        .iter()
        .filter_map(|r| {
            r.endpoint
                .rsplit_once(':')
                .map(|(h, _)| h.trim_matches(['[', ']']).to_owned())
        })
        .collect();
    sans.extend([
        "jumpstarter-router".to_owned(),
        format!("jumpstarter-router.{namespace}.svc"),
        format!("jumpstarter-router.{namespace}.svc.cluster.local"),
        "localhost".to_owned(),
    ]);
    let mut seen = std::collections::BTreeSet::new();
    sans.retain(|s| !s.is_empty() && seen.insert(s.clone()));
    sans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_round_trip_between_data_dirs() {
        let db = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(db.path()).await.unwrap();
        let first = tempfile::tempdir().unwrap();
        assert!(!restore(&store, "lab", first.path()).await.unwrap());
        std::fs::create_dir_all(first.path().join("ca")).unwrap();
        std::fs::write(first.path().join("ca/ca.crt"), "CERT").unwrap();
        std::fs::write(first.path().join("ca/ca.key"), "KEY").unwrap();
        std::fs::write(first.path().join("router-key"), "RK").unwrap();
        save(&store, "lab", first.path()).await.unwrap();
        // Saving again (e.g. after a new file appeared) updates the Secret.
        std::fs::write(first.path().join("admin-token"), "AT").unwrap();
        save(&store, "lab", first.path()).await.unwrap();

        let second = tempfile::tempdir().unwrap();
        std::fs::write(second.path().join("router-key"), "stale").unwrap();
        assert!(restore(&store, "lab", second.path()).await.unwrap());
        let read = |p: &str| std::fs::read_to_string(second.path().join(p)).unwrap();
        assert_eq!(read("ca/ca.crt"), "CERT");
        assert_eq!(read("ca/ca.key"), "KEY");
        assert_eq!(read("router-key"), "RK");
        assert_eq!(read("admin-token"), "AT");
        assert!(!second.path().join("signing-key.pem").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(second.path().join("ca/ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn router_certificate_is_issued_once_per_san_list() {
        let db = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(db.path()).await.unwrap();
        let ca = jumpstarter_core::auth::CertificateAuthority::generate("test CA").unwrap();
        let routers = vec![crate::state::RouterEntry {
            name: "router-0".into(),
            endpoint: "router-0.lab.example.com:443".into(),
            labels: Default::default(),
        }];
        let sans = router_sans(&routers, "lab");
        assert_eq!(sans[0], "router-0.lab.example.com");
        assert!(sans.contains(&"jumpstarter-router.lab.svc".to_owned()));
        assert!(ensure_router_tls(&store, "lab", &ca, &sans).await.unwrap());
        assert!(!ensure_router_tls(&store, "lab", &ca, &sans).await.unwrap());
        let s: Secret = store
            .get("lab", ROUTER_TLS_SECRET_NAME)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
        let data = s.data.unwrap();
        assert!(String::from_utf8_lossy(&data["tls.crt"].0).contains("BEGIN CERTIFICATE"));
        let fewer = vec!["localhost".to_owned()];
        assert!(ensure_router_tls(&store, "lab", &ca, &fewer).await.unwrap());
        let bad = vec!["not a host!".to_owned()];
        assert!(ensure_router_tls(&store, "lab", &ca, &bad).await.is_err());
    }

    #[tokio::test]
    async fn unwritable_data_dir_is_named() {
        let db = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(db.path()).await.unwrap();
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("router-key"), "RK").unwrap();
        save(&store, "lab", src.path()).await.unwrap();
        // A file where the data directory should be.
        let blocker = src.path().join("blocker");
        std::fs::write(&blocker, "x").unwrap();
        let e = restore(&store, "lab", &blocker).await.unwrap_err();
        assert!(e.to_string().contains("blocker"), "{e}");
    }
}
