//! The embedded backend: one SQLite file (`store.db`) in the controller's data directory.
//!
//! - Objects are JSON rows keyed by (kind, namespace, name), with their `resource_version`
//!   in a column; a one-row `meta` table holds the store-wide revision counter.
//! - Durability: WAL journal with `synchronous=FULL`, so a write is fsynced to the WAL before
//!   `commit` returns: once a call returned `Ok`, the object survives `kill -9` and power loss.
//! - Concurrency: one writer connection and three reader connections (`READERS`; WAL lets
//!   reads proceed during a write and beside each other), each used from `spawn_blocking`;
//!   writes are serialized, and each write
//!   publishes its watch event while still holding the writer, so events come in revision order.
//! - Group commit: writes that queue up for the writer share one transaction (each in a
//!   savepoint of its own, failing alone), committed by the last of them: one WAL sync for the
//!   group instead of one per write (see `Writer`).
//! - Schema: `PRAGMA user_version` ([`SCHEMA_VERSION`]); a newer file is refused, not guessed at.

use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex, OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::broadcast;

use super::{
    Because, BoxError, ListParams, ObjectList, Store, StoreError, StoreObject, WATCH_BUFFER,
    WatchEvent, WatchStream,
};
use crate::selector::LabelSelector;
use jumpstarter_core::sync::LockExt;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "store.db";
/// The schema version this code reads and writes.
pub const SCHEMA_VERSION: i64 = 1;

/// The SQLite-backed [`Store`]; cloning gives another handle to the same database.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
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
    writer: Mutex<Writer>,
    /// Poked when a group's transaction ended (its members' outcomes are set).
    group_ended: Condvar,
    /// Writes waiting for `writer`: the write that finds none commits its group.
    queued: AtomicUsize,
    /// Reader connections; a read takes a free one (see [`Inner::reader`]).
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    hub: Mutex<EventHub>,
    /// Transactions that changed something, committed on `writer` (one WAL sync each; one
    /// that wrote nothing is not counted).
    commits: AtomicU64,
}

/// The most writes one transaction takes before it is committed even with more queued (so
/// that a steady stream of writes still commits and publishes in bounded time).
const MAX_GROUP: usize = 128;

/// How a member of a group learns whether its write was committed.
type Outcome = Arc<OnceLock<Result<(), String>>>;

