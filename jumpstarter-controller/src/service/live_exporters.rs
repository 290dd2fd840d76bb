//! One live connection per exporter identity.
//!
//! An exporter is online through its `Status` stream. While one connection of an exporter
//! identity (`namespace/name`) holds that stream, another instance of the same identity is
//! refused with `ALREADY_EXISTS` when it registers or opens its own stream, and its
//! `ReportStatus(OFFLINE)` and `Unregister` (sent when it stops) change nothing: a second
//! `jmp run` of one exporter can neither take the board over nor take it offline.
//!
//! Connections are told apart by the instance id our exporters send
//! ([`jumpstarter_core::auth::EXPORTER_INSTANCE_HEADER`], one per process); callers
//! without it (upstream's exporters) by their TCP peer address. The same instance opening a
//! new stream (it reconnected before the controller noticed its old connection was gone)
//! replaces its old stream. A connection that died without closing (its host lost power)
//! holds the identity until the listener's keepalive closes it.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use jiff::Timestamp;
use tokio::sync::watch;
use tonic::{Status, metadata::MetadataMap};

/// The longest instance id taken from a caller; a longer one is cut (it only tells
/// connections apart).
const MAX_INSTANCE_ID: usize = 128;

/// Who is calling: an exporter process (our exporters say which) or a TCP peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnKey {
    /// The instance id our exporters send.
    Instance(String),
    /// The TCP peer of a caller without an instance id.
    Peer(SocketAddr),
    /// Neither is known (not a TCP connection): never refused, never refuses others.
    Unknown,
}

impl ConnKey {
    /// The key of a request with metadata `md` from `peer`.
    pub fn of(md: &MetadataMap, peer: Option<SocketAddr>) -> Self {
        let instance = md
            .get(jumpstarter_core::auth::EXPORTER_INSTANCE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty());
        match (instance, peer) {
            (Some(id), _) => Self::Instance(id.chars().take(MAX_INSTANCE_ID).collect()),
            (None, Some(peer)) => Self::Peer(peer),
            (None, None) => Self::Unknown,
        }
    }

    fn same_as(&self, other: &ConnKey) -> bool {
        matches!(self, ConnKey::Unknown) || matches!(other, ConnKey::Unknown) || self == other
    }
}

struct Live {
    id: u64,
    key: ConnKey,
    peer: Option<SocketAddr>,
    since: Timestamp,
    /// Set when the same instance opens a newer stream.
    replaced: watch::Sender<bool>,
}

/// The live `Status` stream of every online exporter identity.
#[derive(Default)]
pub struct LiveExporters {
    live: Mutex<HashMap<(String, String), Live>>,
    next_id: AtomicU64,
}

/// Holds an exporter identity while its `Status` stream is open; dropping it frees it.
pub struct LiveClaim {
    owner: Arc<LiveExporters>,
    key: (String, String),
    id: u64,
    /// Becomes `true` when the same instance opened a newer stream: this one must end.
    replaced: watch::Receiver<bool>,
}

