//! The embedded backend: one SQLite file (`store.db`) in the controller's data directory.
//!
//! - Objects are JSON rows keyed by (kind, namespace, name), with their `resource_version`
//!   in a column; a one-row `meta` table holds the store-wide revision counter.
//! - Durability: WAL journal with `synchronous=FULL`, so a write is fsynced to the WAL before
//!   `commit` returns: once a call returned `Ok`, the object survives `kill -9` and power loss.
//! - Concurrency: one writer thread owning the writer connection, and three reader threads
//!   with a connection each (`READERS`; WAL lets reads proceed during a write and beside each
//!   other), sharing one bounded queue of reads. Writes queue for the writer thread (a bounded queue: callers wait
//!   asynchronously when it is full), which publishes each transaction's watch events before
//!   it takes the next, so events come in revision order.
//! - Group commit: the writes queued together share one transaction (each in a savepoint of
//!   its own, failing alone): one WAL sync for the group instead of one per write (see
//!   `write_loop`).
//! - Schema: `PRAGMA user_version` ([`SCHEMA_VERSION`]); a newer file is refused, not guessed at.

use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::{
    Because, BoxError, ListParams, ObjectList, Store, StoreError, StoreObject, WATCH_BUFFER,
    WatchEvent, WatchStream,
};
use crate::objects::selector::LabelSelector;
use jumpstarter_core::sync::LockExt;

mod typed;
use typed::{Merge, Ops};

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "store.db";
/// The schema version this code reads and writes.
pub const SCHEMA_VERSION: i64 = 1;

/// The SQLite-backed [`Store`]; cloning gives another handle to the same database.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
    threads: Arc<StoreThreads>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

struct Inner {
    path: PathBuf,
    hub: Mutex<EventHub>,
    /// Transactions that changed something, committed by the writer thread (one WAL sync
    /// each; one that wrote nothing is not counted).
    commits: AtomicU64,
    /// The latest revision handed out (see [`Inner::next_revision`]).
    revision: AtomicU64,
    /// Whether status and metadata writes of the typed kinds go through the value merge too
    /// (the tests run the store's suite both ways).
    value_merge_only: bool,
    /// The writer's last writes of typed kinds, decoded (only the writer thread uses it).
    written: Mutex<Written>,
}

/// The objects of typed kinds as the writer last wrote them, by key, with their revision: a
/// status write of one whose stored revision is still that one starts from a copy instead of
/// decoding the stored text (a third of a typed write's instructions). An entry whose
/// revision is not the stored one (its transaction was rolled back) is not used, so nothing
/// needs to be forgotten when a write fails.
#[derive(Default)]
struct Written {
    objects: HashMap<(String, String, String), (u64, Decoded)>,
}

/// An object as the writer decoded it (shared with its watch event).
type Decoded = Arc<dyn std::any::Any + Send + Sync>;

/// The most objects [`Written`] keeps; when full it starts over. 4,096 objects of a few KiB
/// each (1,000 leases granted at once on 1,000 exporters write 2,000 objects).
const WRITTEN_MAX: usize = 4096;

impl Written {
    fn key(t: &Target) -> (String, String, String) {
        (t.kind.clone(), t.namespace.clone(), t.name.clone())
    }

    /// The object `t` as written at `revision`, if that was the last write of it here.
    fn get(&self, t: &Target, revision: u64) -> Option<Decoded> {
        match self.objects.get(&Self::key(t)) {
            Some((at, object)) if *at == revision => Some(object.clone()),
            _ => None,
        }
    }

    fn put(&mut self, t: &Target, revision: u64, object: Decoded) {
        if self.objects.len() >= WRITTEN_MAX {
            self.objects.clear();
        }
        self.objects.insert(Self::key(t), (revision, object));
    }

    fn forget(&mut self, t: &Target) {
        self.objects.remove(&Self::key(t));
    }
}

/// The most writes one transaction takes before it is committed even with more queued (so
/// that a steady stream of writes still commits and publishes in bounded time).
const MAX_GROUP: usize = 128;

/// How many writes may wait for the writer thread; beyond it, callers wait (asynchronously)
/// for room.
const WRITE_QUEUE: usize = 1024;

/// A write for the writer thread. It is called with the writer (store and connection, inside
/// a savepoint of the group's transaction), or with the reason no transaction could be
/// opened; it answers its caller itself when it fails, else leaves that to [`Ran::done`].
type Job = Box<dyn FnOnce(Result<(&Inner, &Connection), &str>) -> Ran + Send>;

/// Tells a write's caller how its transaction ended.
type Done = Box<dyn FnOnce(Result<(), String>) + Send>;

/// What a [`Job`] left behind.
struct Ran {
    /// Its watch events (kind, event), published once the group is committed.
    events: Vec<(String, RawEvent)>,
    /// `None`: the write failed, is undone, and its caller has the error already.
    done: Option<Done>,
}

/// The writes of the open transaction, waiting for its commit.
#[derive(Default)]
struct Group {
    events: Vec<(String, RawEvent)>,
    members: Vec<Done>,
    /// The transaction was rolled back whole (an undo failed): its members are told.
    aborted: bool,
}

