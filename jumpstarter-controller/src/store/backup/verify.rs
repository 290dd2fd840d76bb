//! What a restore checks of a backup before it replaces the store: that it is a store this
//! controller could have written itself.
//!
//! - **Undamaged**: `PRAGMA integrity_check` (the full check, not only `quick_check`).
//! - **Our schema version** (`PRAGMA user_version`): a newer one is refused, as the store
//!   refuses it at start.
//! - **Our schema and nothing else**: the tables, indexes, triggers and views of the backup
//!   (`sqlite_master`) must be exactly those that the store creates, learnt by creating them
//!   in an empty in-memory database with the store's own [`sqlite::migrate`]. A trigger
//!   would run inside the controller's next write (one deleting every Client on the next
//!   insert used to be restored and served), a view or an extra table or index is nothing the
//!   controller made.
//! - **`meta`**: one row, the store revision, a non-negative integer.
//! - **Every object** as the API would have accepted it: the key rule of every store write
//!   ([`sqlite::key_problem`]), a body that decodes to its kind and agrees with its row, and
//!   the limits and label rules of the services that create and update it
//!   ([`crate::service::limits`], the Kubernetes name and label checks of
//!   [`crate::objects::selector`], [`validate_lease_tags`], [`lease_labels_with`]).
//!
//! The first problem found is the error; it names the table, trigger or view, or the object
//! (kind, namespace, name) and its field.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use rusqlite::{Connection, OpenFlags, types::ValueRef};
use serde_json::Value;

use super::error::{BackupError, ObjectProblem};
use crate::{
    objects::{
        Client, Exporter, ExporterAccessPolicy, Lease, RESERVED_LABEL_PREFIX, lease_labels_with,
        selector::{
            LabelSelector, validate_dns1123_subdomain, validate_label_value,
            validate_qualified_name,
        },
        validate_lease_tags,
    },
    service::limits::{
        self, MAX_IDENTIFIER, MAX_LABEL_TEXT, MAX_LABELS, MAX_REPORTS, MAX_RULES, MAX_SELECTOR,
        MAX_TEXT,
    },
    store::{
        StoreObject,
        sqlite::{self, SCHEMA_VERSION},
    },
};

/// [`ObjectProblem::Limit`] of a limit check's refusal.
fn over_limit(status: tonic::Status) -> ObjectProblem {
    ObjectProblem::Limit(Box::new(status))
}

impl ObjectProblem {
    fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ObjectProblem::Field {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Checks the database `db` (a staged copy of the backup `shown`, which errors name) as
/// described in the module documentation.
pub(super) fn restorable(db: &Path, shown: &Path) -> Result<(), BackupError> {
    let database = |reason: String| BackupError::Database {
        path: shown.to_path_buf(),
        reason,
    };
    let sql = |e: rusqlite::Error| database(e.to_string());
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(sql)?;
    // Nothing of the backup's schema may run SQL functions with side effects while we read.
    conn.execute_batch("PRAGMA trusted_schema = OFF; PRAGMA query_only = ON;")
        .map_err(sql)?;
    let found: Vec<String> = conn
        .prepare("PRAGMA integrity_check(20)")
        .and_then(|mut s| {
            s.query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(sql)?;
    if found != ["ok"] {
        return Err(database(format!(
            "damaged (PRAGMA integrity_check: {})",
            found.join("; ")
        )));
    }
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(sql)?;
    if version != SCHEMA_VERSION {
        return Err(BackupError::SchemaVersion {
            path: shown.to_path_buf(),
            found: version,
        });
    }
    let problems = schema_differences(&conn, shown)?;
    if !problems.is_empty() {
        return Err(BackupError::Schema {
            path: shown.to_path_buf(),
            problems,
        });
    }
    let revision = meta_revision(&conn, shown)?;
    check_objects(&conn, revision, shown)
}

/// One entry of `sqlite_master`.
#[derive(Debug, PartialEq, Eq)]
struct SchemaEntry {
    kind: String,
    table: String,
    sql: Option<String>,
}

/// `sqlite_master` by name.
fn schema_of(conn: &Connection) -> rusqlite::Result<BTreeMap<String, SchemaEntry>> {
    conn.prepare("SELECT name, type, tbl_name, sql FROM sqlite_master")?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                SchemaEntry {
                    kind: row.get(1)?,
                    table: row.get(2)?,
                    sql: row.get(3)?,
                },
            ))
        })?
        .collect()
}