/// The writer connection and the transaction open on it (group commit).
///
/// Writes take turns on the connection as before, each in a savepoint of one IMMEDIATE
/// transaction; a write that finds other writes queued behind it leaves that transaction
/// open for them and waits, and the write that finds none queued commits the whole group
/// (one WAL sync) and publishes its events. A lone write commits at once, as before; writes
/// that arrive together share a sync. Each still returns only once its transaction is
/// committed, so a returned `Ok` survives `kill -9` and power loss as before.
struct Writer {
    conn: Connection,
    /// Whether a transaction is open on `conn`.
    open: bool,
    /// Events of the open transaction's writes (kind, event), in revision order.
    events: Vec<(String, RawEvent)>,
    /// The writes in the open transaction, waiting for its commit.
    members: Vec<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

/// A committed change, shared by all watchers of its kind; decoded per watcher.
#[derive(Debug)]
struct RawEvent {
    event_type: EventType,
    namespace: String,
    name: String,
    revision: u64,
    body: String,
}

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
                sender: broadcast::channel(WATCH_BUFFER).0,
                recent: VecDeque::with_capacity(WATCH_BUFFER),
                floor: opened_at,
            })
    }

    fn publish(&mut self, kind: &str, event: RawEvent) {
        let channel = self.channel(kind);
        let event = Arc::new(event);
        if channel.recent.len() == WATCH_BUFFER
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

fn check_key(t: &Target) -> Result<(), StoreError> {
    if !valid_label(&t.namespace) {
        return Err(t.invalid(
            "metadata.namespace must be a DNS-1123 label (lowercase letters, digits, '-', at most 63)",
        ));
    }
    if !valid_subdomain(&t.name) {
        return Err(t.invalid(
            "metadata.name must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.', at most 253)",
        ));
    }
    Ok(())
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

/// What an update needs before the transaction: the target, the given `resourceVersion` and
/// the object as JSON.
fn prepare_replace<K: StoreObject>(object: &K) -> Result<(Target, String, Value), StoreError> {
    let t = target_of(object);
    check_key(&t)?;
    let given_rv = object
        .meta()
        .resource_version
        .clone()
        .filter(|rv| !rv.is_empty())
        .ok_or_else(|| t.invalid("metadata.resourceVersion must be set for an update"))?;
    let given = serde_json::to_value(object)
        .map_err(|e| t.invalid(Because::boxed("cannot serialize", e)))?;
    Ok((t, given_rv, given))
}

/// `update_status`'s merge: the stored object with the given status.
fn merge_status(t: &Target, mut stored: Value, given: Value) -> Result<Value, StoreError> {
    let status = given.get("status").cloned().filter(|s| !s.is_null());
    match &mut stored {
        Value::Object(map) => set_or_remove(map, "status", status),
        _ => return Err(t.corrupt("stored object is not a JSON object")),
    }
    Ok(stored)
}

/// `update`'s merge: the given object with the stored status and server-owned metadata;
/// `generation` moves on when the spec changed.
fn merge_update(t: &Target, stored: Value, mut given: Value) -> Result<Value, StoreError> {
    let stored_meta = stored.get("metadata").cloned().unwrap_or(Value::Null);
    let spec_changed = spec_part(&stored) != spec_part(&given);
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
    Ok(given)
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

/// Reader connections. With one, reads queued on its lock: with 1,000 leases granted at
/// once (a client lookup per `CreateLease`, a lease lookup per Status message) the blocking
/// threads spent a tenth of the controller's CPU waiting for it and waking each other.
const READERS: usize = 3;

impl Inner {
    /// A reader connection: the first free one, else the next in turn (waiting for it).
    fn reader(&self) -> std::sync::MutexGuard<'_, Connection> {
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.readers.len() {
            let reader = &self.readers[(start + i) % self.readers.len()];
            match reader.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
        }
        self.readers[start % self.readers.len()].lock_or_recover()
    }

    fn db_err(&self, e: impl Into<BoxError>) -> StoreError {
        StoreError::Database {
            path: self.path.display().to_string(),
            source: e.into(),
        }
    }

    /// Runs `f` in an IMMEDIATE transaction on the writer, shared with the writes queued
    /// with it (see [`Writer`]); returns once that transaction is committed and the event
    /// published (still holding the writer, so events leave in revision order).
    fn write<R>(
        &self,
        kind: &str,
        f: impl FnOnce(&Connection) -> Result<(R, Option<RawEvent>), StoreError>,
    ) -> Result<R, StoreError> {
        self.write_group(kind, |conn| {
            let (r, event) = f(conn)?;
            Ok((r, event.into_iter().collect()))
        })
    }

    /// [`Inner::write`] with any number of events.
    fn write_group<R>(
        &self,
        kind: &str,
        f: impl FnOnce(&Connection) -> Result<(R, Vec<RawEvent>), StoreError>,
    ) -> Result<R, StoreError> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let mut w = self.writer.lock_or_recover();
        self.queued.fetch_sub(1, Ordering::SeqCst);
        if !w.open {
            exec(&w.conn, "BEGIN IMMEDIATE").map_err(|e| self.db_err(e))?;
            w.open = true;
        }
        let written = match exec(&w.conn, "SAVEPOINT write") {
            Err(e) => Err(self.db_err(e)),
            Ok(()) => {
                // A write that panics half way must not leave its half in the group's
                // transaction (the others would commit it): undo it, end the group when no
                // write queued behind will, and go on panicking.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&w.conn)));
                let ran = match ran {
                    Ok(ran) => ran,
                    Err(panic) => {
                        self.undo_write(&mut w);
                        if w.open && self.queued.load(Ordering::SeqCst) == 0 {
                            self.end_group(&mut w);
                        }
                        drop(w);
                        std::panic::resume_unwind(panic);
                    }
                };
                match ran.and_then(|ok| {
                    exec(&w.conn, "RELEASE write")
                        .map(|()| ok)
                        .map_err(|e| self.db_err(e))
                }) {
                    Ok(ok) => Ok(ok),
                    Err(e) => {
                        self.undo_write(&mut w);
                        Err(e)
                    }
                }
            }
        };
        let result = match written {
            Ok((r, events)) => {
                w.events
                    .extend(events.into_iter().map(|e| (kind.to_owned(), e)));
                let outcome = Outcome::default();
                w.members.push(outcome.clone());
                Ok((r, outcome))
            }
            Err(e) => Err(e),
        };
        // Bounded: each round either commits (ending the group) or waits for the write
        // queued behind this one, which commits or hands on in turn; the timed wait only
        // guards against a member that went away without committing.
        loop {
            if let Ok((_, outcome)) = &result
                && outcome.get().is_some()
            {
                break;
            }
            if w.open && (self.queued.load(Ordering::SeqCst) == 0 || w.members.len() >= MAX_GROUP) {
                self.end_group(&mut w);
                continue;
            }
            if result.is_err() {
                // Nothing of ours to wait for; the writes queued behind commit the group.
                break;
            }
            w = match self.group_ended.wait_timeout(w, Duration::from_millis(50)) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        let (r, outcome) = result?;
        match outcome.get() {
            Some(Ok(())) => Ok(r),
            Some(Err(e)) => Err(self.db_err(e.clone())),
            None => Err(self.db_err("the write's transaction did not end")),
        }
    }

    /// Undoes the write in savepoint `write` only; the group's others stay. When even that
    /// fails the transaction is ended, failing the whole group.
    fn undo_write(&self, w: &mut Writer) {
        if let Err(undo) = w.conn.execute_batch("ROLLBACK TO write; RELEASE write") {
            let members = std::mem::take(&mut w.members);
            w.events.clear();
            let _ = w.conn.execute_batch("ROLLBACK");
            w.open = false;
            for m in members {
                let _ = m.set(Err(undo.to_string()));
            }
            self.group_ended.notify_all();
        }
    }

    /// Commits the open transaction (rolls it back when it holds no write), publishes its
    /// events and tells its members.
    fn end_group(&self, w: &mut Writer) {
        let members = std::mem::take(&mut w.members);
        let events = std::mem::take(&mut w.events);
        let ended = if members.is_empty() {
            exec(&w.conn, "ROLLBACK")
        } else {
            exec(&w.conn, "COMMIT")
        };
        let outcome = match ended {
            Ok(()) => Ok(()),
            Err(e) => {
                // A failed COMMIT may leave the transaction open: end it.
                let _ = w.conn.execute_batch("ROLLBACK");
                Err(e.to_string())
            }
        };
        w.open = false;
        if outcome.is_ok() && !events.is_empty() {
            self.commits.fetch_add(1, Ordering::Relaxed);
            let mut hub = self.hub.lock_or_recover();
            for (kind, event) in events {
                hub.publish(&kind, event);
            }
        }
        for m in members {
            let _ = m.set(outcome.clone());
        }
        self.group_ended.notify_all();
    }

    fn next_revision(&self, tx: &Connection) -> Result<u64, StoreError> {
        let rev: i64 = tx
            .prepare_cached(
                "UPDATE meta SET value = value + 1 WHERE key = 'revision' RETURNING value",
            )
            .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
            .map_err(|e| self.db_err(e))?;
        u64::try_from(rev).map_err(|_| self.db_err(format!("negative revision {rev}")))
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

    fn get<K: StoreObject>(&self, t: &Target) -> Result<Option<K>, StoreError> {
        let conn = self.reader();
        match self.read_row(&conn, t)? {
            Some((_, body)) => t.decode(&body).map(Some),
            None => Ok(None),
        }
    }

    fn create<K: StoreObject>(&self, mut object: K) -> Result<K, StoreError> {
        let kind = kind_of::<K>();
        let meta = object.meta_mut();
        if meta.name.as_deref().unwrap_or_default().is_empty()
            && let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty())
        {
            meta.name = Some(generated_name(prefix));
        }
        let t = target_of(&object);
        check_key(&t)?;
        self.write(&kind, |tx| {
            if self.read_row(tx, &t)?.is_some() {
                return Err(StoreError::AlreadyExists {
                    kind: t.kind.clone(),
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                });
            }
            let revision = self.next_revision(tx)?;
            let meta = object.meta_mut();
            meta.uid = Some(uuid::Uuid::new_v4().to_string());
            meta.resource_version = Some(revision.to_string());
            meta.creation_timestamp = Some(Time(Timestamp::now()));
            meta.generation = Some(1);
            let mut value = serde_json::to_value(&object)
                .map_err(|e| t.invalid(Because::boxed("cannot serialize", e)))?;
            if let Value::Object(map) = &mut value {
                // Status is written through update_status only (status subresource).
                map.remove("status");
            }
            let body = value.to_string();
            let stored: K = t.decode(&body)?;
            self.write_row(tx, &t, revision, &body)?;
            Ok((
                stored,
                Some(RawEvent {
                    event_type: EventType::Added,
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                    revision,
                    body,
                }),
            ))
        })
    }

    /// Shared body of update and update_status: `merge(stored, given)` builds the new value.
    fn replace<K: StoreObject>(
        &self,
        object: &K,
        merge: impl FnOnce(&Target, Value, Value) -> Result<Value, StoreError>,
    ) -> Result<K, StoreError> {
        let (t, given_rv, given) = prepare_replace(object)?;
        self.write(&t.kind, |tx| {
            self.replace_in(tx, &t, &given_rv, given, merge)
        })
    }

    /// The write of [`Inner::replace`], inside the caller's transaction.
    fn replace_in<K: StoreObject>(
        &self,
        tx: &Connection,
        t: &Target,
        given_rv: &str,
        given: Value,
        merge: impl FnOnce(&Target, Value, Value) -> Result<Value, StoreError>,
    ) -> Result<(K, Option<RawEvent>), StoreError> {
        let (current_rv, body) = self.read_row(tx, t)?.ok_or_else(|| t.not_found())?;
        if given_rv != current_rv.to_string() {
            return Err(t.conflict(given_rv, current_rv));
        }
        let stored: Value = serde_json::from_str(&body).map_err(|e| t.corrupt(e))?;
        let mut next = merge(t, stored.clone(), given)?;
        if next == stored {
            // Nothing changed: no write, no event, same resourceVersion (as Kubernetes).
            return Ok((t.decode(&body)?, None));
        }
        let revision = self.next_revision(tx)?;
        metadata_mut(t, &mut next)?.insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
        let body = next.to_string();
        let result: K = t.decode(&body)?;
        self.write_row(tx, t, revision, &body)?;
        Ok((
            result,
            Some(RawEvent {
                event_type: EventType::Modified,
                namespace: t.namespace.clone(),
                name: t.name.clone(),
                revision,
                body,
            }),
        ))
    }

    /// [`Inner::update_status`] of many objects in one transaction (one disk sync): each
    /// object succeeds or fails on its own, as if written alone; a database failure fails all.
    fn update_status_many<K: StoreObject>(
        &self,
        objects: &[K],
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        self.replace_many(objects, merge_status)
    }

    /// [`Inner::update`] of many objects in one transaction, as [`Inner::update_status_many`].
    fn update_many<K: StoreObject>(
        &self,
        objects: &[K],
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        self.replace_many(objects, merge_update)
    }

    /// [`Inner::replace`] of many objects in one transaction, each in a savepoint of its own.
    fn replace_many<K: StoreObject>(
        &self,
        objects: &[K],
        merge: fn(&Target, Value, Value) -> Result<Value, StoreError>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        if objects.is_empty() {
            // Nothing to wait for the writer for.
            return Ok(Vec::new());
        }
        let kind = kind_of::<K>();
        self.write_group(&kind, |conn| {
            let mut results = Vec::with_capacity(objects.len());
            let mut events = Vec::new();
            for object in objects {
                let (t, given_rv, given) = match prepare_replace(object) {
                    Ok(p) => p,
                    Err(e) => {
                        results.push(Err(e));
                        continue;
                    }
                };
                exec(conn, "SAVEPOINT object").map_err(|e| self.db_err(e))?;
                match self.replace_in::<K>(conn, &t, &given_rv, given, merge) {
                    Ok((stored, event)) => {
                        exec(conn, "RELEASE object").map_err(|e| self.db_err(e))?;
                        results.push(Ok(stored));
                        events.extend(event);
                    }
                    Err(e @ StoreError::Database { .. }) => return Err(e),
                    Err(e) => {
                        // This object's write is rolled back; the others stay.
                        conn.execute_batch("ROLLBACK TO object; RELEASE object")
                            .map_err(|e| self.db_err(e))?;
                        results.push(Err(e));
                    }
                }
            }
            Ok((results, events))
        })
    }

    fn update<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        self.replace(object, merge_update)
    }

    fn update_status<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        self.replace(object, merge_status)
    }

    fn delete<K: StoreObject>(
        &self,
        t: &Target,
        precondition: Option<&str>,
    ) -> Result<K, StoreError> {
        self.write(&t.kind, |tx| {
            let (current_rv, body) = self.read_row(tx, t)?.ok_or_else(|| t.not_found())?;
            if let Some(given) = precondition
                && given != current_rv.to_string()
            {
                return Err(t.conflict(given, current_rv));
            }
            let mut value: Value = serde_json::from_str(&body).map_err(|e| t.corrupt(e))?;
            tx.prepare_cached(
                "DELETE FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
            )
            .and_then(|mut stmt| stmt.execute(params![t.kind, t.namespace, t.name]))
            .map_err(|e| self.db_err(e))?;
            let revision = self.next_revision(tx)?;
            metadata_mut(t, &mut value)?.insert(
                "resourceVersion".into(),
                Value::String(revision.to_string()),
            );
            let body = value.to_string();
            let last: K = t.decode(&body)?;
            Ok((
                last,
                Some(RawEvent {
                    event_type: EventType::Deleted,
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                    revision,
                    body,
                }),
            ))
        })
    }

    fn list<K: StoreObject>(
        &self,
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
        let mut conn = self.reader();
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
        writer
            .execute_batch("PRAGMA synchronous = FULL;")
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
            readers.push(Mutex::new(reader));
        }
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Mutex::new(Writer {
                    conn: writer,
                    open: false,
                    events: Vec::new(),
                    members: Vec::new(),
                }),
                group_ended: Condvar::new(),
                queued: AtomicUsize::new(0),
                readers,
                next_reader: AtomicUsize::new(0),
                hub: Mutex::new(EventHub {
                    kinds: HashMap::new(),
                    opened_at: u64::try_from(revision).unwrap_or(0),
                }),
                commits: AtomicU64::new(0),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| self.inner.db_err(Because::boxed("store task failed", e)))?
    }
}