/// The queues to the writer and reader threads. Dropping the last handle closes them and
/// waits for the threads to finish the work already queued, so that the database is closed
/// when the store is gone (tests reopen and damage the file right after).
struct StoreThreads {
    writes: Option<mpsc::Sender<Job>>,
    reads: Option<mpsc::Sender<ReadJob>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for StoreThreads {
    fn drop(&mut self) {
        self.writes = None;
        self.reads = None;
        let me = std::thread::current().id();
        for thread in self.threads.drain(..) {
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}

/// How a write's caller learns that it failed.
enum Failed {
    Store(StoreError),
    /// A database failure outside the write itself (opening or committing its transaction).
    Db(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

/// A committed change, shared by all watchers of its kind.
struct RawEvent {
    event_type: EventType,
    namespace: String,
    name: String,
    revision: u64,
    /// The object as the writer decoded it: a watcher of its type takes a copy of it instead
    /// of decoding `body` (a JSON parse per event and watcher was a tenth of the controller's
    /// CPU while 1,000 leases were granted, and made the exporter feed the slowest step
    /// between a grant and its Status message).
    object: Arc<dyn std::any::Any + Send + Sync>,
    /// The stored JSON, for a watcher of another type of the same kind.
    body: String,
}

impl std::fmt::Debug for RawEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawEvent")
            .field("event_type", &self.event_type)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("revision", &self.revision)
            .field("body", &self.body)
            .finish_non_exhaustive()
    }
}

/// The events of a kind a watcher may fall behind, and the history kept of each kind: eight
/// times the least a store keeps. The exporter cache is fed by a task that waits its turn on
/// the runtime like every other; while 10,000 exporters registered, thousands of tasks woken
/// by store answers were ahead of it (a few hundred milliseconds, at 7,000 exporter writes a
/// second), so with [`WATCH_BUFFER`] it fell behind, listed all 10,000 exporters again, fell
/// behind during that list, and so on for seconds. The cost is memory: a full history holds
/// 8,192 events of each kind written (an exporter's JSON is about 760 bytes in the scale
/// benchmark, and the decoded object is kept beside it); with 10,000 exporters the idle RSS
/// stayed within the run-to-run spread (328–393 MiB, against 336–437 MiB before).
pub const WATCH_HISTORY: usize = 8 * WATCH_BUFFER;

struct KindChannel {
    sender: broadcast::Sender<Arc<RawEvent>>,
    /// The latest events of this kind, oldest first.
    recent: VecDeque<Arc<RawEvent>>,
    /// Every event of this kind with a revision above this one is in `recent`.
    floor: u64,
}

struct EventHub {
    kinds: HashMap<String, KindChannel>,
    /// The store revision when it was opened: no history before it is kept.
    opened_at: u64,
}

impl EventHub {
    fn channel(&mut self, kind: &str) -> &mut KindChannel {
        let opened_at = self.opened_at;
        self.kinds
            .entry(kind.to_owned())
            .or_insert_with(|| KindChannel {
                sender: broadcast::channel(WATCH_HISTORY).0,
                recent: VecDeque::new(),
                floor: opened_at,
            })
    }

    fn publish(&mut self, kind: &str, event: RawEvent) {
        let channel = self.channel(kind);
        let event = Arc::new(event);
        if channel.recent.len() == WATCH_HISTORY
            && let Some(old) = channel.recent.pop_front()
        {
            channel.floor = old.revision;
        }
        channel.recent.push_back(event.clone());
        // No receivers is fine: nobody watches this kind right now.
        let _ = channel.sender.send(event);
    }
}

/// Identifies the object an operation is about, for error messages.
#[derive(Debug, Clone)]
struct Target {
    kind: String,
    namespace: String,
    name: String,
}

impl Target {
    fn invalid(&self, source: impl Into<BoxError>) -> StoreError {
        StoreError::Invalid {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: source.into(),
        }
    }

    fn corrupt(&self, source: impl Into<BoxError>) -> StoreError {
        StoreError::Corrupt {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: source.into(),
        }
    }

    /// The event of a change to this object at `revision`, its body now `body`.
    fn event<K: StoreObject>(
        &self,
        event_type: EventType,
        revision: u64,
        object: &K,
        body: String,
    ) -> RawEvent {
        RawEvent {
            event_type,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            revision,
            object: Arc::new(object.clone()),
            body,
        }
    }

    fn not_found(&self) -> StoreError {
        StoreError::NotFound {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    fn conflict(&self, given: &str, current: u64) -> StoreError {
        StoreError::Conflict {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            given: given.to_owned(),
            current: current.to_string(),
        }
    }

    fn decode<K: StoreObject>(&self, body: &str) -> Result<K, StoreError> {
        serde_json::from_str(body).map_err(|e| self.corrupt(e))
    }
}

fn kind_of<K: StoreObject>() -> String {
    K::kind(&()).into_owned()
}

/// DNS-1123 label (namespaces): 1–63 of `[a-z0-9-]`, alphanumeric at both ends.
fn valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// DNS-1123 subdomain (object names): 1–253, dot-separated labels.
fn valid_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(valid_label)
}

/// What is wrong with an object's key by the rule every create and update applies (the
/// namespace a DNS-1123 label, the name a DNS-1123 subdomain), naming the field; `None` when
/// it is fine. A restore holds a backup's rows to it too.
pub(crate) fn key_problem(namespace: &str, name: &str) -> Option<&'static str> {
    if !valid_label(namespace) {
        return Some(
            "metadata.namespace must be a DNS-1123 label (lowercase letters, digits, '-', at most 63)",
        );
    }
    if !valid_subdomain(name) {
        return Some(
            "metadata.name must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.', at most 253)",
        );
    }
    None
}

fn check_key(t: &Target) -> Result<(), StoreError> {
    match key_problem(&t.namespace, &t.name) {
        Some(problem) => Err(t.invalid(problem)),
        None => Ok(()),
    }
}

/// The target of an object passed in by a caller.
fn target_of<K: StoreObject>(object: &K) -> Target {
    let meta = object.meta();
    Target {
        kind: kind_of::<K>(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// `generateName` + 5 characters from Kubernetes' alphabet (no vowels, no look-alikes).
fn generated_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let random = uuid::Uuid::new_v4();
    let suffix: String = random.as_bytes()[..5]
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    format!("{prefix}{suffix}")
}

fn metadata_mut<'a>(
    t: &Target,
    v: &'a mut Value,
) -> Result<&'a mut serde_json::Map<String, Value>, StoreError> {
    v.get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| t.invalid("object has no metadata"))
}

/// `v` without `metadata` and `status`: what a change of bumps `generation`.
fn spec_part(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "metadata" && k.as_str() != "status")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What an update needs before the transaction: the target and the given `resourceVersion`.
fn prepare_replace<K: StoreObject>(object: &K) -> Result<(Target, String), StoreError> {
    let t = target_of(object);
    check_key(&t)?;
    let given_rv = object
        .meta()
        .resource_version
        .clone()
        .filter(|rv| !rv.is_empty())
        .ok_or_else(|| t.invalid("metadata.resourceVersion must be set for an update"))?;
    Ok((t, given_rv))
}

/// How a replace through `serde_json::Value` turns the stored value into the new one, given
/// the caller's: in place, returning whether anything changed (nothing changed: nothing is
/// written). In place and with that answer, a replace neither copies the stored object nor
/// compares it whole.
fn merge_value(
    merge: Merge,
    t: &Target,
    stored: &mut Value,
    given: Value,
) -> Result<bool, StoreError> {
    match merge {
        Merge::Update => merge_update(t, stored, given),
        Merge::Status => merge_status(t, stored, given),
        Merge::Metadata => merge_metadata(t, stored, given),
        Merge::StatusAndMetadata => merge_status_and_metadata(t, stored, given),
        Merge::Keep => Ok(false),
    }
}

/// Sets `key` of `map` to `value` (removes it for `None`); whether that changed it.
fn set_if_changed(
    map: &mut serde_json::Map<String, Value>,
    key: &str,
    value: Option<Value>,
) -> bool {
    if map.get(key) == value.as_ref() {
        return false;
    }
    set_or_remove(map, key, value);
    true
}

/// `update_status`'s merge: the stored object with the given status.
fn merge_status(t: &Target, stored: &mut Value, mut given: Value) -> Result<bool, StoreError> {
    let status = given
        .as_object_mut()
        .and_then(|map| map.remove("status"))
        .filter(|s| !s.is_null());
    match stored {
        Value::Object(map) => Ok(set_if_changed(map, "status", status)),
        _ => Err(t.corrupt("stored object is not a JSON object")),
    }
}

/// `update`'s merge: the given object with the stored status and server-owned metadata;
/// `generation` moves on when the spec changed.
fn merge_update(t: &Target, stored: &mut Value, mut given: Value) -> Result<bool, StoreError> {
    let stored_meta = stored.get("metadata").cloned().unwrap_or(Value::Null);
    let spec_changed = spec_part(stored) != spec_part(&given);
    let meta = metadata_mut(t, &mut given)?;
    // Server-owned fields come from the stored object, whatever the caller sent.
    for key in ["uid", "creationTimestamp", "resourceVersion", "generation"] {
        set_or_remove(meta, key, stored_meta.get(key).cloned());
    }
    if spec_changed {
        let generation = stored_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta.insert("generation".into(), Value::from(generation + 1));
    }
    if let Value::Object(map) = &mut given {
        set_or_remove(map, "status", stored.get("status").cloned());
    }
    if given == *stored {
        return Ok(false);
    }
    *stored = given;
    Ok(true)
}

/// `update_status_and_metadata_many`'s merge of the metadata part: the stored object with
/// the given metadata fields of [`crate::store::copy_written_metadata`] (the spec, and so
/// `generation`, untouched).
fn merge_metadata(t: &Target, stored: &mut Value, given: Value) -> Result<bool, StoreError> {
    copy_metadata_fields(t, stored, &given)
}

fn copy_metadata_fields(t: &Target, into: &mut Value, given: &Value) -> Result<bool, StoreError> {
    let meta = metadata_mut(t, into)?;
    let mut changed = false;
    for key in super::WRITTEN_METADATA {
        let value = given
            .get("metadata")
            .and_then(|m| m.get(key))
            .filter(|v| !v.is_null())
            .cloned();
        changed |= set_if_changed(meta, key, value);
    }
    Ok(changed)
}

/// `update_status_and_metadata_many`'s merge of both parts.
fn merge_status_and_metadata(
    t: &Target,
    stored: &mut Value,
    given: Value,
) -> Result<bool, StoreError> {
    let metadata = copy_metadata_fields(t, stored, &given)?;
    let status = merge_status(t, stored, given)?;
    Ok(metadata || status)
}

fn set_or_remove(map: &mut serde_json::Map<String, Value>, key: &str, value: Option<Value>) {
    match value {
        Some(v) => {
            map.insert(key.to_owned(), v);
        }
        None => {
            map.remove(key);
        }
    }
}

/// Runs one statement without parameters, prepared once per connection (the writer runs
/// `SAVEPOINT`/`RELEASE` around every write: parsing them each time showed in profiles).
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Reader threads, each with a connection of its own. With one connection, reads queued on
/// its lock; with a blocking task per read, 1,000 leases granted at once spawned and woke
/// threads for a tenth of the controller's CPU.
const READERS: usize = 3;

/// How many reads may wait for a reader thread; beyond it, callers wait (asynchronously).
const READ_QUEUE: usize = 1024;

/// A read for a reader thread (it answers its caller itself).
type ReadJob = Box<dyn FnOnce(&Inner, &mut Connection) + Send>;

/// A reader thread: takes the next queued read (the reader threads share one queue) and runs
/// it on its own connection. Ends when every store handle is gone.
fn read_loop(inner: Arc<Inner>, mut conn: Connection, jobs: Arc<Mutex<mpsc::Receiver<ReadJob>>>) {
    loop {
        // Waiting for a job while holding the queue: the other readers wait for the queue.
        let job = jobs.lock_or_recover().blocking_recv();
        let Some(job) = job else { return };
        // A read that panics answers nothing (its caller gets an error); the thread goes on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&inner, &mut conn)));
    }
}

impl Inner {
    fn db_err(&self, e: impl Into<BoxError>) -> StoreError {
        StoreError::Database {
            path: self.path.display().to_string(),
            source: e.into(),
        }
    }

    /// Runs one queued write in a savepoint of the group's open transaction: kept when it
    /// succeeds, undone when it fails or panics (the others of the group stay).
    fn run_write(&self, conn: &Connection, job: Job, group: &mut Group) {
        if let Err(e) = exec(conn, "SAVEPOINT write") {
            let reason = jumpstarter_core::error_chain(&e);
            let _ = job(Err(&reason));
            return;
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Ok((self, conn)))));
        match ran {
            // The panicked write's caller is told by its dropped answer channel.
            Err(_) => self.undo_write(conn, group),
            Ok(Ran { done: None, .. }) => self.undo_write(conn, group),
            Ok(Ran {
                events,
                done: Some(done),
            }) => match exec(conn, "RELEASE write") {
                Ok(()) => {
                    group.events.extend(events);
                    group.members.push(done);
                }
                Err(e) => {
                    self.undo_write(conn, group);
                    done(Err(jumpstarter_core::error_chain(&e)));
                }
            },
        }
    }

