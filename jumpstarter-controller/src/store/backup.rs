//! `jumpstarter-controller backup FILE` and `restore FILE`: a consistent copy of the SQLite
//! store, taken while the controller runs (SQLite's `VACUUM INTO`, which reads one snapshot
//! of the database like the online backup API), and putting such a copy back while it is
//! stopped.
//!
//! A backup checks the store with `PRAGMA quick_check` first. A restore accepts only a store
//! this controller could have written itself (see [`verify`]: undamaged, our schema version,
//! our tables and nothing else — no trigger, view, extra table or index — and every object
//! as the API would have accepted it), and checks the copy it is about to put in place, not
//! the file it was given: nothing replaces the live store before that copy passed.

mod error;
mod verify;

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use rusqlite::{Connection, OpenFlags};

use crate::store::sqlite::DB_FILE;
pub use error::BackupError;

fn db_err(path: &Path) -> impl Fn(rusqlite::Error) -> BackupError + '_ {
    move |e| BackupError::Database {
        path: path.to_path_buf(),
        reason: jumpstarter_core::error_chain(&e),
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BackupError {
    let path = path.to_path_buf();
    move |source| BackupError::Io { what, path, source }
}

/// Opens `path` read-only and checks it is an undamaged Jumpstarter store.
fn open_checked(path: &Path) -> Result<Connection, BackupError> {
    if !path.exists() {
        return Err(BackupError::Database {
            path: path.to_path_buf(),
            reason: "no such file".into(),
        });
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(db_err(path))?;
    let found: Vec<String> = conn
        .prepare("PRAGMA quick_check(20)")
        .and_then(|mut s| {
            s.query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(db_err(path))?;
    if found != ["ok"] {
        return Err(BackupError::Database {
            path: path.to_path_buf(),
            reason: format!("damaged (PRAGMA quick_check: {})", found.join("; ")),
        });
    }
    let is_store: bool = conn
        .query_row(
            "SELECT count(*) = 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |row| row.get(0),
        )
        .map_err(db_err(path))?;
    if !is_store {
        return Err(BackupError::Database {
            path: path.to_path_buf(),
            reason: "not a Jumpstarter controller store (no `meta` table)".into(),
        });
    }
    Ok(conn)
}

/// Writes a consistent copy of the store in `data_dir` to the new file `file` (the
/// controller may be running).
pub fn backup(data_dir: &Path, file: &Path) -> Result<(), BackupError> {
    if file.exists() {
        return Err(BackupError::Exists(file.to_path_buf()));
    }
    let db = data_dir.join(DB_FILE);
    let conn = open_checked(&db)?;
    let target = file.to_string_lossy().into_owned();
    conn.execute("VACUUM INTO ?1", [target])
        .map_err(db_err(&db))?;
    // The copy is checked for damage too.
    open_checked(file).map(drop)
}

/// Opens the backup `file`, which must be a regular file (not a symbolic link to one): what
/// `lstat` saw is what is opened.
fn open_backup(file: &Path) -> Result<File, BackupError> {
    let seen = match std::fs::symlink_metadata(file) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(BackupError::Database {
                path: file.to_path_buf(),
                reason: "no such file".into(),
            });
        }
        Err(e) => return Err(io("cannot inspect the backup", file)(e)),
    };
    let t = seen.file_type();
    let not_regular = |found| BackupError::NotARegularFile {
        path: file.to_path_buf(),
        found,
    };
    if !t.is_file() {
        return Err(not_regular(if t.is_symlink() {
            "a symbolic link"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a named pipe"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_block_device() || t.is_char_device() {
            "a device"
        } else {
            "something else"
        }));
    }
    let opened = File::open(file).map_err(io("cannot open the backup", file))?;
    let now = opened
        .metadata()
        .map_err(io("cannot inspect the backup", file))?;
    if !now.is_file() || (now.dev(), now.ino()) != (seen.dev(), seen.ino()) {
        return Err(not_regular(
            "another file since it was looked at (it was replaced)",
        ));
    }
    Ok(opened)
}

/// Removes `path` if it exists.
fn remove_if_present(path: &Path) -> Result<(), BackupError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("cannot remove", path)(e)),
    }
}

/// `path` with SQLite's suffix `side` (`-wal`, `-shm`, `-journal`).
fn sidecar(path: &Path, side: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(side);
    PathBuf::from(name)
}