/// How the backup's schema differs from the one the store creates (empty: it does not).
fn schema_differences(conn: &Connection, shown: &Path) -> Result<Vec<String>, BackupError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| BackupError::Database {
        path: shown.to_path_buf(),
        reason: format!("{what}: {e}"),
    };
    let ours = "cannot create the store's schema to compare with";
    let mut fresh = Connection::open_in_memory().map_err(|e| failed(ours, &e))?;
    sqlite::migrate(&mut fresh).map_err(|e| failed(ours, &e))?;
    let expected = schema_of(&fresh).map_err(|e| failed(ours, &e))?;
    let found = schema_of(conn).map_err(|e| failed("cannot read its schema", &e))?;
    let mut problems = Vec::new();
    for (name, entry) in &found {
        match expected.get(name) {
            None if entry.table == *name => problems.push(format!(
                "{} `{name}` is not part of the store's schema",
                entry.kind
            )),
            None => problems.push(format!(
                "{} `{name}` (on table `{}`) is not part of the store's schema",
                entry.kind, entry.table
            )),
            Some(ours) if ours != entry => problems.push(format!(
                "{} `{name}` is not the store's: {}",
                entry.kind,
                shorten(entry.sql.as_deref().unwrap_or("(no SQL)"), 200)
            )),
            Some(_) => {}
        }
    }
    for (name, entry) in &expected {
        if !found.contains_key(name) {
            problems.push(format!("{} `{name}` is missing", entry.kind));
        }
    }
    Ok(problems)
}

/// The store revision from `meta`, which must hold it alone.
fn meta_revision(conn: &Connection, shown: &Path) -> Result<u64, BackupError> {
    let bad = |reason: String| BackupError::Meta {
        path: shown.to_path_buf(),
        reason,
    };
    let sql = |e: rusqlite::Error| bad(e.to_string());
    let mut stmt = conn.prepare("SELECT key, value FROM meta").map_err(sql)?;
    let mut rows = stmt.query([]).map_err(sql)?;
    let mut revision = None;
    while let Some(row) = rows.next().map_err(sql)? {
        let key = row.get_ref(0).map_err(sql)?;
        let value = row.get_ref(1).map_err(sql)?;
        match (key, value) {
            (ValueRef::Text(b"revision"), ValueRef::Integer(n)) if revision.is_none() => {
                revision = Some(
                    u64::try_from(n).map_err(|_| bad(format!("the revision {n} is negative")))?,
                );
            }
            (ValueRef::Text(b"revision"), value) if revision.is_none() => {
                return Err(bad(format!(
                    "the revision is {}, not an integer",
                    describe(value)
                )));
            }
            (key, _) => {
                return Err(bad(format!(
                    "unexpected row with key {} (the store keeps only its revision there)",
                    describe(key)
                )));
            }
        }
    }
    revision.ok_or_else(|| bad("the store revision is missing".into()))
}

/// Checks every row of `objects` (see [`check_row`]).
fn check_objects(conn: &Connection, revision: u64, shown: &Path) -> Result<(), BackupError> {
    let sql = |e: rusqlite::Error| BackupError::Database {
        path: shown.to_path_buf(),
        reason: e.to_string(),
    };
    let mut stmt = conn
        .prepare("SELECT kind, namespace, name, resource_version, body FROM objects")
        .map_err(sql)?;
    let mut rows = stmt.query([]).map_err(sql)?;
    while let Some(row) = rows.next().map_err(sql)? {
        let cells = [0, 1, 2, 3, 4].map(|i| row.get_ref(i));
        let [kind, namespace, name, rv, body] = cells;
        let (kind, namespace, name, rv, body) = (
            kind.map_err(sql)?,
            namespace.map_err(sql)?,
            name.map_err(sql)?,
            rv.map_err(sql)?,
            body.map_err(sql)?,
        );
        check_row(kind, namespace, name, rv, body, revision).map_err(|problem| {
            BackupError::Object {
                path: shown.to_path_buf(),
                kind: shown_text(kind),
                namespace: shown_text(namespace),
                name: shown_text(name),
                problem: Box::new(problem),
            }
        })?;
    }
    Ok(())
}