    /// Undoes the write in savepoint `write` only; the group's others stay. When even that
    /// fails the transaction is rolled back, failing the whole group.
    fn undo_write(&self, conn: &Connection, group: &mut Group) {
        if let Err(undo) = conn.execute_batch("ROLLBACK TO write; RELEASE write") {
            let _ = conn.execute_batch("ROLLBACK");
            group.aborted = true;
            group.events.clear();
            for done in group.members.drain(..) {
                done(Err(undo.to_string()));
            }
        }
    }

    /// Commits the open transaction (rolls it back when it holds no write), publishes its
    /// events and tells its members.
    fn end_group(&self, conn: &Connection, group: Group) {
        if group.aborted {
            return;
        }
        let ended = if group.members.is_empty() {
            exec(conn, "ROLLBACK")
        } else {
            // The store revision is written once per transaction, not by each write: updating
            // the `meta` row in every write's savepoint copied its page into the savepoint's
            // journal each time (a tenth of the writer's time with 1,000 grants at once).
            let revision = i64::try_from(self.revision.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
            conn.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'revision'")
                .and_then(|mut stmt| stmt.execute([revision]))
                .and_then(|_| exec(conn, "COMMIT"))
        };
        let outcome = match ended {
            Ok(()) => Ok(()),
            Err(e) => {
                // A failed COMMIT may leave the transaction open: end it.
                let _ = conn.execute_batch("ROLLBACK");
                Err(jumpstarter_core::error_chain(&e))
            }
        };
        if outcome.is_ok() && !group.events.is_empty() {
            self.commits.fetch_add(1, Ordering::Relaxed);
            let mut hub = self.hub.lock_or_recover();
            for (kind, event) in group.events {
                hub.publish(&kind, event);
            }
        }
        for done in group.members {
            done(outcome.clone());
        }
    }

    /// The revision of the next change (only the writer thread takes them). The counter is
    /// stored once per transaction, by [`Inner::end_group`]: a write that fails or a group
    /// that is rolled back leaves a gap, which nobody reads anything into.
    fn next_revision(&self) -> u64 {
        self.revision.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn read_row(&self, conn: &Connection, t: &Target) -> Result<Option<(u64, String)>, StoreError> {
        conn.prepare_cached(
            "SELECT resource_version, body FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![t.kind, t.namespace, t.name], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .optional()
        })
        .map_err(|e| self.db_err(e))?
        .map(|(rv, body)| {
            u64::try_from(rv)
                .map(|rv| (rv, body))
                .map_err(|_| t.corrupt(format!("negative resource_version {rv}")))
        })
        .transpose()
    }

    fn write_row(
        &self,
        tx: &Connection,
        t: &Target,
        revision: u64,
        body: &str,
    ) -> Result<(), StoreError> {
        let rv = i64::try_from(revision).map_err(|_| self.db_err("revision overflow"))?;
        tx.prepare_cached(
            "INSERT INTO objects (kind, namespace, name, resource_version, body) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (kind, namespace, name) DO UPDATE SET resource_version = excluded.resource_version, body = excluded.body",
        )
        .and_then(|mut stmt| stmt.execute(params![t.kind, t.namespace, t.name, rv, body]))
        .map_err(|e| self.db_err(e))?;
        Ok(())
    }

    fn get<K: StoreObject>(&self, conn: &Connection, t: &Target) -> Result<Option<K>, StoreError> {
        match self.read_row(conn, t)? {
            Some((_, body)) => t.decode(&body).map(Some),
            None => Ok(None),
        }
    }

    /// The write of a create, on the writer (`t` checked, the name generated).
    fn create_in<K: StoreObject>(
        &self,
        tx: &Connection,
        t: &Target,
        mut object: K,
    ) -> Result<(K, Vec<RawEvent>), StoreError> {
        if self.read_row(tx, t)?.is_some() {
            return Err(StoreError::AlreadyExists {
                kind: t.kind.clone(),
                namespace: t.namespace.clone(),
                name: t.name.clone(),
            });
        }
        let revision = self.next_revision();
        let meta = object.meta_mut();
        meta.uid = Some(uuid::Uuid::new_v4().to_string());
        meta.resource_version = Some(revision.to_string());
        meta.creation_timestamp = Some(Time(Timestamp::now()));
        meta.generation = Some(1);
        // Status is written through update_status only (status subresource).
        let ops = self.typed::<K>();
        let typed = ops.is_some();
        let (body, stored) = match ops {
            Some(ops) => {
                ops.clear_status(&mut object);
                let body = serde_json::to_string(&object)
                    .map_err(|e| t.invalid(Because::boxed("cannot serialize", e)))?;
                // Decoded from its text: as a later read returns it.
                let stored: K = t.decode(&body)?;
                (body, stored)
            }
            None => {
                let mut value = serde_json::to_value(&object)
                    .map_err(|e| t.invalid(Because::boxed("cannot serialize", e)))?;
                if let Value::Object(map) = &mut value {
                    map.remove("status");
                }
                let body = value.to_string();
                let stored: K = serde_json::from_value(value).map_err(|e| t.corrupt(e))?;
                (body, stored)
            }
        };
        self.write_row(tx, t, revision, &body)?;
        let event = t.event(EventType::Added, revision, &stored, body);
        if typed {
            self.written
                .lock_or_recover()
                .put(t, revision, event.object.clone());
        }
        Ok((stored, vec![event]))
    }

    /// The typed operations of `K`, when its status and metadata writes and its creates are
    /// done on the typed object (see the `typed` module).
    fn typed<K: StoreObject>(&self) -> Option<Ops<K>> {
        if self.value_merge_only {
            return None;
        }
        Ops::of()
    }

    /// The write of an update or update_status, on the writer: `merge` of the stored object
    /// and `given` is the new one.
    fn replace_in<K: StoreObject>(
        &self,
        tx: &Connection,
        t: &Target,
        given_rv: &str,
        given: K,
        merge: Merge,
    ) -> Result<(K, Option<RawEvent>), StoreError> {
        let (current_rv, body) = self.read_row(tx, t)?.ok_or_else(|| t.not_found())?;
        if given_rv != current_rv.to_string() {
            return Err(t.conflict(given_rv, current_rv));
        }
        if merge != Merge::Update
            && let Some(ops) = self.typed::<K>()
        {
            return self.replace_typed(tx, t, current_rv, &body, given, merge, &ops);
        }
        let given = serde_json::to_value(&given)
            .map_err(|e| t.invalid(Because::boxed("cannot serialize", e)))?;
        let mut next: Value = serde_json::from_str(&body).map_err(|e| t.corrupt(e))?;
        if !merge_value(merge, t, &mut next, given)? {
            // Nothing changed: no write, no event, same resourceVersion (as Kubernetes).
            let object = serde_json::from_value(next).map_err(|e| t.corrupt(e))?;
            return Ok((object, None));
        }
        let (revision, body, result) = self.stamp::<K>(t, next)?;
        // The write comes last: a replace that fails for any other reason than the database
        // has changed nothing (which `replace_many_in` relies on).
        self.write_row(tx, t, revision, &body)?;
        let event = t.event(EventType::Modified, revision, &result, body);
        Ok((result, Some(event)))
    }

    /// [`Inner::replace_in`] on the typed object (`body` is the stored text): the stored
    /// object decoded, `merge`'s parts of `given` taken, the result encoded and decoded back
    /// (the answer as a later read returns it).
    #[allow(clippy::too_many_arguments)]
    fn replace_typed<K: StoreObject>(
        &self,
        tx: &Connection,
        t: &Target,
        current_rv: u64,
        body: &str,
        given: K,
        merge: Merge,
        ops: &Ops<K>,
    ) -> Result<(K, Option<RawEvent>), StoreError> {
        let copy = self.written.lock_or_recover().get(t, current_rv);
        let decoded: K;
        let stored: &K = match copy.as_deref().and_then(|c| c.downcast_ref::<K>()) {
            Some(stored) => stored,
            None => {
                decoded = t.decode(body)?;
                &decoded
            }
        };
        let mut next = stored.clone();
        if !ops.take_parts(&mut next, given, merge) {
            // Nothing changed: no write, no event, same resourceVersion (as Kubernetes).
            return Ok((next, None));
        }
        let revision = self.next_revision();
        next.meta_mut().resource_version = Some(revision.to_string());
        let body = serde_json::to_string(&next)
            .map_err(|e| t.invalid(Because::boxed("cannot serialize", e)))?;
        let mut result: K = t.decode(&body)?;
        // Different only in what the JSON form drops (times finer than a second): nothing
        // changed either. The revision taken is left unused, a gap nobody reads anything into.
        result
            .meta_mut()
            .resource_version
            .clone_from(&stored.meta().resource_version);
        if ops.same(&result, stored) {
            return Ok((stored.clone(), None));
        }
        result.meta_mut().resource_version = Some(revision.to_string());
        // The write comes last, as in `replace_in`.
        self.write_row(tx, t, revision, &body)?;
        let event = t.event(EventType::Modified, revision, &result, body);
        self.written
            .lock_or_recover()
            .put(t, revision, event.object.clone());
        Ok((result, Some(event)))
    }

    /// [`Inner::replace_in`] of many objects in one write: each object succeeds or fails on
    /// its own, as if written alone; a database failure fails all. No savepoint per object is
    /// needed (two statements each, a twentieth of the controller's CPU while 1,000 leases
    /// were granted): a replace that fails short of the database has written nothing.
    #[allow(clippy::type_complexity)]
    fn replace_many_in<K: StoreObject>(
        &self,
        conn: &Connection,
        objects: Vec<(K, Merge)>,
    ) -> Result<(Vec<Result<K, StoreError>>, Vec<RawEvent>), StoreError> {
        let mut results = Vec::with_capacity(objects.len());
        let mut events = Vec::new();
        for (object, merge) in objects {
            let (t, given_rv) = match prepare_replace(&object) {
                Ok(p) => p,
                Err(e) => {
                    results.push(Err(e));
                    continue;
                }
            };
            match self.replace_in::<K>(conn, &t, &given_rv, object, merge) {
                Ok((stored, event)) => {
                    results.push(Ok(stored));
                    events.extend(event);
                }
                Err(e @ StoreError::Database { .. }) => return Err(e),
                Err(e) => results.push(Err(e)),
            }
        }
        Ok((results, events))
    }

    /// Gives `value` (object `t`) the next revision as its resourceVersion; returns that
    /// revision, the body to store and the object it decodes to (from the value itself, which
    /// moves its strings instead of parsing the body again).
    fn stamp<K: StoreObject>(
        &self,
        t: &Target,
        mut value: Value,
    ) -> Result<(u64, String, K), StoreError> {
        let revision = self.next_revision();
        metadata_mut(t, &mut value)?.insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
        let body = value.to_string();
        let object: K = serde_json::from_value(value).map_err(|e| t.corrupt(e))?;
        Ok((revision, body, object))
    }

    /// The write of a delete, on the writer.
    fn delete_in<K: StoreObject>(
        &self,
        tx: &Connection,
        t: &Target,
        precondition: Option<&str>,
    ) -> Result<(K, Vec<RawEvent>), StoreError> {
        let (current_rv, body) = self.read_row(tx, t)?.ok_or_else(|| t.not_found())?;
        if let Some(given) = precondition
            && given != current_rv.to_string()
        {
            return Err(t.conflict(given, current_rv));
        }
        let value: Value = serde_json::from_str(&body).map_err(|e| t.corrupt(e))?;
        tx.prepare_cached("DELETE FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3")
            .and_then(|mut stmt| stmt.execute(params![t.kind, t.namespace, t.name]))
            .map_err(|e| self.db_err(e))?;
        self.written.lock_or_recover().forget(t);
        let (revision, body, last) = self.stamp::<K>(t, value)?;
        let event = t.event(EventType::Deleted, revision, &last, body);
        Ok((last, vec![event]))
    }

    fn list<K: StoreObject>(
        &self,
        conn: &mut Connection,
        namespace: Option<&str>,
        selector: &LabelSelector,
        params: &ListParams,
    ) -> Result<ObjectList<K>, StoreError> {
        let kind = kind_of::<K>();
        let list_target = Target {
            kind: kind.clone(),
            namespace: namespace.unwrap_or("*").to_owned(),
            name: "*".into(),
        };
        let (after_ns, after_name) = match params.continue_token.as_deref() {
            None | Some("") => (String::new(), String::new()),
            Some(token) => match token.split_once('/') {
                Some((ns, name)) if !name.is_empty() => (ns.to_owned(), name.to_owned()),
                _ => {
                    return Err(list_target.invalid(format!("invalid continue token {token:?}")));
                }
            },
        };
        let limit = params.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        // One read transaction: the revision and the rows come from the same snapshot.
        let tx = conn.transaction().map_err(|e| self.db_err(e))?;
        let revision: i64 = tx
            .prepare_cached("SELECT value FROM meta WHERE key = 'revision'")
            .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
            .map_err(|e| self.db_err(e))?;
        let mut stmt = tx
            .prepare_cached(
                "SELECT namespace, name, body FROM objects
                 WHERE kind = ?1 AND (?2 IS NULL OR namespace = ?2) AND (namespace, name) > (?3, ?4)
                 ORDER BY namespace, name",
            )
            .map_err(|e| self.db_err(e))?;
        let mut rows = stmt
            .query(params![kind, namespace, after_ns, after_name])
            .map_err(|e| self.db_err(e))?;
        let mut items = Vec::new();
        let mut last_key = None;
        let mut continue_token = None;
        let empty = std::collections::BTreeMap::new();
        while let Some(row) = rows.next().map_err(|e| self.db_err(e))? {
            let ns: String = row.get(0).map_err(|e| self.db_err(e))?;
            let name: String = row.get(1).map_err(|e| self.db_err(e))?;
            let body: String = row.get(2).map_err(|e| self.db_err(e))?;
            let t = Target {
                kind: kind.clone(),
                namespace: ns.clone(),
                name: name.clone(),
            };
            let object: K = t.decode(&body)?;
            if !selector.matches(object.meta().labels.as_ref().unwrap_or(&empty)) {
                continue;
            }
            if items.len() == limit {
                // A further match exists: hand out a cursor after the last returned item.
                continue_token = last_key.take();
                break;
            }
            items.push(object);
            last_key = Some(format!("{ns}/{name}"));
        }
        Ok(ObjectList {
            items,
            resource_version: revision.to_string(),
            continue_token,
        })
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `data_dir` (the file [`DB_FILE`]).
    pub async fn open(data_dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = data_dir.into();
        let shown = dir.display().to_string();
        tokio::task::spawn_blocking(move || Self::open_blocking(&dir))
            .await
            .map_err(|e| StoreError::Database {
                path: shown,
                source: Because::boxed("open task failed", e),
            })?
    }

    /// [`SqliteStore::open`] for synchronous callers (not on an async runtime thread).
    pub fn open_blocking(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_as(data_dir, false)
    }

    /// [`SqliteStore::open`] with every status and metadata write and every create going
    /// through `serde_json::Value`, as for kinds that are not typed: the store's suite runs
    /// this way too.
    #[cfg(test)]
    pub(crate) async fn open_with_value_merge(data_dir: &Path) -> Result<Self, StoreError> {
        let dir = data_dir.to_owned();
        tokio::task::spawn_blocking(move || Self::open_as(&dir, true))
            .await
            .map_err(|e| StoreError::Database {
                path: data_dir.display().to_string(),
                source: Because::boxed("open task failed", e),
            })?
    }

    fn open_as(data_dir: &Path, value_merge_only: bool) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_FILE);
        let err = |source: BoxError| StoreError::Database {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(|e| {
            err(Because::boxed(
                format!("cannot create {}", data_dir.display()),
                e,
            ))
        })?;
        let mut writer = Connection::open(&path).map_err(|e| err(e.into()))?;
        writer
            .busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| err(e.into()))?;
        let mode: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(|e| err(e.into()))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(err(
                format!("cannot switch to WAL journal (got {mode})").into()
            ));
        }
        // temp_store: the journals of the writes' savepoints are kept in memory, not in a
        // temporary file (its writes showed in profiles with 1,000 grants at once).
        writer
            .execute_batch("PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY;")
            .map_err(|e| err(e.into()))?;
        check_integrity(&writer).map_err(|e| err(e.into()))?;
        migrate(&mut writer).map_err(err)?;
        let revision: i64 = writer
            .query_row("SELECT value FROM meta WHERE key = 'revision'", [], |row| {
                row.get(0)
            })
            .map_err(|e| err(e.into()))?;
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let reader = Connection::open(&path).map_err(|e| err(e.into()))?;
            reader
                .busy_timeout(std::time::Duration::from_secs(10))
                .map_err(|e| err(e.into()))?;
            reader
                .execute_batch("PRAGMA query_only = ON;")
                .map_err(|e| err(e.into()))?;
            readers.push(reader);
        }
        let inner = Arc::new(Inner {
            path: path.clone(),
            hub: Mutex::new(EventHub {
                kinds: HashMap::new(),
                opened_at: u64::try_from(revision).unwrap_or(0),
            }),
            commits: AtomicU64::new(0),
            revision: AtomicU64::new(u64::try_from(revision).unwrap_or(0)),
            value_merge_only,
            written: Mutex::default(),
        });
        let (jobs, queue) = mpsc::channel(WRITE_QUEUE);
        let thread = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || write_loop(inner, writer, queue))
                .map_err(|e| err(Because::boxed("cannot start the writer thread", e)))?
        };
        let (reads, read_queue) = mpsc::channel(READ_QUEUE);
        let read_queue = Arc::new(Mutex::new(read_queue));
        let mut threads = vec![thread];
        for (i, conn) in readers.into_iter().enumerate() {
            let inner = inner.clone();
            let queue = read_queue.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("store-reader-{i}"))
                    .spawn(move || read_loop(inner, conn, queue))
                    .map_err(|e| err(Because::boxed("cannot start a reader thread", e)))?,
            );
        }
        Ok(SqliteStore {
            inner,
            threads: Arc::new(StoreThreads {
                writes: Some(jobs),
                reads: Some(reads),
                threads,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on a reader thread and waits for its answer.
    async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner, &mut Connection) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (answer, answered) = oneshot::channel();
        let job: ReadJob = Box::new(move |inner, conn| {
            let _ = answer.send(f(inner, conn));
        });
        let stopped = || self.inner.db_err("the store's reader threads have stopped");
        let reads = self.threads.reads.as_ref().ok_or_else(stopped)?;
        reads.send(job).await.map_err(|_| stopped())?;
        answered.await.map_err(|_| {
            self.inner
                .db_err("the read ended without an answer (it panicked, or the readers stopped)")
        })?
    }

    /// Shared body of update and update_status: `merge` of the stored object and `object` is
    /// the new one.
    async fn replace<K: StoreObject>(&self, object: &K, merge: Merge) -> Result<K, StoreError> {
        let (t, given_rv) = prepare_replace(object)?;
        let given = object.clone();
        self.write(t.kind.clone(), move |inner, tx| {
            let (stored, event) = inner.replace_in(tx, &t, &given_rv, given, merge)?;
            Ok((stored, event.into_iter().collect()))
        })
        .await
    }

    /// Replaces many objects in one write (one transaction, one disk sync): each object
    /// succeeds or fails on its own, as if written alone; a database failure fails all.
    async fn replace_many<K: StoreObject>(
        &self,
        objects: Vec<(K, Merge)>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        if objects.is_empty() {
            // Nothing to wait for the writer for.
            return Ok(Vec::new());
        }
        self.write(kind_of::<K>(), move |inner, conn| {
            inner.replace_many_in(conn, objects)
        })
        .await
    }

    /// Queues `f` for the writer thread (see [`write_loop`]) and waits for its answer, which
    /// comes once its transaction is committed and its events published.
    async fn write<R: Send + 'static>(
        &self,
        kind: String,
        f: impl FnOnce(&Inner, &Connection) -> Result<(R, Vec<RawEvent>), StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (answer, answered) = oneshot::channel::<Result<R, Failed>>();
        let job: Job = Box::new(move |writer| {
            let written = match writer {
                Err(reason) => Err(Failed::Db(reason.to_owned())),
                Ok((inner, conn)) => f(inner, conn).map_err(Failed::Store),
            };
            match written {
                Err(failed) => {
                    let _ = answer.send(Err(failed));
                    Ran {
                        events: Vec::new(),
                        done: None,
                    }
                }
                Ok((r, events)) => Ran {
                    events: events.into_iter().map(|e| (kind.clone(), e)).collect(),
                    done: Some(Box::new(move |outcome| {
                        let _ = answer.send(outcome.map(|()| r).map_err(Failed::Db));
                    })),
                },
            }
        });
        let stopped = || self.inner.db_err("the store's writer thread has stopped");
        let jobs = self.threads.writes.as_ref().ok_or_else(stopped)?;
        jobs.send(job).await.map_err(|_| stopped())?;
        match answered.await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(Failed::Store(e))) => Err(e),
            Ok(Err(Failed::Db(reason))) => Err(self.inner.db_err(reason)),
            Err(_) => Err(self
                .inner
                .db_err("the write ended without an answer (it panicked, or the writer stopped)")),
        }
    }
}