/// What to do about a damaged store (in every refusal's message).
pub const RECOVERY_STEPS: &str = "stop the controller, move store.db (and store.db-wal, \
     store.db-shm) aside, and restore the last backup with `jumpstarter-controller restore \
     FILE` (see docs/security.md)";

/// `PRAGMA quick_check`: refuses a damaged database with what SQLite found.
fn check_integrity(conn: &Connection) -> Result<(), String> {
    let mut stmt = conn
        .prepare("PRAGMA quick_check(20)")
        .map_err(|e| format!("the database is damaged ({e}); {RECOVERY_STEPS}"))?;
    let found: Vec<String> = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| format!("the database is damaged ({e}); {RECOVERY_STEPS}"))?;
    if found.len() == 1 && found[0] == "ok" {
        return Ok(());
    }
    Err(format!(
        "the database is damaged (PRAGMA quick_check: {}); {RECOVERY_STEPS}",
        found.join("; ")
    ))
}

/// Creates or checks the schema.
fn migrate(conn: &mut Connection) -> Result<(), BoxError> {
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
        let object: K = t.decode(&ev.body)?;
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
        self.run(move |inner| inner.get::<K>(&t)).await
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
        self.run(move |inner| inner.list::<K>(namespace.as_deref(), &selector, &params))
            .await
    }

    async fn create<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        let object = object.clone();
        self.run(move |inner| inner.create(object)).await
    }

    async fn update<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        let object = object.clone();
        self.run(move |inner| inner.update(&object)).await
    }

    async fn update_status<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        let object = object.clone();
        self.run(move |inner| inner.update_status(&object)).await
    }

    async fn update_status_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        self.run(move |inner| inner.update_status_many(&objects))
            .await
    }

    async fn update_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        self.run(move |inner| inner.update_many(&objects)).await
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
        self.run(move |inner| inner.delete::<K>(&t, precondition.as_deref()))
            .await
    }

    fn commits(&self) -> Option<u64> {
        Some(self.inner.commits.load(Ordering::Relaxed))
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
    /// shared: the next write's commit must not carry the panicked write's half.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_panics_half_way_is_not_committed_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let inner = store.inner.clone();
        let panicked = tokio::task::spawn_blocking(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                inner.write::<()>("Exporter", |conn| {
                    conn.execute(
                        "INSERT INTO objects (kind, namespace, name, resource_version, body) \
                         VALUES ('Exporter', 'default', 'half', 1, '{}')",
                        [],
                    )
                    .unwrap();
                    panic!("half way through a write");
                })
            }))
            .is_err()
        })
        .await
        .unwrap();
        assert!(panicked);
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
    // The writer lock is held across the waits on purpose: the writes must queue behind it.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_queued_together_share_one_commit_and_each_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let before = store.commits().unwrap();
        let n = 20;
        // Hold the writer so that every write queues behind it.
        let held = store.inner.writer.lock_or_recover();
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
        let mut queued = false;
        for _ in 0..500 {
            if store.inner.queued.load(Ordering::SeqCst) == n + 1 {
                queued = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(queued, "the writes did not queue");
        drop(held);
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
