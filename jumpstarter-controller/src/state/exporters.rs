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
    kubernetes::events::EventRecorder,
    objects::{Exporter, ObjectKey, exporter_key, selector::LabelSelector},
    store::{ListParams, Store, StoreError, WatchEvent},
};
use jumpstarter_core::sync::LockExt;

/// How often the stored `lastSeen` refreshes the Status streams asked for are written: all
/// that are due, in one store call (group commit: with the embedded store one disk sync per
/// flush, not one per exporter; 10,000 exporters refreshing every 30 s would otherwise cost
/// 333 syncs a second).
pub const SEEN_FLUSH_EVERY: Duration = Duration::from_secs(1);

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
    /// Exporters whose stored `lastSeen` is due for a refresh (one entry per exporter, so
    /// bounded by the exporters in the store), written together every [`SEEN_FLUSH_EVERY`].
    seen_due: Mutex<HashSet<ObjectKey>>,
    seen_writer_started: AtomicBool,
    /// Records exporter online/offline events (posts them only with the Kubernetes store).
    events: EventRecorder,
    /// How many times the feed listed every exporter (once at start; again whenever it fell
    /// behind the store's watch).
    lists: std::sync::atomic::AtomicU64,
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
            seen_due: Mutex::new(HashSet::new()),
            seen_writer_started: AtomicBool::new(false),
            events,
            lists: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many times the feed listed every exporter: once when it started, and once more
    /// each time it fell behind the store's watch (for the metrics; more than one with a
    /// healthy store means the feed could not keep up).
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }

    /// Where the Kubernetes Events about exporters go (for the metrics).
    pub fn event_recorder(&self) -> &EventRecorder {
        &self.events
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

    /// Asks for the exporter's stored `lastSeen` to be set to the time of the next flush (within
    /// `SEEN_FLUSH_EVERY`), in one store write with every other exporter due then. Starts
    /// (once) the task that writes them; it ends when the cache is dropped.
    pub fn persist_seen<S: Store>(self: &Arc<Self>, store: &S, namespace: &str, name: &str) {
        self.seen_due
            .lock_or_recover()
            .insert((namespace.to_string(), name.to_string()));
        let store = store.clone();
        self.spawn_once(&self.seen_writer_started, |weak| seen_writer(weak, store));
    }

    /// Spawns the task `task` makes (given a weak handle to the cache) unless `started`
    /// says it runs already; it ends when the cache is dropped.
    fn spawn_once<F>(self: &Arc<Self>, started: &AtomicBool, task: impl FnOnce(Weak<Self>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if started.swap(true, Ordering::SeqCst) {
            return;
        }
        let task = task(Arc::downgrade(self));
        let mut stop = self.feed_stop.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.changed() => {}
                _ = task => {}
            }
        });
    }

    /// Takes the exporters due for a `lastSeen` refresh, each as cached (`None`: not cached).
    fn take_seen_due(&self) -> Vec<(ObjectKey, Option<Arc<Exporter>>)> {
        let due = std::mem::take(&mut *self.seen_due.lock_or_recover());
        let cache = self.cached.lock_or_recover();
        due.into_iter()
            .map(|k| {
                let e = cache.objects.get(&k).cloned();
                (k, e)
            })
            .collect()
    }

    /// Starts (once) the task that keeps the cache from `store`'s watch; it ends when the
    /// cache is dropped.
    pub fn start_feed<S: Store>(self: &Arc<Self>, store: &S) {
        let store = store.clone();
        self.spawn_once(&self.feed_started, |weak| exporter_feed(weak, store));
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

    /// The uid of exporter `namespace/name` as cached, when the cache is synced and holds it
    /// (`None` otherwise: ask the store). Authentication reads it here instead of loading
    /// and decoding the whole exporter from the store on every call, as upstream's
    /// controller reads its informer cache.
    pub fn cached_uid(&self, namespace: &str, name: &str) -> Option<String> {
        let cache = self.cached.lock_or_recover();
        if !cache.synced {
            return None;
        }
        let key = (namespace.to_string(), name.to_string());
        cache.objects.get(&key)?.metadata.uid.clone()
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
    let mut moved = 0;
    loop {
        let listed = store
            .list::<Exporter>(None, &LabelSelector::everything(), &ListParams::default())
            .await;
        match cache.upgrade() {
            Some(c) => c.lists.fetch_add(1, Ordering::Relaxed),
            None => return,
        };
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
            // More writes came while the list was read than the store keeps: list again at
            // once (a pause would only let more writes pass), a few times before warning.
            (Ok(_), Err(e @ StoreError::WatchLagged { .. })) if moved < MOVED_RETRIES => {
                moved += 1;
                tracing::debug!(
                    "exporter cache: {e}; listing again",
                    e = jumpstarter_core::error_chain(&e)
                );
                continue;
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(
                    "exporter cache: {e}; retrying",
                    e = jumpstarter_core::error_chain(&e)
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                moved = 0;
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        moved = 0;
        match cache.upgrade() {
            Some(c) => c.replace(listed.items),
            None => return,
        }
        let mut taken = 0usize;
        // Unconstrained: within tokio's cooperative budget the watch answers "not ready"
        // after 128 events although more are waiting, and the feed would wait its turn on the
        // runtime again for every 128 (a turn took a few hundred milliseconds while 10,000
        // exporters registered: see `sqlite::WATCH_HISTORY`).
        while let Some(ev) = tokio::task::unconstrained(watch.next()).await {
            let Some(c) = cache.upgrade() else { return };
            match ev {
                Ok(ev) => c.apply(ev),
                Err(e) => {
                    tracing::debug!(
                        "exporter cache: {e}; listing again",
                        e = jumpstarter_core::error_chain(&e)
                    );
                    break;
                }
            }
            // The other tasks' turn now and then, when events keep coming.
            taken += 1;
            if taken.is_multiple_of(FEED_YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// How many times in a row the exporter feed lists again at once when writes outran its list.
const MOVED_RETRIES: u32 = 3;

/// How many events the exporter feed applies before it lets other tasks run.
const FEED_YIELD_EVERY: usize = 256;

/// Every [`SEEN_FLUSH_EVERY`], writes the `lastSeen` of the exporters due with
/// `update_status_many` (in the calls of [`crate::store::in_batches`]); one whose write
/// conflicted (changed meanwhile) is due again at the next flush, one that was deleted is
/// dropped. Ends when the cache is dropped.
async fn seen_writer<S: Store>(cache: Weak<ExporterCache>, store: S) {
    let mut tick = tokio::time::interval(SEEN_FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let due = match cache.upgrade() {
            Some(c) => c.take_seen_due(),
            None => return,
        };
        if due.is_empty() {
            continue;
        }
        let now = Timestamp::now();
        let mut keys = Vec::with_capacity(due.len());
        let mut objects = Vec::with_capacity(due.len());
        for (key, cached) in due {
            let e = match cached {
                Some(e) => Some((*e).clone()),
                None => match store.get::<Exporter>(&key.0, &key.1).await {
                    Ok(e) => e,
                    Err(err) => {
                        tracing::warn!(
                            "exporter {}/{}: cannot read it: {err}",
                            key.0,
                            key.1,
                            err = jumpstarter_core::error_chain(&err)
                        );
                        None
                    }
                },
            };
            if let Some(mut e) = e {
                e.status.get_or_insert_with(Default::default).last_seen =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
                keys.push(key);
                objects.push(e);
            }
        }
        let written =
            crate::store::in_batches(&store, objects, |batch| store.update_status_many(batch))
                .await;
        let again: Vec<ObjectKey> = match written {
            Ok(results) => keys
                .into_iter()
                .zip(results)
                .filter_map(|(key, r)| match r {
                    Err(e) if e.is_conflict() => Some(key),
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(
                    "cannot store when exporters were last seen: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
                keys
            }
        };
        if !again.is_empty() {
            let Some(c) = cache.upgrade() else { return };
            c.seen_due.lock_or_recover().extend(again);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::objects::ExporterSpec;
    use crate::store::SqliteStore;

    /// A cache fed by an embedded store in a temporary directory, synced.
    async fn fed_cache() -> (tempfile::TempDir, SqliteStore, Arc<ExporterCache>) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let cache = Arc::new(ExporterCache::new(EventRecorder::disabled()));
        cache.start_feed(&store);
        assert!(cache.synced(Duration::from_secs(5)).await);
        (dir, store, cache)
    }

    /// The feed lists every exporter once when it starts, and once more when a write cuts it
    /// off (here: one call of more exporters than the store's watch buffer, which the
    /// controller's own bulk writers no longer make); the count is a metric.
    #[tokio::test]
    async fn the_feed_counts_its_lists_and_lists_again_when_cut_off() {
        use futures::TryStreamExt;
        let (_dir, store, cache) = fed_cache().await;
        assert_eq!(cache.lists(), 1);
        let n = store.watch_buffer() + 10;
        let created: Vec<Exporter> = futures::stream::iter(0..n)
            .map(|i| {
                let store = store.clone();
                async move {
                    let mut e = Exporter::new(&format!("board-{i}"), ExporterSpec::default());
                    e.metadata.namespace = Some("default".into());
                    store.create(&e).await
                }
            })
            .buffer_unordered(64)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(cache.lists(), 1, "the feed kept up with the creates");
        let seen: Vec<Exporter> = created
            .into_iter()
            .map(|mut e| {
                e.status.get_or_insert_with(Default::default).last_seen = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
                );
                e
            })
            .collect();
        // Written from another thread while this one (the feed's) is blocked: the feed cannot
        // take events while the write publishes them.
        let writer = store.clone();
        let written = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(writer.update_status_many(seen))
        })
        .join()
        .unwrap()
        .unwrap();
        assert!(written.iter().all(Result::is_ok));
        for _ in 0..500 {
            if cache.lists() == 2 && cache.cached_uid("default", "board-0").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(cache.lists(), 2, "cut off once, listed again once");
    }

    /// Issue 27: the `lastSeen` refreshes the Status streams ask for are written together,
    /// one store commit (one disk sync) for many exporters, not one each.
    #[tokio::test]
    async fn last_seen_refreshes_of_many_exporters_share_one_store_commit() {
        let (_dir, store, cache) = fed_cache().await;
        let n = 50;
        for i in 0..n {
            let mut e = Exporter::new(&format!("board-{i}"), ExporterSpec::default());
            e.metadata.namespace = Some("default".into());
            store.create(&e).await.unwrap();
        }
        let before = store.commits().unwrap();
        // A stored time has whole seconds (`metav1.Time`): the refresh asked for now is
        // stored as this second or a later one.
        let asked = Timestamp::from_second(Timestamp::now().as_second()).unwrap();
        for i in 0..n {
            cache.persist_seen(&store, "default", &format!("board-{i}"));
        }
        let mut stored_all = false;
        for _ in 0..100 {
            let list = store
                .list::<Exporter>(None, &LabelSelector::everything(), &ListParams::default())
                .await
                .unwrap();
            stored_all = list.items.len() == n
                && list.items.iter().all(|e| {
                    e.status
                        .as_ref()
                        .and_then(|s| s.last_seen.as_ref())
                        .is_some_and(|t| t.0 >= asked)
                });
            if stored_all {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(stored_all, "every exporter's lastSeen is stored");
        let commits = store.commits().unwrap() - before;
        assert!(
            (1..=2).contains(&commits),
            "{commits} store commits for {n} lastSeen refreshes"
        );
    }
}