/// A text column's value as UTF-8.
fn text<'a>(column: &'static str, value: ValueRef<'a>) -> Result<&'a str, ObjectProblem> {
    let wrong = |found: String| ObjectProblem::Column {
        column,
        found,
        expected: "UTF-8 text",
    };
    match value {
        ValueRef::Text(bytes) => {
            std::str::from_utf8(bytes).map_err(|_| wrong("text that is not UTF-8".into()))
        }
        other => Err(wrong(describe(other))),
    }
}

/// One row of `objects`: its key, its resource version, and its body as the API would have
/// accepted it.
fn check_row(
    kind: ValueRef<'_>,
    namespace: ValueRef<'_>,
    name: ValueRef<'_>,
    rv: ValueRef<'_>,
    body: ValueRef<'_>,
    revision: u64,
) -> Result<(), ObjectProblem> {
    let kind = text("kind", kind)?;
    let namespace = text("namespace", namespace)?;
    let name = text("name", name)?;
    let body = text("body", body)?;
    if let Some(problem) = sqlite::key_problem(namespace, name) {
        return Err(ObjectProblem::Key(problem));
    }
    let rv = match rv {
        ValueRef::Integer(n) if n >= 1 && n.unsigned_abs() <= revision => n.unsigned_abs(),
        ValueRef::Integer(n) => {
            return Err(ObjectProblem::Column {
                column: "resource_version",
                found: n.to_string(),
                expected: "a revision of the store (1 up to its revision in `meta`)",
            });
        }
        other => {
            return Err(ObjectProblem::Column {
                column: "resource_version",
                found: describe(other),
                expected: "an integer",
            });
        }
    };
    let value: Value = serde_json::from_str(body).map_err(ObjectProblem::NotJson)?;
    let row = Row {
        namespace,
        name,
        rv,
    };
    match kind {
        "Client" => row.decode::<Client>(value).and_then(|c| check_client(&c)),
        "Exporter" => row
            .decode::<Exporter>(value)
            .and_then(|e| check_exporter(&e)),
        "Lease" => row.decode::<Lease>(value).and_then(|l| check_lease(&l)),
        "ExporterAccessPolicy" => row
            .decode::<ExporterAccessPolicy>(value)
            .and_then(|p| check_policy(&p)),
        other => Err(ObjectProblem::UnknownKind(other.to_owned())),
    }
}

/// The key and revision of a row, which its body must repeat.
struct Row<'a> {
    namespace: &'a str,
    name: &'a str,
    rv: u64,
}

impl Row<'_> {
    /// The body as a `K`, after checking that it says what the row says (kind, apiVersion,
    /// namespace, name, resourceVersion), as the store writes it.
    fn decode<K: StoreObject>(&self, value: Value) -> Result<K, ObjectProblem> {
        let kind = K::kind(&());
        let api_version = K::api_version(&());
        let rv = self.rv.to_string();
        for (field, want) in [
            ("kind", kind.as_ref()),
            ("apiVersion", api_version.as_ref()),
        ] {
            let found = value.get(field).and_then(Value::as_str);
            if found != Some(want) {
                return Err(mismatch(field, found, want));
            }
        }
        let meta = value.get("metadata");
        for (field, want) in [
            ("namespace", self.namespace),
            ("name", self.name),
            ("resourceVersion", rv.as_str()),
        ] {
            let found = meta.and_then(|m| m.get(field)).and_then(Value::as_str);
            if found != Some(want) {
                return Err(mismatch(&format!("metadata.{field}"), found, want));
            }
        }
        serde_json::from_value(value).map_err(|source| ObjectProblem::Decode {
            kind: kind.into_owned(),
            source,
        })
    }
}

fn mismatch(field: &str, found: Option<&str>, want: &str) -> ObjectProblem {
    let found = found.map_or_else(|| "missing".to_owned(), |f| format!("{:?}", shorten(f, 64)));
    ObjectProblem::field(
        field,
        format!("{found}, but the row is {want:?} (the store writes both alike)"),
    )
}