/// The writer thread. It takes the first queued write, opens an IMMEDIATE transaction, runs
/// every write queued behind it (up to [`MAX_GROUP`]), each in a savepoint of its own, and
/// commits once (one WAL sync); then it publishes the group's events and answers its callers.
/// A lone write commits at once; writes that arrive together share a sync. Each caller is
/// answered only once its transaction is committed, so a returned `Ok` survives `kill -9` and
/// power loss. Ends when every store handle is gone.
///
/// Before, each write was a blocking task taking its turn on a locked connection: with 1,000
/// leases granted at once, a third of the controller's CPU went to threads waiting for that
/// lock and waking each other.
fn write_loop(inner: Arc<Inner>, conn: Connection, mut jobs: mpsc::Receiver<Job>) {
    while let Some(first) = jobs.blocking_recv() {
        if let Err(e) = exec(&conn, "BEGIN IMMEDIATE") {
            let reason = jumpstarter_core::error_chain(&e);
            let _ = first(Err(&reason));
            continue;
        }
        let mut group = Group::default();
        let mut job = Some(first);
        let mut taken = 0;
        while let Some(next) = job.take() {
            inner.run_write(&conn, next, &mut group);
            taken += 1;
            if group.aborted || taken >= MAX_GROUP {
                break;
            }
            job = jobs.try_recv().ok();
        }
        inner.end_group(&conn, group);
    }
}