/// SQLite's files beside a database.
const SIDECARS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Copies `source` to the new file `to` (mode 0600), synced to disk.
fn copy_to_new(source: &mut File, to: &Path) -> std::io::Result<()> {
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    std::io::copy(source, &mut out)?;
    out.sync_all()
}

/// Replaces the store in `data_dir` by the backup `file` (stop the controller first). The
/// backup is copied into the data directory first and that copy checked (see [`verify`]);
/// only when it passes is the old store, if any, moved aside as
/// `store.db.before-restore-<unix time>` (with its log, `-wal`) and the copy put in its place.
/// A refused backup leaves the data directory as it was.
pub fn restore(data_dir: &Path, file: &Path) -> Result<PathBuf, BackupError> {
    let mut source = open_backup(file)?;
    std::fs::create_dir_all(data_dir).map_err(io("cannot create", data_dir))?;
    let db = data_dir.join(DB_FILE);
    let staged = data_dir.join(format!("{DB_FILE}.restoring"));
    // Left over by an interrupted restore: not ours to trust.
    remove_if_present(&staged)?;
    for side in SIDECARS {
        remove_if_present(&sidecar(&staged, side))?;
    }
    let copied = copy_to_new(&mut source, &staged);
    drop(source);
    let checked = copied
        .map_err(io("cannot copy the backup to", &staged))
        .and_then(|()| verify::restorable(&staged, file));
    if let Err(refused) = checked {
        // The refusal is the answer; a copy left behind is removed by the next restore.
        for side in SIDECARS {
            let _ = remove_if_present(&sidecar(&staged, side));
        }
        let _ = remove_if_present(&staged);
        return Err(refused);
    }
    // A read-only look may leave SQLite's shared-memory file behind; it is not the store's.
    for side in SIDECARS {
        remove_if_present(&sidecar(&staged, side))?;
    }
    if db.exists() {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let kept = data_dir.join(format!("{DB_FILE}.before-restore-{stamp}"));
        std::fs::rename(&db, &kept).map_err(io("cannot move the old store to", &kept))?;
        // Its log holds its latest commits when it was not closed cleanly.
        for side in ["-wal", "-journal"] {
            let log = sidecar(&db, side);
            if log.exists() {
                let kept_log = sidecar(&kept, side);
                std::fs::rename(&log, &kept_log)
                    .map_err(io("cannot move the old store's log to", &kept_log))?;
            }
        }
    }
    for side in SIDECARS {
        remove_if_present(&sidecar(&db, side))?;
    }
    std::fs::rename(&staged, &db).map_err(io("cannot put the backup in place at", &db))?;
    File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(io("cannot sync", data_dir))?;
    Ok(db)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        objects::{
            Client, ClientSpec, DEFAULT_MAX_TAGS, Device, Exporter, ExporterAccessPolicy,
            ExporterSpec, ExporterStatus, Lease, lease_from_proto, selector::LabelSelector,
        },
        service::admin::policy_from_admin,
        store::{ListParams, SqliteStore, Store, StoreObject},
    };

    async fn names(dir: &Path) -> Vec<String> {
        let store = SqliteStore::open(dir).await.unwrap();
        store
            .list::<Client>(None, &LabelSelector::everything(), &ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect()
    }

    #[tokio::test]
    async fn a_backup_of_a_live_store_restores_it() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let store = SqliteStore::open(&data).await.unwrap();
        for n in ["alice", "bob"] {
            let mut c = Client::new(n, ClientSpec::default());
            c.metadata.namespace = Some("default".into());
            store.create(&c).await.unwrap();
        }
        // Taken while the store is open.
        let file = tmp.path().join("backup.db");
        backup(&data, &file).unwrap();
        let e = backup(&data, &file).unwrap_err();
        assert!(matches!(e, BackupError::Exists(_)), "{e}");
        drop(store);

        // The store is lost; the backup brings it back.
        std::fs::remove_file(data.join(DB_FILE)).unwrap();
        let _ = std::fs::remove_file(data.join("store.db-wal"));
        let _ = std::fs::remove_file(data.join("store.db-shm"));
        restore(&data, &file).unwrap();
        assert_eq!(names(&data).await, ["alice", "bob"]);
    }

    #[test]
    fn damaged_or_foreign_files_are_not_restored() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let junk = tmp.path().join("junk.db");
        std::fs::write(&junk, vec![7u8; 8192]).unwrap();
        let e = jumpstarter_core::error_chain(&restore(&data, &junk).unwrap_err());
        assert!(e.contains("junk.db"), "{e}");
        let other = tmp.path().join("other.db");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER);")
            .unwrap();
        let e = jumpstarter_core::error_chain(&restore(&data, &other).unwrap_err());
        assert!(e.contains("not a Jumpstarter controller store"), "{e}");
        assert!(!data.join(DB_FILE).exists());
        let e = jumpstarter_core::error_chain(
            &restore(&data, &tmp.path().join("missing.db")).unwrap_err(),
        );
        assert!(e.contains("no such file"), "{e}");
    }

    /// A store holding an object of every kind as the API writes them (labels set by an
    /// admin and reported by the exporter, devices, a lease with tags and a selector, an
    /// access policy), closed, and a backup of it.
    struct Seeded {
        _tmp: tempfile::TempDir,
        data: PathBuf,
        backup: PathBuf,
    }

    async fn seeded() -> Seeded {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let store = SqliteStore::open(&data).await.unwrap();
        for n in ["alice", "bob"] {
            let mut c = Client::new(
                n,
                ClientSpec {
                    username: Some(format!("oidc:{n}")),
                },
            );
            c.metadata.namespace = Some("default".into());
            c.metadata.labels = Some([("team".to_string(), "qa".to_string())].into());
            store.create(&c).await.unwrap();
        }
        let mut e = Exporter::new("board-1", ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e.metadata.labels = Some(
            [
                ("board".to_string(), "rpi4".to_string()),
                // Reported by the exporter: free text, up to MAX_LABEL_TEXT.
                (
                    "jumpstarter.dev/name".to_string(),
                    "Lab bench #1 (the left one)".repeat(40),
                ),
            ]
            .into(),
        );
        let mut e = store.create(&e).await.unwrap();
        e.status = Some(ExporterStatus {
            devices: Some(vec![Device {
                uuid: "7f0c4c1e-2b7a-4d7e-9d53-2f7a8c1e0b11".into(),
                parent_uuid: None,
                labels: [(
                    "jumpstarter.dev/client".to_string(),
                    "PowerClient".to_string(),
                )]
                .into(),
            }]),
            status_message: "Available for a new lease".into(),
            ..ExporterStatus::default()
        });
        store.update_status(&e).await.unwrap();
        let mut req = jumpstarter_proto::client_v1::Lease {
            selector: "board=rpi4,site!=lab2,site!=lab3".into(),
            duration: Some(prost_types::Duration {
                seconds: 1800,
                nanos: 0,
            }),
            ..Default::default()
        };
        req.tags.insert("ticket".into(), "qa-17".into());
        let lease =
            lease_from_proto(&req, "default", "lease-1", "alice", DEFAULT_MAX_TAGS).unwrap();
        store.create(&lease).await.unwrap();
        let policy = policy_from_admin(&jumpstarter_proto::admin_v1::AccessPolicy {
            namespace: "default".into(),
            name: "lab".into(),
            exporter_selector: "board in (rpi4,rpi5)".into(),
            rules: vec![jumpstarter_proto::admin_v1::AccessRule {
                description: "qa".into(),
                priority: 10,
                from_client_selectors: vec!["team=qa".into()],
                maximum_duration: Some(prost_types::Duration {
                    seconds: 3600,
                    nanos: 0,
                }),
                spot_access: false,
            }],
        })
        .unwrap();
        store.create(&policy).await.unwrap();
        let backup_file = tmp.path().join("backup.db");
        backup(&data, &backup_file).unwrap();
        drop(store);
        Seeded {
            data,
            backup: backup_file,
            _tmp: tmp,
        }
    }

    /// Every file of `dir` with its content.
    fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(entry.path()).unwrap())
            })
            .collect()
    }

    /// Inserts `object` as the store would hold it, at the store's current revision.
    fn insert<K: StoreObject>(conn: &Connection, mut object: K) {
        let revision: i64 = conn
            .query_row("SELECT value FROM meta WHERE key = 'revision'", [], |r| {
                r.get(0)
            })
            .unwrap();
        object.meta_mut().namespace = Some("default".into());
        object.meta_mut().resource_version = Some(revision.to_string());
        let name = object.meta().name.clone().unwrap();
        let body = serde_json::to_string(&object).unwrap();
        conn.execute(
            "INSERT INTO objects (kind, namespace, name, resource_version, body) \
             VALUES (?1, 'default', ?2, ?3, ?4)",
            rusqlite::params![K::kind(&()), name, revision, body],
        )
        .unwrap();
    }

    /// Restores a copy of a fresh store's backup changed by `tamper` over that store: it
    /// must be refused with an error containing each of `needles`, the live store left as it
    /// was (every file of the data directory, byte for byte).
    async fn assert_refused(tamper: impl FnOnce(&Connection), needles: &[&str]) {
        let s = seeded().await;
        let bad = s.backup.with_file_name("tampered.db");
        std::fs::copy(&s.backup, &bad).unwrap();
        {
            let conn = Connection::open(&bad).unwrap();
            conn.execute_batch("PRAGMA journal_mode = DELETE;").unwrap();
            tamper(&conn);
        }
        let before = snapshot(&s.data);
        assert!(before.contains_key(DB_FILE));
        let e = jumpstarter_core::error_chain(&restore(&s.data, &bad).unwrap_err());
        for needle in needles {
            assert!(e.contains(needle), "{needle:?} not in: {e}");
        }
        assert!(e.contains("tampered.db"), "the backup is not named: {e}");
        assert_eq!(snapshot(&s.data), before, "the live store was changed");
    }

    #[tokio::test]
    async fn an_untampered_backup_of_every_kind_restores_over_the_live_store() {
        let s = seeded().await;
        restore(&s.data, &s.backup).unwrap();
        assert_eq!(names(&s.data).await, ["alice", "bob"]);
        let kept: Vec<String> = snapshot(&s.data)
            .into_keys()
            .filter(|n| n.starts_with("store.db.before-restore-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        let store = SqliteStore::open(&s.data).await.unwrap();
        let all = LabelSelector::everything();
        let p = ListParams::default();
        let exporters = store.list::<Exporter>(None, &all, &p).await.unwrap();
        assert_eq!(exporters.items.len(), 1);
        assert_eq!(
            store
                .list::<Lease>(None, &all, &p)
                .await
                .unwrap()
                .items
                .len(),
            1
        );
        let policies = store.list::<ExporterAccessPolicy>(None, &all, &p).await;
        assert_eq!(policies.unwrap().items.len(), 1);
    }

    /// A copy of the stopped store's file (its header still says WAL) is a backup too; a
    /// link planted where the restore stages its copy is replaced, not written through.
    #[tokio::test]
    async fn a_copy_of_a_stopped_store_restores_and_a_planted_link_is_not_followed() {
        let s = seeded().await;
        let copy = s.backup.with_file_name("copy.db");
        std::fs::copy(s.data.join(DB_FILE), &copy).unwrap();
        let victim = s.backup.with_file_name("victim");
        std::fs::write(&victim, "untouched").unwrap();
        std::os::unix::fs::symlink(&victim, s.data.join("store.db.restoring")).unwrap();
        restore(&s.data, &copy).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(names(&s.data).await, ["alice", "bob"]);
        let left: Vec<String> = snapshot(&s.data)
            .into_keys()
            .filter(|n| n.contains("restoring"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn a_trigger_is_refused() {
        // On the next write (`jmp admin create client`), every client would be deleted.
        assert_refused(
            |c| {
                c.execute_batch(
                    "CREATE TRIGGER wipe_clients AFTER INSERT ON objects BEGIN \
                     DELETE FROM objects WHERE kind = 'Client'; END;",
                )
                .unwrap()
            },
            &["trigger `wipe_clients`"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_view_is_refused() {
        assert_refused(
            |c| {
                c.execute_batch("CREATE VIEW everything AS SELECT * FROM objects;")
                    .unwrap()
            },
            &["view `everything`"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_store_without_its_objects_table_is_refused() {
        assert_refused(
            |c| c.execute_batch("DROP TABLE objects;").unwrap(),
            &["missing", "table `objects`"],
        )
        .await;
    }

    #[tokio::test]
    async fn an_extra_table_or_index_is_refused() {
        assert_refused(
            |c| c.execute_batch("CREATE TABLE notes (x TEXT);").unwrap(),
            &["table `notes`"],
        )
        .await;
        assert_refused(
            |c| {
                c.execute_batch("CREATE INDEX by_body ON objects (body);")
                    .unwrap()
            },
            &["index `by_body`"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_table_of_ours_with_other_columns_is_refused() {
        assert_refused(
            |c| {
                c.execute_batch(
                    "DROP TABLE meta; \
                     CREATE TABLE meta (key TEXT PRIMARY KEY, value ANY) WITHOUT ROWID; \
                     INSERT INTO meta VALUES ('revision', 5);",
                )
                .unwrap()
            },
            &["table `meta`"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_newer_schema_version_is_refused() {
        assert_refused(
            |c| c.execute_batch("PRAGMA user_version = 2;").unwrap(),
            &["schema version 2", "newer"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_row_with_broken_json_is_refused() {
        assert_refused(
            |c| {
                c.execute(
                    "INSERT INTO objects (kind, namespace, name, resource_version, body) \
                     VALUES ('Client', 'default', 'carol', 1, '{\"metadata\": {')",
                    [],
                )
                .unwrap();
            },
            &["Client default/carol", "JSON"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_client_with_an_invalid_name_is_refused() {
        assert_refused(
            |c| insert(c, Client::new("x$(id)", ClientSpec::default())),
            &["Client default/x$(id)", "metadata.name"],
        )
        .await;
    }

    #[tokio::test]
    async fn an_exporter_with_3000_labels_of_4_kb_is_refused() {
        assert_refused(
            |c| {
                let mut e = Exporter::new("flood", ExporterSpec::default());
                e.metadata.labels = Some(
                    (0..3000)
                        .map(|i| (format!("k{i}"), "v".repeat(4096)))
                        .collect(),
                );
                insert(c, e);
            },
            &["Exporter default/flood", "metadata.labels", "3000", "128"],
        )
        .await;
    }

    #[tokio::test]
    async fn rows_unlike_their_body_and_bad_leases_policies_or_meta_are_refused() {
        // A body under another object's key: the store writes both alike.
        assert_refused(
            |c| {
                c.execute(
                    "UPDATE objects SET name = 'mallory' WHERE kind = 'Client' AND name = 'bob'",
                    [],
                )
                .unwrap();
            },
            &["Client default/mallory", "metadata.name", "\"bob\""],
        )
        .await;
        // Client names reach the exporter's hooks through the lease.
        assert_refused(
            |c| {
                let mut l = Lease::new("lease-2", Default::default());
                l.spec.client_ref.name = "x$(id)".into();
                insert(c, l);
            },
            &["Lease default/lease-2", "spec.clientRef.name"],
        )
        .await;
        assert_refused(
            |c| {
                let mut l = Lease::new("lease-3", Default::default());
                l.spec.client_ref.name = "alice".into();
                l.metadata.labels = Some([("admin".to_string(), "yes".to_string())].into());
                insert(c, l);
            },
            &["Lease default/lease-3", "metadata.labels", "\"admin\""],
        )
        .await;
        assert_refused(
            |c| {
                let mut p = ExporterAccessPolicy::new("odd", Default::default());
                p.spec.exporter_selector.match_expressions = Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "board".into(),
                        operator: "Near".into(),
                        values: None,
                    },
                ]);
                insert(c, p);
            },
            &[
                "ExporterAccessPolicy default/odd",
                "spec.exporterSelector",
                "\"Near\"",
            ],
        )
        .await;
        assert_refused(
            |c| {
                c.execute("INSERT INTO meta (key, value) VALUES ('owner', 1)", [])
                    .unwrap();
            },
            &["table `meta`", "\"owner\""],
        )
        .await;
    }

    #[tokio::test]
    async fn a_backup_that_is_a_symlink_or_no_regular_file_is_refused() {
        let s = seeded().await;
        let before = snapshot(&s.data);
        let link = s.backup.with_file_name("latest.db");
        std::os::unix::fs::symlink(&s.backup, &link).unwrap();
        let e = jumpstarter_core::error_chain(&restore(&s.data, &link).unwrap_err());
        assert!(
            e.contains("latest.db") && e.contains("symbolic link"),
            "{e}"
        );
        let dir = s.backup.with_file_name("a-directory.db");
        std::fs::create_dir(&dir).unwrap();
        let e = jumpstarter_core::error_chain(&restore(&s.data, &dir).unwrap_err());
        assert!(
            e.contains("a-directory.db") && e.contains("a directory"),
            "{e}"
        );
        assert_eq!(snapshot(&s.data), before, "the live store was changed");
    }
}