/// A label map as AdminService's CreateClient and CreateExporter accept it: at most
/// [`MAX_LABELS`], keys qualified names, values label values.
fn admin_labels<'a>(
    field: &str,
    labels: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
) -> Result<(), ObjectProblem> {
    limits::check_count(field, labels.len(), MAX_LABELS).map_err(over_limit)?;
    for (k, v) in labels {
        validate_qualified_name(k).map_err(|e| {
            ObjectProblem::field(field, format!("label key {:?}: {e}", shorten(k, 64)))
        })?;
        validate_label_value(v).map_err(|e| {
            ObjectProblem::field(
                field,
                format!(
                    "value {:?} of label {:?}: {e}",
                    shorten(v, 64),
                    shorten(k, 64)
                ),
            )
        })?;
    }
    Ok(())
}

/// A reference to another object by name (a Client, an Exporter, a Lease), which the API
/// takes only from objects it named by the same rule.
fn reference(field: &str, name: &str) -> Result<(), ObjectProblem> {
    validate_dns1123_subdomain(name).map_err(|e| ObjectProblem::field(field, e))
}

/// A stored selector as the API accepts one: it parses, and it could have been sent within
/// [`MAX_SELECTOR`] bytes.
fn selector(field: &str, sel: &metav1::LabelSelector) -> Result<(), ObjectProblem> {
    let parsed = LabelSelector::from_k8s(sel).map_err(|source| ObjectProblem::Selector {
        field: field.to_owned(),
        source,
    })?;
    // The shortest text it can come from: every requirement names its key and each of its
    // values at least once, and requirements are separated by commas. (Its printed form can be
    // longer than what was sent: `a!=x,b!=y` is stored as `a notin (x),b notin (y)`.)
    let requirements = parsed.requirements();
    let shortest = requirements
        .iter()
        .map(|r| r.key.len() + r.values.iter().map(String::len).sum::<usize>())
        .sum::<usize>()
        + requirements.len().saturating_sub(1);
    if shortest > MAX_SELECTOR {
        return Err(ObjectProblem::field(
            field,
            format!(
                "{} requirements that take at least {shortest} bytes as text (the API accepts \
                 selectors of at most {MAX_SELECTOR})",
                requirements.len()
            ),
        ));
    }
    Ok(())
}

/// What any admin-created username is held to (AdminService).
fn username(field: &str, username: Option<&String>) -> Result<(), ObjectProblem> {
    let username = username.map_or("", String::as_str);
    limits::check_len(field, username, MAX_TEXT).map_err(over_limit)
}

fn check_client(c: &Client) -> Result<(), ObjectProblem> {
    let none = BTreeMap::new();
    admin_labels(
        "metadata.labels",
        c.metadata.labels.as_ref().unwrap_or(&none).iter(),
    )?;
    username("spec.username", c.spec.username.as_ref())
}

/// An exporter: the labels an admin set (CreateExporter's rules) and those it reported
/// itself under `jumpstarter.dev/` (Register's limits), and its registration (Register's and
/// ReportStatus's limits).
fn check_exporter(e: &Exporter) -> Result<(), ObjectProblem> {
    let (reported, admin): (BTreeMap<_, _>, BTreeMap<_, _>) = e
        .label_map()
        .iter()
        .partition(|(k, _)| k.starts_with(RESERVED_LABEL_PREFIX));
    admin_labels("metadata.labels", admin.into_iter())?;
    limits::check_labels(
        &format!("metadata.labels (those under {RESERVED_LABEL_PREFIX}, reported by the exporter)"),
        reported.into_iter(),
        MAX_LABEL_TEXT,
    )
    .map_err(over_limit)?;
    username("spec.username", e.spec.username.as_ref())?;
    let Some(status) = &e.status else {
        return Ok(());
    };
    limits::check_len("status.statusMessage", &status.status_message, MAX_TEXT)
        .map_err(over_limit)?;
    if let Some(lease) = &status.lease_ref {
        reference("status.leaseRef.name", &lease.name)?;
    }
    let devices = status.devices.as_deref().unwrap_or_default();
    limits::check_count("status.devices", devices.len(), MAX_REPORTS).map_err(over_limit)?;
    for (i, d) in devices.iter().enumerate() {
        let field = |f: &str| format!("status.devices[{i}].{f}");
        limits::check_len(&field("uuid"), &d.uuid, MAX_IDENTIFIER).map_err(over_limit)?;
        limits::check_len(
            &field("parent_uuid"),
            d.parent_uuid.as_deref().unwrap_or_default(),
            MAX_IDENTIFIER,
        )
        .map_err(over_limit)?;
        limits::check_labels(&field("labels"), d.labels.iter(), MAX_LABEL_TEXT)
            .map_err(over_limit)?;
    }
    Ok(())
}