/// What to do about a damaged store (in every refusal's message).
pub const RECOVERY_STEPS: &str = "stop the controller, move store.db (and store.db-wal, \
     store.db-shm) aside, and restore the last backup with `jumpstarter-controller restore \
     FILE` (see docs/security.md)";

/// `PRAGMA quick_check`: refuses a damaged database with what SQLite found.
fn check_integrity(conn: &Connection) -> Result<(), String> {
    let mut stmt = conn.prepare("PRAGMA quick_check(20)").map_err(|e| {
        format!(
            "the database is damaged ({e}); {RECOVERY_STEPS}",
            e = jumpstarter_core::error_chain(&e)
        )
    })?;
    let found: Vec<String> = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| {
            format!(
                "the database is damaged ({e}); {RECOVERY_STEPS}",
                e = jumpstarter_core::error_chain(&e)
            )
        })?;
    if found.len() == 1 && found[0] == "ok" {
        return Ok(());
    }
    Err(format!(
        "the database is damaged (PRAGMA quick_check: {}); {RECOVERY_STEPS}",
        found.join("; ")
    ))
}

/// Creates or checks the schema. A restore runs it on an empty in-memory database to learn
/// the schema a backup must have.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), BoxError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    match version {
        0 => {
            let tx = conn.transaction()?;
            tx.execute_batch(
                "CREATE TABLE objects (
                    kind TEXT NOT NULL,
                    namespace TEXT NOT NULL,
                    name TEXT NOT NULL,
                    resource_version INTEGER NOT NULL,
                    body TEXT NOT NULL,
                    PRIMARY KEY (kind, namespace, name)
                 ) WITHOUT ROWID;
                 CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
                 INSERT INTO meta (key, value) VALUES ('revision', 0);
                 PRAGMA user_version = 1;",
            )?;
            Ok(tx.commit()?)
        }
        SCHEMA_VERSION => Ok(()),
        other => Err(format!(
            "schema version {other} is not supported (this controller knows up to {SCHEMA_VERSION}); use a newer controller"
        )
        .into()),
    }
}

