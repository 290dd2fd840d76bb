//! `jumpstarter-controller backup FILE` and `restore FILE`: a consistent copy of the SQLite
//! store, taken while the controller runs (SQLite's `VACUUM INTO`, which reads one snapshot
//! of the database like the online backup API), and putting such a copy back while it is
//! stopped. Both check the database with `PRAGMA quick_check` first.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use crate::store::sqlite::DB_FILE;

/// Why a backup or restore failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The file exists already (a backup never overwrites one).
    #[error("{} exists already; choose a new file name", .0.display())]
    Exists(PathBuf),
    /// The database could not be read or written.
    #[error("{}: {reason}", path.display())]
    Database {
        /// The database file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn db_err(path: &Path) -> impl Fn(rusqlite::Error) -> BackupError + '_ {
    move |e| BackupError::Database {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
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
    // The copy is checked like a store about to be restored.
    open_checked(file).map(drop)
}

/// Replaces the store in `data_dir` by the backup `file` (stop the controller first). The
/// old store, if any, is kept beside it as `store.db.before-restore-<unix time>`.
pub fn restore(data_dir: &Path, file: &Path) -> Result<PathBuf, BackupError> {
    drop(open_checked(file)?);
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| BackupError::Io { what, path, source }
    };
    std::fs::create_dir_all(data_dir).map_err(io("cannot create", data_dir))?;
    let db = data_dir.join(DB_FILE);
    let staged = data_dir.join(format!("{DB_FILE}.restoring"));
    std::fs::copy(file, &staged).map_err(io("cannot copy the backup to", &staged))?;
    std::fs::File::open(&staged)
        .and_then(|f| f.sync_all())
        .map_err(io("cannot sync", &staged))?;
    if db.exists() {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let kept = data_dir.join(format!("{DB_FILE}.before-restore-{stamp}"));
        std::fs::rename(&db, &kept).map_err(io("cannot move the old store to", &kept))?;
    }
    for side in ["-wal", "-shm"] {
        let p = data_dir.join(format!("{DB_FILE}{side}"));
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("cannot remove", &p)(e)),
        }
    }
    std::fs::rename(&staged, &db).map_err(io("cannot put the backup in place at", &db))?;
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        objects::{Client, ClientSpec, selector::LabelSelector},
        store::{ListParams, SqliteStore, Store},
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
        let e = restore(&data, &junk).unwrap_err().to_string();
        assert!(e.contains("junk.db"), "{e}");
        let other = tmp.path().join("other.db");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER);")
            .unwrap();
        let e = restore(&data, &other).unwrap_err().to_string();
        assert!(e.contains("not a Jumpstarter controller store"), "{e}");
        assert!(!data.join(DB_FILE).exists());
        let e = restore(&data, &tmp.path().join("missing.db"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such file"), "{e}");
    }
}
