//! The exporter cache: every exporter as the store's watch last delivered it, the Status
//! streams' heartbeats, and the changes the reconcile loop has not taken yet.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use jiff::Timestamp;
use tokio::sync::{Notify, watch};

use crate::{
    events::EventRecorder,
    objects::{Exporter, ObjectKey, exporter_key},
    selector::LabelSelector,
    store::{ListParams, Store, StoreError, WatchEvent},
};
use jumpstarter_core::sync::LockExt;

/// The latest state of one exporter, as the store's watch delivered it (`None`: deleted).
pub type ExporterUpdates = watch::Receiver<Option<Arc<Exporter>>>;

/// What the reconcile loop takes from the exporter cache at the start of a pass.
pub enum ExporterChanges {
    /// Everything (first pass, or the feed had to list again).
    All(Vec<Exporter>),
    /// Only these changed (`None`: deleted).
    Some(Vec<(ObjectKey, Option<Exporter>)>),
}

/// Every exporter as the store's watch last delivered it, kept by one feed task so that a
/// change is decoded once, not once per Status stream, and so that a reconcile pass does
/// not list and decode every exporter.
#[derive(Default)]
struct Cached {
    /// Whether `objects` holds a full list plus every change after it.
    synced: bool,
    objects: HashMap<ObjectKey, Arc<Exporter>>,
    /// Changed since the reconcile loop last took them.
    dirty: HashSet<ObjectKey>,
    /// Set when the cache was rebuilt from a new list: the reconcile view must start over.
    relisted: bool,
    /// Status streams waiting for changes of one exporter.
    watchers: HashMap<ObjectKey, watch::Sender<Option<Arc<Exporter>>>>,
}

/// Every exporter as the store's watch last delivered it, kept by one feed task (see
/// [`ExporterCache::start_feed`]), plus when a Status stream last saw each exporter.
pub struct ExporterCache {
    cached: Mutex<Cached>,
    /// Poked when the cache becomes synced.
    synced: Notify,
    feed_started: AtomicBool,
    /// Dropped with the cache, which ends the feed task.
    feed_stop: watch::Sender<()>,
    /// When a Status stream last saw each exporter (its heartbeat, kept in memory; the
    /// stored `lastSeen` is refreshed less often).
    seen: Mutex<HashMap<ObjectKey, Timestamp>>,
    /// Records exporter online/offline events (posts them only with the Kubernetes store).
    events: EventRecorder,
}

impl ExporterCache {
    /// An empty, unsynced cache that reports transitions to `events`.
    pub fn new(events: EventRecorder) -> Self {
        Self {
            cached: Mutex::new(Cached::default()),
            synced: Notify::new(),
            feed_started: AtomicBool::new(false),
            feed_stop: watch::channel(()).0,
            seen: Mutex::new(HashMap::new()),
            events,
        }
    }

    /// Records that a Status stream saw the exporter now (kept in memory).
    pub fn touch(&self, namespace: &str, name: &str) {
        self.seen
            .lock_or_recover()
            .insert((namespace.to_string(), name.to_string()), Timestamp::now());
    }

    /// When a Status stream last saw the exporter, if one did since this controller started.
    pub fn seen_at(&self, namespace: &str, name: &str) -> Option<Timestamp> {
        self.seen
            .lock_or_recover()
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
    }