fn watch_stream<K: StoreObject>(
    kind: String,
    namespace: Option<String>,
    replay: VecDeque<Arc<RawEvent>>,
    receiver: broadcast::Receiver<Arc<RawEvent>>,
) -> WatchStream<K> {
    struct State {
        kind: String,
        namespace: Option<String>,
        replay: VecDeque<Arc<RawEvent>>,
        receiver: Option<broadcast::Receiver<Arc<RawEvent>>>,
    }
    fn convert<K: StoreObject>(kind: &str, ev: &RawEvent) -> Result<WatchEvent<K>, StoreError> {
        let t = Target {
            kind: kind.to_owned(),
            namespace: ev.namespace.clone(),
            name: ev.name.clone(),
        };
        let object: K = match ev.object.downcast_ref::<K>() {
            Some(object) => object.clone(),
            None => t.decode(&ev.body)?,
        };
        Ok(match ev.event_type {
            EventType::Added => WatchEvent::Added(object),
            EventType::Modified => WatchEvent::Modified(object),
            EventType::Deleted => WatchEvent::Deleted(object),
        })
    }
    let state = State {
        kind,
        namespace,
        replay,
        receiver: Some(receiver),
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            let event = match st.replay.pop_front() {
                Some(ev) => ev,
                None => {
                    let receiver = st.receiver.as_mut()?;
                    match receiver.recv().await {
                        Ok(ev) => ev,
                        Err(broadcast::error::RecvError::Lagged(missed)) => {
                            st.receiver = None;
                            let err = StoreError::WatchLagged {
                                kind: st.kind.clone(),
                                reason: format!("the watcher fell {missed} events behind"),
                            };
                            return Some((Err(err), st));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            };
            if st
                .namespace
                .as_deref()
                .is_some_and(|ns| ns != event.namespace)
            {
                continue;
            }
            let item = convert::<K>(&st.kind, &event);
            if item.is_err() {
                // An error is the last item of a watch.
                st.replay.clear();
                st.receiver = None;
            }
            return Some((item, st));
        }
    }))
}