/// A lease as CreateLease builds it: a selector and tags it accepts, references to objects by
/// name, and no label but those the controller derives from the lease
/// ([`lease_labels_with`]: the selector's matchLabels, the tags, the ended mark).
fn check_lease(l: &Lease) -> Result<(), ObjectProblem> {
    selector("spec.selector", &l.spec.selector)?;
    validate_lease_tags(&l.spec.tags, MAX_LABELS).map_err(ObjectProblem::Tags)?;
    reference("spec.clientRef.name", &l.spec.client_ref.name)?;
    crate::objects::sharing::shared_names(
        &l.spec.shared_with,
        l.metadata.namespace.as_deref().unwrap_or_default(),
        &l.spec.client_ref.name,
    )
    .map_err(|e| ObjectProblem::field("spec.sharedWith", e.to_string()))?;
    if let Some(e) = &l.spec.exporter_ref {
        reference("spec.exporterRef.name", &e.name)?;
    }
    if let Some(e) = l.status.as_ref().and_then(|s| s.exporter_ref.as_ref()) {
        reference("status.exporterRef.name", &e.name)?;
    }
    let mut bare = l.clone();
    bare.metadata.labels = None;
    let derived = [false, true].map(|ended| lease_labels_with(&bare, ended));
    for (k, v) in l.metadata.labels.iter().flatten() {
        if !derived.iter().any(|d| d.get(k) == Some(v)) {
            return Err(ObjectProblem::field(
                "metadata.labels",
                format!(
                    "label {:?}={:?} is not one the controller derives from the lease's \
                     selector, tags and state",
                    shorten(k, 64),
                    shorten(v, 64)
                ),
            ));
        }
    }
    Ok(())
}

/// An access policy as AdminService's CreateAccessPolicy accepts it.
fn check_policy(p: &ExporterAccessPolicy) -> Result<(), ObjectProblem> {
    let none = BTreeMap::new();
    admin_labels(
        "metadata.labels",
        p.metadata.labels.as_ref().unwrap_or(&none).iter(),
    )?;
    selector("spec.exporterSelector", &p.spec.exporter_selector)?;
    limits::check_count("spec.policies", p.spec.policies.len(), MAX_RULES).map_err(over_limit)?;
    for (i, rule) in p.spec.policies.iter().enumerate() {
        let field = |f: &str| format!("spec.policies[{i}].{f}");
        limits::check_len(&field("description"), &rule.description, MAX_TEXT)
            .map_err(over_limit)?;
        limits::check_count(&field("from"), rule.from.len(), MAX_RULES).map_err(over_limit)?;
        for (j, from) in rule.from.iter().enumerate() {
            selector(
                &field(&format!("from[{j}].clientSelector")),
                &from.client_selector,
            )?;
        }
        if let Some(d) = rule.maximum_duration
            && !d.0.is_positive()
        {
            return Err(ObjectProblem::field(
                field("maximumDuration"),
                format!("must be positive, got {d}"),
            ));
        }
    }
    Ok(())
}

/// A column's value for messages (its type, and a short text).
fn describe(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(n) => format!("the integer {n}"),
        ValueRef::Real(x) => format!("the real {x}"),
        ValueRef::Text(b) => format!("the text {:?}", shorten(&String::from_utf8_lossy(b), 64)),
        ValueRef::Blob(b) => format!("a blob of {} bytes", b.len()),
    }
}

/// A key column as shown in an error naming the object (whatever it holds).
fn shown_text(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Text(b) => shorten(&String::from_utf8_lossy(b), 253).into_owned(),
        other => format!("<{}>", describe(other)),
    }
}

/// `s`, cut after `max` bytes (at a character boundary) with `…` when longer.
fn shorten(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}