impl LiveClaim {
    /// Completes when the same instance opened a newer stream: this one must end.
    pub async fn replaced(&mut self) {
        loop {
            let replaced = *self.replaced.borrow_and_update();
            if replaced {
                return;
            }
            if self.replaced.changed().await.is_err() {
                // The identity's entry is gone: nothing can replace this stream any more.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for LiveClaim {
    fn drop(&mut self) {
        let mut live = self.owner.lock();
        if live.get(&self.key).is_some_and(|l| l.id == self.id) {
            live.remove(&self.key);
        }
    }
}

impl LiveExporters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses a caller (`key`) of `namespace/name` while another connection holds it.
    pub fn check(&self, namespace: &str, name: &str, key: &ConnKey) -> Result<(), Status> {
        let live = self.lock();
        match live.get(&(namespace.to_string(), name.to_string())) {
            Some(l) if !l.key.same_as(key) => Err(already_online(namespace, name, l)),
            _ => Ok(()),
        }
    }

    /// Takes `namespace/name` for a new `Status` stream of `key` (from `peer`): refused
    /// while another instance holds it; the same instance's older stream is replaced.
    pub fn claim(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        key: ConnKey,
        peer: Option<SocketAddr>,
    ) -> Result<LiveClaim, Status> {
        let ident = (namespace.to_string(), name.to_string());
        let mut live = self.lock();
        if let Some(l) = live.get(&ident) {
            if !l.key.same_as(&key) {
                return Err(already_online(namespace, name, l));
            }
            l.replaced.send_replace(true);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (replaced, replaced_rx) = watch::channel(false);
        live.insert(
            ident.clone(),
            Live {
                id,
                key,
                peer,
                since: Timestamp::now(),
                replaced,
            },
        );
        Ok(LiveClaim {
            owner: Arc::clone(self),
            key: ident,
            id,
            replaced: replaced_rx,
        })
    }
}

fn already_online(namespace: &str, name: &str, l: &Live) -> Status {
    let from = l
        .peer
        .map(|p| format!("connected from {p}"))
        .unwrap_or_else(|| "connected".into());
    Status::already_exists(format!(
        "exporter {namespace}/{name} is already online ({from} since {}); stop that one first",
        l.since.strftime("%Y-%m-%d %H:%M:%S UTC")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn a_second_instance_is_refused_until_the_first_lets_go() {
        let live = Arc::new(LiveExporters::default());
        let a = ConnKey::Instance("a".into());
        let b = ConnKey::Instance("b".into());
        let first = live.claim("default", "ex", a.clone(), peer(1000)).unwrap();
        let e = live
            .claim("default", "ex", b.clone(), peer(2000))
            .err()
            .unwrap();
        assert_eq!(e.code(), tonic::Code::AlreadyExists);
        assert!(
            e.message().starts_with(
                "exporter default/ex is already online (connected from 127.0.0.1:1000 since "
            ),
            "{}",
            e.message()
        );
        assert!(live.check("default", "ex", &b).is_err());
        assert!(live.check("default", "ex", &a).is_ok());
        // Other identities are not affected.
        assert!(live.check("default", "other", &b).is_ok());
        assert!(live.check("lab", "ex", &b).is_ok());
        drop(first);
        assert!(live.check("default", "ex", &b).is_ok());
        let _second = live.claim("default", "ex", b, peer(2000)).unwrap();
        assert!(live.check("default", "ex", &a).is_err());
    }

    #[test]
    fn the_same_instance_replaces_its_older_stream() {
        let live = Arc::new(LiveExporters::default());
        let a = ConnKey::Instance("a".into());
        let old = live.claim("default", "ex", a.clone(), peer(1000)).unwrap();
        let new = live.claim("default", "ex", a.clone(), peer(1001)).unwrap();
        assert!(*old.replaced.borrow());
        assert!(!*new.replaced.borrow());
        // The old stream ending does not free the identity the new one holds.
        drop(old);
        assert!(
            live.check("default", "ex", &ConnKey::Instance("b".into()))
                .is_err()
        );
        drop(new);
        assert!(
            live.check("default", "ex", &ConnKey::Instance("b".into()))
                .is_ok()
        );
    }

    #[test]
    fn callers_without_an_instance_id_are_told_apart_by_peer() {
        let live = Arc::new(LiveExporters::default());
        let md = MetadataMap::new();
        let k1 = ConnKey::of(&md, peer(1000));
        assert_eq!(k1, ConnKey::Peer(peer(1000).unwrap()));
        let _c = live.claim("default", "ex", k1.clone(), peer(1000)).unwrap();
        assert!(live.check("default", "ex", &k1).is_ok());
        assert!(
            live.check("default", "ex", &ConnKey::of(&md, peer(1001)))
                .is_err()
        );
        assert!(live.check("default", "ex", &ConnKey::Unknown).is_ok());
        let mut md = MetadataMap::new();
        md.insert(
            jumpstarter_core::auth::EXPORTER_INSTANCE_HEADER,
            " 1234 ".parse().unwrap(),
        );
        assert_eq!(
            ConnKey::of(&md, peer(1000)),
            ConnKey::Instance("1234".into())
        );
    }
}