impl Store for SqliteStore {
    async fn get<K: StoreObject>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, StoreError> {
        let t = Target {
            kind: kind_of::<K>(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.read(move |inner, conn| inner.get::<K>(conn, &t)).await
    }

    async fn list<K: StoreObject>(
        &self,
        namespace: Option<&str>,
        selector: &LabelSelector,
        params: &ListParams,
    ) -> Result<ObjectList<K>, StoreError> {
        let namespace = namespace.map(str::to_owned);
        let selector = selector.clone();
        let params = params.clone();
        self.read(move |inner, conn| {
            inner.list::<K>(conn, namespace.as_deref(), &selector, &params)
        })
        .await
    }

    async fn create<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        let mut object = object.clone();
        let meta = object.meta_mut();
        if meta.name.as_deref().unwrap_or_default().is_empty()
            && let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty())
        {
            meta.name = Some(generated_name(prefix));
        }
        let t = target_of(&object);
        check_key(&t)?;
        self.write(t.kind.clone(), move |inner, tx| {
            inner.create_in(tx, &t, object)
        })
        .await
    }

    async fn update<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        self.replace(object, Merge::Update).await
    }

    async fn update_status<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        self.replace(object, Merge::Status).await
    }

    async fn update_status_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        let objects = objects.into_iter().map(|o| (o, Merge::Status));
        self.replace_many(objects.collect()).await
    }

    async fn update_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        let objects = objects.into_iter().map(|o| (o, Merge::Update));
        self.replace_many(objects.collect()).await
    }

    async fn update_status_and_metadata_many<K: StoreObject>(
        &self,
        objects: Vec<(K, crate::store::Parts)>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        // One write each, of the parts named.
        let objects = objects.into_iter().map(|(o, parts)| {
            let merge = match (parts.status, parts.metadata) {
                (true, true) => Merge::StatusAndMetadata,
                (true, false) => Merge::Status,
                (false, true) => Merge::Metadata,
                (false, false) => Merge::Keep,
            };
            (o, merge)
        });
        self.replace_many(objects.collect()).await
    }

    async fn delete<K: StoreObject>(
        &self,
        namespace: &str,
        name: &str,
        resource_version: Option<&str>,
    ) -> Result<K, StoreError> {
        let t = Target {
            kind: kind_of::<K>(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let precondition = resource_version.map(str::to_owned);
        self.write(t.kind.clone(), move |inner, tx| {
            inner.delete_in::<K>(tx, &t, precondition.as_deref())
        })
        .await
    }

    fn commits(&self) -> Option<u64> {
        Some(self.inner.commits.load(Ordering::Relaxed))
    }

    fn watch_is_synchronous(&self) -> bool {
        true
    }

    fn watch_buffer(&self) -> usize {
        WATCH_HISTORY
    }

    async fn watch<K: StoreObject>(
        &self,
        namespace: Option<&str>,
        since: Option<&str>,
    ) -> Result<WatchStream<K>, StoreError> {
        let kind = kind_of::<K>();
        let since = match since.filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(s.parse::<u64>().map_err(|_| StoreError::Invalid {
                kind: kind.clone(),
                namespace: namespace.unwrap_or("*").to_owned(),
                name: "*".into(),
                source: format!("resourceVersion {s:?} is not a store revision").into(),
            })?),
        };
        // Subscribing and copying the retained events under the hub lock, which writers also
        // take to publish, leaves neither a gap nor a duplicate between replay and live events.
        let mut hub = self.inner.hub.lock_or_recover();
        let channel = hub.channel(&kind);
        let replay: VecDeque<Arc<RawEvent>> = match since {
            None => VecDeque::new(),
            Some(since) if since < channel.floor => {
                return Err(StoreError::WatchLagged {
                    kind,
                    reason: format!(
                        "resourceVersion {since} is older than the retained history (from {})",
                        channel.floor
                    ),
                });
            }
            Some(since) => channel
                .recent
                .iter()
                .filter(|ev| ev.revision > since)
                .cloned()
                .collect(),
        };
        let receiver = channel.sender.subscribe();
        drop(hub);
        Ok(watch_stream(
            kind,
            namespace.map(str::to_owned),
            replay,
            receiver,
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::objects::{Exporter, ExporterSpec};

    fn exporter(name: &str) -> Exporter {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e
    }

    /// A write that panics half way leaves nothing behind, although its transaction is
    /// shared: the next write's commit must not carry the panicked write's half. Its caller
    /// gets an error, and the writer thread goes on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_panics_half_way_is_not_committed_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let panicked = store
            .write::<()>("Exporter".into(), |_, conn| {
                conn.execute(
                    "INSERT INTO objects (kind, namespace, name, resource_version, body) \
                     VALUES ('Exporter', 'default', 'half', 1, '{}')",
                    [],
                )
                .unwrap();
                panic!("half way through a write");
            })
            .await;
        assert!(
            matches!(panicked, Err(StoreError::Database { .. })),
            "{panicked:?}"
        );
        store.create(&exporter("after")).await.unwrap();
        let half: Result<Option<Exporter>, _> = store.get("default", "half").await;
        assert!(
            matches!(half, Ok(None)),
            "the panicked write's row was committed: {half:?}"
        );
        // And the store still works: a later group commits.
        assert!(
            store
                .get::<Exporter>("default", "after")
                .await
                .unwrap()
                .is_some()
        );
    }

    /// Issue 27: writes that queue up for the writer share one commit (one disk sync), and
    /// one that fails (a name taken) fails alone, the others of its group written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_queued_together_share_one_commit_and_each_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let before = store.commits().unwrap();
        let n = 20;
        // Hold the writer thread in a write of nothing, so that every write queues behind it.
        // The writes are sent only once it runs: sent before, some could join its group.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (running, started) = tokio::sync::oneshot::channel::<()>();
        let s = store.clone();
        let holder = tokio::spawn(async move {
            s.write("Exporter".into(), move |_, _| {
                let _ = running.send(());
                held.recv().unwrap();
                Ok(((), Vec::new()))
            })
            .await
        });
        started.await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..n {
            let s = store.clone();
            tasks.push(tokio::spawn(async move {
                s.create(&exporter(&format!("board-{i}"))).await
            }));
        }
        let s = store.clone();
        tasks.push(tokio::spawn(
            async move { s.create(&exporter("board-0")).await },
        ));
        let jobs = store.threads.writes.clone().unwrap();
        let mut queued = false;
        for _ in 0..500 {
            if jobs.max_capacity() - jobs.capacity() == n + 1 {
                queued = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        drop(jobs);
        assert!(queued, "the writes did not queue");
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        let mut ok = 0;
        let mut taken = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(StoreError::AlreadyExists { .. }) => taken += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!((ok, taken), (n, 1));
        let commits = store.commits().unwrap() - before;
        assert_eq!(
            commits, 1,
            "{n} writes queued together took {commits} commits"
        );
        for i in 0..n {
            let e: Option<Exporter> = store.get("default", &format!("board-{i}")).await.unwrap();
            assert!(e.is_some(), "board-{i} was not written");
        }
        // A lone write after the group commits by itself.
        store.create(&exporter("alone")).await.unwrap();
        assert_eq!(store.commits().unwrap() - before, 2);
    }
}
