//! What can go wrong with a backup or a restore.

use std::path::PathBuf;

use crate::{
    objects::{ObjectError, selector::SelectorError},
    store::sqlite::SCHEMA_VERSION,
};

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
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The backup given is not a regular file (a symbolic link, a directory, a pipe…): a
    /// restore reads only the file itself, so that what it checks is what it copies.
    #[error(
        "{} is {found}, not a regular file; give the path of the backup file itself",
        path.display()
    )]
    NotARegularFile {
        /// The path given.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// The backup's schema version (`PRAGMA user_version`) is not this controller's.
    #[error("{}: {}", path.display(), version_problem(*found))]
    SchemaVersion {
        /// The backup.
        path: PathBuf,
        /// Its version.
        found: i64,
    },
    /// The backup's tables, indexes, triggers or views are not exactly the store's.
    #[error(
        "{}: not this controller's store schema, refused: {}",
        path.display(),
        problems.join("; ")
    )]
    Schema {
        /// The backup.
        path: PathBuf,
        /// Each difference, naming the table, index, trigger or view.
        problems: Vec<String>,
    },
    /// The `meta` table does not hold just the store revision.
    #[error("{}: table `meta`: {reason}", path.display())]
    Meta {
        /// The backup.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An object of the backup is one the API would have refused.
    #[error("{}: {kind} {namespace}/{name}", path.display())]
    Object {
        /// The backup.
        path: PathBuf,
        /// The object's kind (its row's `kind`).
        kind: String,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What is wrong, naming the field.
        #[source]
        problem: Box<ObjectProblem>,
    },
}

/// Why one object of a backup would not have been accepted by the API.
#[derive(Debug, thiserror::Error)]
pub enum ObjectProblem {
    /// A kind the controller does not store.
    #[error(
        "kind {0:?} is not one this controller stores (Client, Exporter, Lease, \
         ExporterAccessPolicy)"
    )]
    UnknownKind(String),
    /// A column of its row holds the wrong type of value.
    #[error("column `{column}` of table `objects` holds {found}, not {expected}")]
    Column {
        /// The column.
        column: &'static str,
        /// What it holds.
        found: String,
        /// What the store writes there.
        expected: &'static str,
    },
    /// The body is not JSON.
    #[error("the body is not JSON")]
    NotJson(#[source] serde_json::Error),
    /// The body is JSON but not an object of its kind.
    #[error("the body is not a valid {kind}")]
    Decode {
        /// The row's kind.
        kind: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The namespace or name breaks the rule every store write applies.
    #[error("{0}")]
    Key(&'static str),
    /// Over a size or count limit of the API (the message names the field and the limit).
    #[error("{}", .0.message())]
    Limit(Box<tonic::Status>),
    /// A field that the API would have refused.
    #[error("{field}: {reason}")]
    Field {
        /// The field, as a JSON path (`metadata.labels`, `spec.policies[0].description`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A label selector that the API would not have parsed.
    #[error("{field}")]
    Selector {
        /// The field holding the selector.
        field: String,
        /// What is wrong with it.
        #[source]
        source: SelectorError,
    },
    /// Lease tags that CreateLease would have refused.
    #[error("spec.tags")]
    Tags(#[source] ObjectError),
}

/// What is wrong with schema version `found` (it is not [`SCHEMA_VERSION`]).
fn version_problem(found: i64) -> String {
    if found == 0 {
        "not a Jumpstarter controller store (schema version 0: no store schema)".into()
    } else if found > SCHEMA_VERSION {
        format!(
            "schema version {found} is newer than this controller's ({SCHEMA_VERSION}); \
             restore it with the controller version that wrote it, or a newer one"
        )
    } else {
        format!("schema version {found} is not one this controller reads ({SCHEMA_VERSION})")
    }
}