    /// Starts (once) the task that keeps the cache from `store`'s watch; it ends when the
    /// cache is dropped.
    pub fn start_feed<S: Store>(self: &Arc<Self>, store: &S) {
        if self.feed_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        let store = store.clone();
        let mut stop = self.feed_stop.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.changed() => {}
                _ = exporter_feed(weak, store) => {}
            }
        });
    }

    /// Whether the exporter cache is synced (waits up to `wait` for it).
    pub async fn synced(&self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.synced.notified();
            if self.cached.lock_or_recover().synced {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.cached.lock_or_recover().synced;
            }
        }
    }

    /// The changes of one exporter, starting with its cached state (the cache must be synced,
    /// see [`Self::synced`]).
    pub fn updates(&self, namespace: &str, name: &str) -> ExporterUpdates {
        let key = (namespace.to_string(), name.to_string());
        let mut cache = self.cached.lock_or_recover();
        let current = cache.objects.get(&key).cloned();
        cache
            .watchers
            .entry(key)
            .or_insert_with(|| watch::channel(current).0)
            .subscribe()
    }

    /// The exporter changes since the last call, or `None` when the cache is not synced.
    pub fn take_changes(&self, restart: bool) -> Option<ExporterChanges> {
        let mut cache = self.cached.lock_or_recover();
        if !cache.synced {
            return None;
        }
        if restart || cache.relisted {
            cache.relisted = false;
            cache.dirty.clear();
            return Some(ExporterChanges::All(
                cache.objects.values().map(|e| (**e).clone()).collect(),
            ));
        }
        let dirty = std::mem::take(&mut cache.dirty);
        Some(ExporterChanges::Some(
            dirty
                .into_iter()
                .map(|k| {
                    let e = cache.objects.get(&k).map(|e| (**e).clone());
                    (k, e)
                })
                .collect(),
        ))
    }

    fn apply(&self, ev: WatchEvent<Exporter>) {
        let mut cache = self.cached.lock_or_recover();
        let (key, value) = match ev {
            WatchEvent::Added(e) | WatchEvent::Modified(e) => (exporter_key(&e), Some(Arc::new(e))),
            WatchEvent::Deleted(e) => (exporter_key(&e), None),
        };
        let old = match &value {
            Some(e) => cache.objects.insert(key.clone(), e.clone()),
            None => {
                self.seen.lock_or_recover().remove(&key);
                cache.objects.remove(&key)
            }
        };
        // Every write of an exporter passes here once: the place to notice transitions.
        if let (Some(old), Some(new)) = (&old, &value) {
            self.events.exporter_changed(old, new);
        }
        cache.dirty.insert(key.clone());
        if let Some(tx) = cache.watchers.get(&key) {
            if tx.receiver_count() == 0 {
                cache.watchers.remove(&key);
            } else {
                tx.send_replace(value);
            }
        }
    }

    fn replace(&self, items: Vec<Exporter>) {
        let mut guard = self.cached.lock_or_recover();
        let cache = &mut *guard;
        let items: HashMap<ObjectKey, Arc<Exporter>> = items
            .into_iter()
            .map(|e| (exporter_key(&e), Arc::new(e)))
            .collect();
        // After a relist, transitions missed while the watch was down.
        for (key, new) in &items {
            if let Some(old) = cache.objects.get(key) {
                self.events.exporter_changed(old, new);
            }
        }
        cache.objects = items;
        cache.relisted = true;
        cache.synced = true;
        cache.dirty.clear();
        cache.watchers.retain(|k, tx| {
            if tx.receiver_count() == 0 {
                return false;
            }
            let now = cache.objects.get(k).cloned();
            tx.send_if_modified(|old| {
                let same = match (&*old, &now) {
                    (Some(a), Some(b)) => {
                        a.metadata.resource_version == b.metadata.resource_version
                    }
                    (None, None) => true,
                    _ => false,
                };
                if !same {
                    *old = now.clone();
                }
                !same
            });
            true
        });
        drop(guard);
        self.synced.notify_waiters();
    }
}

/// Lists the exporters, then follows the store's watch from that list, forever: the cache
/// and the per-exporter watchers see every change once. Ends when the cache is dropped.
async fn exporter_feed<S: Store>(cache: Weak<ExporterCache>, store: S) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let listed = store
            .list::<Exporter>(None, &LabelSelector::everything(), &ListParams::default())
            .await;
        let watch = match &listed {
            Ok(l) => {
                store
                    .watch::<Exporter>(None, Some(&l.resource_version))
                    .await
            }
            Err(_) => Err(StoreError::WatchLagged {
                kind: "Exporter".into(),
                reason: "list failed".into(),
            }),
        };
        let (listed, mut watch) = match (listed, watch) {
            (Ok(l), Ok(w)) => (l, w),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("exporter cache: {e}; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        match cache.upgrade() {
            Some(c) => c.replace(listed.items),
            None => return,
        }
        while let Some(ev) = watch.next().await {
            let Some(c) = cache.upgrade() else { return };
            match ev {
                Ok(ev) => c.apply(ev),
                Err(e) => {
                    tracing::debug!("exporter cache: {e}; listing again");
                    break;
                }
            }
        }
    }
}
