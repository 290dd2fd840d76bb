//! The objects the dashboard shows (exporters, leases, exporter sets), each kind listed once
//! and then kept from the store's watch (listed again when the watch falls behind), so that a
//! page of 10,000 exporters is read from memory, not from the store. Every change bumps a
//! counter of what it affects; the event stream reports the counters that moved.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use jumpstarter_core::sync::LockExt;
use tokio::sync::watch;

use crate::{
    objects::{Exporter, Lease, selector::LabelSelector, virtualtarget::ExporterSet},
    store::{ListParams, Store, StoreObject, WatchEvent},
};

/// (namespace, name).
pub type Key = (String, String);

/// How many changes of each part of the dashboard were seen (each only grows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    /// Exporters (the fleet page and the exporter pages).
    pub exporters: u64,
    /// Leases (the leases page, and the holders on the fleet page).
    pub leases: u64,
    /// Exporter sets (the pools page).
    pub pools: u64,
}

/// One kind's objects.
pub type Objects<K> = Mutex<BTreeMap<Key, Arc<K>>>;

/// The objects, kept from the store.
#[derive(Default)]
pub struct View {
    /// Every exporter.
    pub exporters: Objects<Exporter>,
    /// Every lease (ended ones until the store removes them).
    pub leases: Objects<Lease>,
    /// Every ExporterSet.
    pub sets: Objects<ExporterSet>,
    changes: watch::Sender<Changes>,
    synced: watch::Sender<u8>,
}

/// Which counter a kind's changes bump, and which synced bit it sets.
trait Part: StoreObject {
    fn objects(view: &View) -> &Objects<Self>;
    fn bump(c: &mut Changes);
    const BIT: u8;
}

impl Part for Exporter {
    fn objects(view: &View) -> &Objects<Self> {
        &view.exporters
    }
    fn bump(c: &mut Changes) {
        c.exporters += 1;
    }
    const BIT: u8 = 1;
}

impl Part for Lease {
    fn objects(view: &View) -> &Objects<Self> {
        &view.leases
    }
    fn bump(c: &mut Changes) {
        c.leases += 1;
    }
    const BIT: u8 = 2;
}

impl Part for ExporterSet {
    fn objects(view: &View) -> &Objects<Self> {
        &view.sets
    }
    fn bump(c: &mut Changes) {
        c.pools += 1;
    }
    const BIT: u8 = 4;
}

const ALL_SYNCED: u8 = 7;

fn key_of<K: StoreObject>(o: &K) -> Key {
    let m = o.meta();
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

impl View {
    /// A view kept from `store` until `stopped` says true.
    pub fn start<S: Store>(store: &S, stopped: watch::Receiver<bool>) -> Arc<Self> {
        let view = Arc::new(Self::default());
        tokio::spawn(feed::<Exporter, S>(
            view.clone(),
            store.clone(),
            stopped.clone(),
        ));
        tokio::spawn(feed::<Lease, S>(
            view.clone(),
            store.clone(),
            stopped.clone(),
        ));
        tokio::spawn(feed::<ExporterSet, S>(view.clone(), store.clone(), stopped));
        view
    }

    /// The change counters, to wait on.
    pub fn subscribe(&self) -> watch::Receiver<Changes> {
        self.changes.subscribe()
    }

    /// Whether every kind was listed (waits up to `wait`).
    pub async fn synced(&self, wait: Duration) -> bool {
        let mut rx = self.synced.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|b| *b == ALL_SYNCED))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Every object of one kind (cheap: the objects are shared).
    pub fn all<K>(objects: &Objects<K>) -> Vec<Arc<K>> {
        objects.lock_or_recover().values().cloned().collect()
    }

    /// Object `namespace/name` of one kind.
    pub fn one<K>(objects: &Objects<K>, namespace: &str, name: &str) -> Option<Arc<K>> {
        objects
            .lock_or_recover()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn replace<K: Part>(&self, items: Vec<K>) {
        let map = items
            .into_iter()
            .map(|o| (key_of(&o), Arc::new(o)))
            .collect();
        *K::objects(self).lock_or_recover() = map;
        self.changes.send_modify(K::bump);
        self.synced.send_modify(|b| *b |= K::BIT);
    }

    fn apply<K: Part>(&self, ev: WatchEvent<K>) {
        {
            let mut map = K::objects(self).lock_or_recover();
            match ev {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    map.insert(key_of(&o), Arc::new(o));
                }
                WatchEvent::Deleted(o) => {
                    map.remove(&key_of(&o));
                }
            }
        }
        self.changes.send_modify(K::bump);
    }
}

/// Lists kind `K`, then follows its watch; lists again when the watch ends or falls behind.
async fn feed<K: Part, S: Store>(view: Arc<View>, store: S, mut stopped: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(100);
    let run = async {
        loop {
            let listed = store
                .list::<K>(None, &LabelSelector::everything(), &ListParams::default())
                .await;
            let watched = match &listed {
                Ok(l) => store
                    .watch::<K>(None, Some(&l.resource_version))
                    .await
                    .map(Some),
                Err(_) => Ok(None),
            };
            let (listed, mut watch) = match (listed, watched) {
                (Ok(l), Ok(Some(w))) => (l, w),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::debug!(
                        "dashboard: {} view: {e}; retrying",
                        K::kind(&()),
                        e = jumpstarter_core::error_chain(&e)
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
                (Ok(_), Ok(None)) => continue,
            };
            backoff = Duration::from_millis(100);
            view.replace(listed.items);
            while let Some(ev) = watch.next().await {
                match ev {
                    Ok(ev) => view.apply(ev),
                    Err(e) => {
                        tracing::debug!(
                            "dashboard: {} view: {e}; listing again",
                            K::kind(&()),
                            e = jumpstarter_core::error_chain(&e)
                        );
                        break;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
        }
    };
    tokio::select! {
        _ = run => {}
        _ = stopped.wait_for(|s| *s) => {}
    }
}
