//! Tests of the store semantics. The generic ones run against every backend (see
//! `store_suite!` at the end): SQLite, and the Kubernetes store over the in-memory fake API
//! server. The rest are about SQLite's files.

use std::collections::BTreeMap;

use futures::StreamExt;
use kube::{CustomResource, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;
use crate::objects::selector::LabelSelector;

/// A small namespaced kind with a status subresource, standing in for the controller kinds.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "test.jumpstarter.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    derive = "PartialEq"
)]
pub struct WidgetSpec {
    size: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WidgetStatus {
    phase: String,
}

/// Another Rust type for the Widget kind (only `size` of its spec): a watcher of it cannot
/// take the writer's object and decodes the stored JSON instead.
mod other {
    use super::*;
    #[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "test.jumpstarter.dev",
        version = "v1",
        kind = "Widget",
        namespaced,
        status = "SlimStatus"
    )]
    pub struct SlimSpec {
        pub size: u32,
    }
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct SlimStatus {}
}

#[tokio::test]
async fn a_watcher_of_another_type_of_the_kind_decodes_the_stored_json() {
    use futures::FutureExt;
    let (_dir, store) = open().await;
    let mut typed = store.watch::<Widget>(Some("lab"), None).await.unwrap();
    let mut other = store
        .watch::<other::Widget>(Some("lab"), None)
        .await
        .unwrap();
    let made = store.create(&widget("lab", "w", 7, &[])).await.unwrap();
    let ev = typed.next().now_or_never().unwrap().unwrap().unwrap();
    assert_eq!(ev.object(), &made);
    let ev = other.next().now_or_never().unwrap().unwrap().unwrap();
    assert_eq!(ev.object().spec.size, 7);
    assert_eq!(ev.object().metadata, made.metadata);
}

fn widget(ns: &str, name: &str, size: u32, labels: &[(&str, &str)]) -> Widget {
    let mut w = Widget::new(name, WidgetSpec { size });
    w.metadata.namespace = Some(ns.into());
    if !labels.is_empty() {
        w.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    w
}

fn rv(w: &Widget) -> u64 {
    w.meta()
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

fn all() -> LabelSelector {
    LabelSelector::everything()
}

async fn open() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).await.unwrap();
    (dir, store)
}

async fn create_get_update_delete<S: Store>(store: S) {
    let mut w = widget("lab", "w1", 1, &[("env", "dev")]);
    w.status = Some(WidgetStatus {
        phase: "ignored on create".into(),
    });
    let created = store.create(&w).await.unwrap();
    let meta = created.meta();
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    // The first write of a fresh store; a cluster's revisions count every write before it.
    assert!(rv(&created) >= 1);
    assert_eq!(created.status, None, "create must drop status");
    assert_eq!(
        store.get::<Widget>("lab", "w1").await.unwrap().as_ref(),
        Some(&created)
    );
    assert_eq!(store.get::<Widget>("lab", "nope").await.unwrap(), None);
    assert_eq!(store.get::<Widget>("other", "w1").await.unwrap(), None);

    let err = store.create(&w).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    assert!(
        jumpstarter_core::error_chain(&err).contains("Widget lab/w1"),
        "{err}"
    );

    // Spec change: generation and resourceVersion move; status stays what update_status wrote.
    let mut s = created.clone();
    s.status = Some(WidgetStatus {
        phase: "Ready".into(),
    });
    let with_status = store.update_status(&s).await.unwrap();
    assert_eq!(with_status.status.as_ref().unwrap().phase, "Ready");
    assert_eq!(with_status.meta().generation, Some(1));
    assert!(rv(&with_status) > rv(&created));

    let mut u = with_status.clone();
    u.spec.size = 2;
    u.status = None; // update ignores status
    u.metadata.uid = Some("forged".into());
    let updated = store.update(&u).await.unwrap();
    assert_eq!(updated.spec.size, 2);
    assert_eq!(updated.meta().generation, Some(2));
    assert_eq!(updated.meta().uid, created.meta().uid);
    assert_eq!(updated.status.as_ref().unwrap().phase, "Ready");
    assert!(rv(&updated) > rv(&with_status));

    // Label-only change: new resourceVersion, same generation.
    let mut l = updated.clone();
    l.metadata.labels = Some([("env".to_string(), "prod".to_string())].into());
    let relabeled = store.update(&l).await.unwrap();
    assert_eq!(relabeled.meta().generation, Some(2));
    assert!(rv(&relabeled) > rv(&updated));

    // An update that changes nothing keeps the resourceVersion.
    let same = store.update(&relabeled).await.unwrap();
    assert_eq!(rv(&same), rv(&relabeled));

    let deleted: Widget = store.delete("lab", "w1", None).await.unwrap();
    assert_eq!(deleted.spec.size, 2);
    // The deletion's revision or, where the server answers a delete with a Status (a real
    // API server for custom resources), the version that was deleted.
    assert!(rv(&deleted) >= rv(&relabeled));
    assert_eq!(deleted.metadata.uid, relabeled.metadata.uid);
    assert_eq!(store.get::<Widget>("lab", "w1").await.unwrap(), None);
    let err = store.delete::<Widget>("lab", "w1", None).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = store.update(&relabeled).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

async fn stale_resource_versions_conflict<S: Store>(store: S) {
    let v1 = store.create(&widget("lab", "w", 1, &[])).await.unwrap();
    let mut a = v1.clone();
    a.spec.size = 10;
    let v2 = store.update(&a).await.unwrap();

    let mut stale = v1.clone();
    stale.spec.size = 20;
    let err = store.update(&stale).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert!(
        jumpstarter_core::error_chain(&err).contains("the object has been modified"),
        "{err}"
    );
    stale.status = Some(WidgetStatus::default());
    assert!(store.update_status(&stale).await.unwrap_err().is_conflict());
    let err = store
        .delete::<Widget>("lab", "w", v1.meta().resource_version.as_deref())
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    // The failed writes changed nothing.
    assert_eq!(store.get::<Widget>("lab", "w").await.unwrap().unwrap(), v2);

    let mut no_rv = v2.clone();
    no_rv.metadata.resource_version = None;
    let err = store.update(&no_rv).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");

    store
        .delete::<Widget>("lab", "w", v2.meta().resource_version.as_deref())
        .await
        .unwrap();
}

async fn concurrent_read_modify_write_loses_nothing<S: Store>(store: S) {
    store
        .create(&widget("lab", "counter", 0, &[]))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                loop {
                    let mut w: Widget = store.get("lab", "counter").await.unwrap().unwrap();
                    w.spec.size += 1;
                    match store.update(&w).await {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let w: Widget = store.get("lab", "counter").await.unwrap().unwrap();
    assert_eq!(w.spec.size, 40);
    assert_eq!(w.meta().generation, Some(41));
}

async fn list_by_namespace_selector_and_pages<S: Store>(store: S) {
    for (ns, name, env) in [
        ("a", "w1", "prod"),
        ("a", "w2", "dev"),
        ("a", "w3", "prod"),
        ("b", "w1", "prod"),
        ("b", "w4", "dev"),
    ] {
        store
            .create(&widget(ns, name, 1, &[("env", env)]))
            .await
            .unwrap();
    }
    let names = |l: &ObjectList<Widget>| -> Vec<String> {
        l.items
            .iter()
            .map(|w| {
                format!(
                    "{}/{}",
                    w.meta().namespace.as_deref().unwrap(),
                    w.meta().name.as_deref().unwrap()
                )
            })
            .collect()
    };
    let everything: ObjectList<Widget> = store
        .list(None, &all(), &ListParams::default())
        .await
        .unwrap();
    assert_eq!(names(&everything), ["a/w1", "a/w2", "a/w3", "b/w1", "b/w4"]);
    // At least the last write (a cluster's revision also counts other kinds' writes).
    let newest = everything.items.iter().map(rv).max().unwrap();
    assert!(everything.resource_version.parse::<u64>().unwrap() >= newest);
    assert_eq!(everything.continue_token, None);

    let prod = LabelSelector::parse("env=prod").unwrap();
    let in_a: ObjectList<Widget> = store
        .list(Some("a"), &prod, &ListParams::default())
        .await
        .unwrap();
    assert_eq!(names(&in_a), ["a/w1", "a/w3"]);

    // Pages of 2 over all prod widgets: [a/w1, a/w3], [b/w1].
    let page1: ObjectList<Widget> = store
        .list(
            None,
            &prod,
            &ListParams {
                limit: Some(2),
                continue_token: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(names(&page1), ["a/w1", "a/w3"]);
    let token = page1.continue_token.clone().unwrap();
    let page2: ObjectList<Widget> = store
        .list(
            None,
            &prod,
            &ListParams {
                limit: Some(2),
                continue_token: Some(token),
            },
        )
        .await
        .unwrap();
    assert_eq!(names(&page2), ["b/w1"]);
    assert_eq!(page2.continue_token, None);

    // An exact fit leaves no dangling token.
    let fit: ObjectList<Widget> = store
        .list(
            Some("a"),
            &prod,
            &ListParams {
                limit: Some(2),
                continue_token: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(fit.continue_token, None);

    let err = store
        .list::<Widget>(
            None,
            &all(),
            &ListParams {
                limit: None,
                continue_token: Some("garbage".into()),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
}

async fn watch_delivers_events_in_order_and_filters_namespace<S: Store>(store: S) {
    let mut all_ns = store.watch::<Widget>(None, None).await.unwrap();
    let mut only_a = store.watch::<Widget>(Some("a"), None).await.unwrap();

    let w = store.create(&widget("a", "w", 1, &[])).await.unwrap();
    store.create(&widget("b", "x", 1, &[])).await.unwrap();
    let mut u = w.clone();
    u.spec.size = 2;
    let u = store.update(&u).await.unwrap();
    let mut s = u.clone();
    s.status = Some(WidgetStatus { phase: "Up".into() });
    store.update_status(&s).await.unwrap();
    store.delete::<Widget>("a", "w", None).await.unwrap();

    let mut seen = Vec::new();
    for _ in 0..5 {
        let ev = all_ns.next().await.unwrap().unwrap();
        let tag = match &ev {
            WatchEvent::Added(_) => "added",
            WatchEvent::Modified(_) => "modified",
            WatchEvent::Deleted(_) => "deleted",
        };
        let o = ev.object();
        seen.push((tag, o.meta().name.clone().unwrap(), rv(o)));
    }
    // In commit order; a cluster's revisions also count writes of other kinds in between.
    let tags: Vec<(&str, String)> = seen.iter().map(|(t, n, _)| (*t, n.clone())).collect();
    assert_eq!(
        tags,
        [
            ("added", "w".to_string()),
            ("added", "x".to_string()),
            ("modified", "w".to_string()),
            ("modified", "w".to_string()),
            ("deleted", "w".to_string()),
        ]
    );
    assert!(seen.windows(2).all(|p| p[0].2 < p[1].2), "{seen:?}");
    assert_eq!(seen[2].2, rv(&u));
    let mut names_a = Vec::new();
    for _ in 0..4 {
        let ev = only_a.next().await.unwrap().unwrap();
        names_a.push(ev.object().meta().name.clone().unwrap());
    }
    assert_eq!(names_a, ["w", "w", "w", "w"]);
    if let WatchEvent::Modified(m) = store
        .watch::<Widget>(Some("a"), Some(&rv(&u).to_string()))
        .await
        .unwrap()
        .next()
        .await
        .unwrap()
        .unwrap()
    {
        assert_eq!(m.status.unwrap().phase, "Up");
    } else {
        panic!("expected the status change replayed after the update's revision");
    }
}

async fn list_then_watch_since_misses_nothing<S: Store>(store: S) {
    store.create(&widget("a", "before", 1, &[])).await.unwrap();
    let listed: ObjectList<Widget> = store
        .list(None, &all(), &ListParams::default())
        .await
        .unwrap();
    // Written between the list and the watch: must be replayed.
    store.create(&widget("a", "between", 1, &[])).await.unwrap();
    let mut watch = store
        .watch::<Widget>(None, Some(&listed.resource_version))
        .await
        .unwrap();
    store.create(&widget("a", "after", 1, &[])).await.unwrap();
    let first = watch.next().await.unwrap().unwrap();
    let second = watch.next().await.unwrap().unwrap();
    assert_eq!(first.object().meta().name.as_deref(), Some("between"));
    assert_eq!(second.object().meta().name.as_deref(), Some("after"));
}

/// `n` widgets `PREFIX-0`… created in namespace `a`, 64 at a time (one after the other, each
/// would be a disk sync of its own in the embedded store).
async fn create_many<S: Store>(store: &S, prefix: &str, n: usize) -> Vec<Widget> {
    use futures::TryStreamExt;
    futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            let name = format!("{prefix}-{i}");
            async move { store.create(&widget("a", &name, 0, &[])).await }
        })
        .buffer_unordered(64)
        .try_collect()
        .await
        .unwrap()
}

async fn slow_watcher_is_cut_off_and_writers_never_wait<S: Store>(store: S) {
    assert!(store.watch_buffer() >= WATCH_BUFFER);
    let mut slow = store.watch::<Widget>(None, None).await.unwrap();
    let started = std::time::Instant::now();
    // More writes than the watcher may fall behind.
    let written = create_many(&store, "busy", store.watch_buffer() + 10).await;
    assert_eq!(written.len(), store.watch_buffer() + 10);
    assert!(started.elapsed() < std::time::Duration::from_secs(120));
    let err = slow.next().await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::WatchLagged { .. }), "{err}");
    assert!(
        jumpstarter_core::error_chain(&err).contains("list again"),
        "{err}"
    );
    assert!(slow.next().await.is_none(), "a lagged watch ends");
    // Starting from a revision that has left the retained history fails the same way.
    let err = match store.watch::<Widget>(None, Some("1")).await {
        Err(e) => e,
        Ok(_) => panic!("watch from an evicted revision must fail"),
    };
    assert!(matches!(err, StoreError::WatchLagged { .. }), "{err}");
}

/// A bulk status write of more objects than the watch buffer, through `in_batches`, reaches
/// a watcher that catches up between calls (as the exporter cache does when its turn comes):
/// no call publishes more events than it may fall behind. In one call, the embedded store
/// published them all at once and cut every watcher of the kind off. The embedded store
/// only: its events are in the stream when a write returns, so the catching up is exact.
#[tokio::test]
async fn bulk_writes_in_batches_cut_no_watcher_off() {
    use futures::FutureExt;
    fn catch_up(watch: &mut WatchStream<Widget>, seen: &mut usize) {
        // Unconstrained: within tokio's budget the stream answers "not ready" after 128.
        while let Some(ev) = tokio::task::unconstrained(watch.next()).now_or_never() {
            match ev {
                Some(Ok(_)) => *seen += 1,
                Some(Err(e)) => panic!("the watcher was cut off: {e}"),
                None => panic!("the watch ended"),
            }
        }
    }
    let (_dir, store) = open().await;
    let n = store.watch_buffer() + 10;
    let created = create_many(&store, "bulk", n).await;
    let mut watch = store.watch::<Widget>(None, None).await.unwrap();
    let mut seen = 0;
    let changed: Vec<Widget> = created
        .into_iter()
        .map(|mut w| {
            w.status = Some(WidgetStatus {
                phase: "bulk".into(),
            });
            w
        })
        .collect();
    let results = in_batches(&store, changed, |batch| {
        catch_up(&mut watch, &mut seen);
        store.update_status_many(batch)
    })
    .await
    .unwrap();
    catch_up(&mut watch, &mut seen);
    assert_eq!(results.len(), n);
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(seen, n);
}

/// `in_batches` hands the writes over in calls of a quarter of the watch buffer, keeps the
/// order of the results, and stops at the first failed call.
#[tokio::test]
async fn in_batches_splits_keeps_order_and_stops_at_a_failure() {
    let (_dir, store) = open().await;
    let quarter = store.watch_buffer() / 4;
    let n = 2 * quarter + 5;
    let mut sizes = Vec::new();
    let out = in_batches(&store, (0..n).collect(), |batch: Vec<usize>| {
        sizes.push(batch.len());
        std::future::ready(Ok::<_, StoreError>(batch))
    })
    .await
    .unwrap();
    assert_eq!(sizes, vec![quarter, quarter, 5]);
    assert_eq!(out, (0..n).collect::<Vec<_>>());

    let mut calls = 0;
    let err = in_batches(&store, (0..n).collect(), |batch: Vec<usize>| {
        calls += 1;
        std::future::ready(if calls == 2 {
            Err(StoreError::WatchLagged {
                kind: "Widget".into(),
                reason: "the second call fails".into(),
            })
        } else {
            Ok(batch)
        })
    })
    .await
    .unwrap_err();
    assert!(
        jumpstarter_core::error_chain(&err).contains("the second call fails"),
        "{err}"
    );
    assert_eq!(calls, 2, "no call after the failed one");
}

#[tokio::test]
async fn everything_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (uid, last_rv) = {
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let w = store
            .create(&widget("lab", "keep", 7, &[("k", "v")]))
            .await
            .unwrap();
        let mut s = w.clone();
        s.status = Some(WidgetStatus {
            phase: "Kept".into(),
        });
        let s = store.update_status(&s).await.unwrap();
        store.create(&widget("lab", "gone", 1, &[])).await.unwrap();
        store.delete::<Widget>("lab", "gone", None).await.unwrap();
        (s.meta().uid.clone(), rv(&s))
    };
    let store = SqliteStore::open(dir.path()).await.unwrap();
    let w: Widget = store.get("lab", "keep").await.unwrap().unwrap();
    assert_eq!(w.spec.size, 7);
    assert_eq!(w.status.as_ref().unwrap().phase, "Kept");
    assert_eq!(w.meta().uid, uid);
    assert_eq!(store.get::<Widget>("lab", "gone").await.unwrap(), None);
    let list: ObjectList<Widget> = store
        .list(
            Some("lab"),
            &LabelSelector::parse("k=v").unwrap(),
            &ListParams::default(),
        )
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    // Revisions keep increasing across restarts (no resourceVersion is ever reused).
    let n = store.create(&widget("lab", "new", 1, &[])).await.unwrap();
    assert!(rv(&n) > last_rv + 1);
    // History from before the restart is not retained: watching from it says relist.
    assert!(matches!(
        store.watch::<Widget>(None, Some("1")).await.err(),
        Some(StoreError::WatchLagged { .. })
    ));
}

#[tokio::test]
async fn corrupt_rows_give_errors_naming_the_object() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).await.unwrap();
    store.create(&widget("lab", "bad", 1, &[])).await.unwrap();
    store
        .create(&widget("lab", "wrong-shape", 1, &[]))
        .await
        .unwrap();
    {
        let conn = rusqlite::Connection::open(store.path()).unwrap();
        conn.execute(
            "UPDATE objects SET body = '{not json' WHERE name = 'bad'",
            [],
        )
        .unwrap();
        conn.execute(
            "UPDATE objects SET body = '{\"metadata\":{},\"spec\":{\"size\":\"big\"}}' WHERE name = 'wrong-shape'",
            [],
        )
        .unwrap();
    }
    for name in ["bad", "wrong-shape"] {
        let err = store.get::<Widget>("lab", name).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(
            jumpstarter_core::error_chain(&err).contains(&format!("Widget lab/{name}")),
            "{err}"
        );
    }
    let err = store
        .list::<Widget>(None, &all(), &ListParams::default())
        .await
        .unwrap_err();
    assert!(
        jumpstarter_core::error_chain(&err).contains("Widget lab/bad"),
        "{err}"
    );
    let mut w = widget("lab", "bad", 2, &[]);
    w.metadata.resource_version = Some("1".into());
    let err = store.update(&w).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    // Delete needs the last state for its result and event: it refuses and changes nothing.
    let err = store
        .delete::<Widget>("lab", "bad", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    let err = store.get::<Widget>("lab", "bad").await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
}

async fn bad_keys_are_rejected_without_writing<S: Store>(store: S) {
    let long = "x".repeat(254);
    for (ns, name) in [
        ("", "w"),
        ("lab", ""),
        ("Lab", "w"),
        ("lab", "has space"),
        ("lab", "-dash"),
        ("lab/x", "w"),
        ("lab", long.as_str()),
    ] {
        let err = store.create(&widget(ns, name, 1, &[])).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Invalid { .. }),
            "{ns:?}/{name:?}: {err}"
        );
    }
    let mut no_ns = widget("x", "w", 1, &[]);
    no_ns.metadata.namespace = None;
    assert!(matches!(
        store.create(&no_ns).await.unwrap_err(),
        StoreError::Invalid { .. }
    ));
    let listed: ObjectList<Widget> = store
        .list(None, &all(), &ListParams::default())
        .await
        .unwrap();
    assert!(listed.items.is_empty());
    assert!(listed.resource_version.parse::<u64>().is_ok());
    assert!(matches!(
        store.watch::<Widget>(None, Some("abc")).await.err(),
        Some(StoreError::Invalid { .. })
    ));

    // generateName gives a fresh valid name.
    let mut g = widget("lab", "", 1, &[]);
    g.metadata.name = None;
    g.metadata.generate_name = Some("lease-".into());
    let made = store.create(&g).await.unwrap();
    let name = made.meta().name.clone().unwrap();
    assert!(
        name.starts_with("lease-") && name.len() == "lease-".len() + 5,
        "{name}"
    );
}

#[tokio::test]
async fn unusable_database_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(super::sqlite::DB_FILE),
        b"this is not a database, just text",
    )
    .unwrap();
    let err = SqliteStore::open(dir.path()).await.unwrap_err();
    assert!(
        jumpstarter_core::error_chain(&err).contains(super::sqlite::DB_FILE),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open(dir.path()).await.unwrap());
    {
        let conn = rusqlite::Connection::open(dir.path().join(super::sqlite::DB_FILE)).unwrap();
        conn.execute_batch("PRAGMA user_version = 99;").unwrap();
    }
    let err = SqliteStore::open(dir.path()).await.unwrap_err();
    assert!(
        jumpstarter_core::error_chain(&err).contains("schema version 99"),
        "{err}"
    );
}

/// Child side of `committed_writes_survive_kill_9`: writes objects forever, printing each
/// name after its create returned.
#[tokio::test]
async fn kill9_child_writer() {
    let Some(dir) = std::env::var_os("JMP_STORE_KILL9_DIR") else {
        return; // Only meaningful when spawned by the parent test.
    };
    let store = SqliteStore::open(std::path::PathBuf::from(dir))
        .await
        .unwrap();
    for i in 0.. {
        let name = format!("w{i}");
        store.create(&widget("lab", &name, i, &[])).await.unwrap();
        println!("COMMITTED {name}");
    }
}

/// Kills the child even when an assertion fails first.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This test binary again, running only the writer `test` on the store in `dir` (named by
/// the environment variable `env`), with its stdout to read.
fn spawn_kill9_child(
    test: &str,
    env: &str,
    dir: &std::path::Path,
) -> (KillOnDrop, std::process::ChildStdout) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    (KillOnDrop(child), stdout)
}

#[tokio::test]
async fn committed_writes_survive_kill_9() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, stdout) = spawn_kill9_child(
        "store::tests::kill9_child_writer",
        "JMP_STORE_KILL9_DIR",
        dir.path(),
    );
    let mut committed = Vec::new();
    let mut lines = std::io::BufReader::new(stdout).lines();
    while committed.len() < 30 {
        let line = lines.next().expect("child ended early").unwrap();
        if let Some(name) = line.strip_prefix("COMMITTED ") {
            committed.push(name.to_owned());
        }
    }
    child.0.kill().unwrap(); // SIGKILL: no destructors, no checkpoint.
    child.0.wait().unwrap();
    let store = SqliteStore::open(dir.path()).await.unwrap();
    for name in &committed {
        assert!(
            store.get::<Widget>("lab", name).await.unwrap().is_some(),
            "{name} was reported committed but is missing after kill -9"
        );
    }
}

/// Child side of `group_committed_writes_survive_kill_9`: 16 writers at once, so that their
/// writes queue up and share commits; each prints a name after its create returned, with the
/// store's commit count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_child_group_writer() {
    let Some(dir) = std::env::var_os("JMP_STORE_KILL9_GROUP_DIR") else {
        return; // Only meaningful when spawned by the parent test.
    };
    let store = SqliteStore::open(std::path::PathBuf::from(dir))
        .await
        .unwrap();
    let mut writers = Vec::new();
    for t in 0..16u32 {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{t}-{i}");
                store.create(&widget("lab", &name, i, &[])).await.unwrap();
                println!("COMMITTED {name} {}", store.commits().unwrap());
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
}

/// Group commit keeps the durability promise: every write that returned `Ok` survives
/// `kill -9`, although writes share commits (checked: fewer commits than writes).
#[tokio::test]
async fn group_committed_writes_survive_kill_9() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, stdout) = spawn_kill9_child(
        "store::tests::kill9_child_group_writer",
        "JMP_STORE_KILL9_GROUP_DIR",
        dir.path(),
    );
    let mut committed = Vec::new();
    let mut commits = 0u64;
    let mut lines = std::io::BufReader::new(stdout).lines();
    while committed.len() < 400 {
        let line = lines.next().expect("child ended early").unwrap();
        if let Some(rest) = line.strip_prefix("COMMITTED ") {
            let (name, n) = rest.split_once(' ').unwrap();
            committed.push(name.to_owned());
            commits = commits.max(n.parse().unwrap());
        }
    }
    child.0.kill().unwrap(); // SIGKILL: no destructors, no checkpoint.
    child.0.wait().unwrap();
    assert!(
        commits < committed.len() as u64,
        "{} writes took {commits} commits: no group formed",
        committed.len()
    );
    let store = SqliteStore::open(dir.path()).await.unwrap();
    for name in &committed {
        assert!(
            store.get::<Widget>("lab", name).await.unwrap().is_some(),
            "{name} was reported committed but is missing after kill -9"
        );
    }
}

async fn controller_kinds_round_trip_with_status<S: Store>(store: S) {
    use crate::objects::{
        Client, Exporter, ExporterAccessPolicy, ExporterSpec, ExporterStatus, Lease,
    };
    fn storable<K: StoreObject>() {}
    storable::<Client>();
    storable::<Lease>();
    storable::<ExporterAccessPolicy>();

    let mut e = Exporter::new("board-1", ExporterSpec::default());
    e.metadata.namespace = Some("lab".into());
    e.metadata.labels = Some([("board".to_string(), "rpi4".to_string())].into());
    let created = store.create(&e).await.unwrap();
    let mut s = created.clone();
    s.status = Some(ExporterStatus {
        status_message: "Exporter registered and available".into(),
        ..Default::default()
    });
    let with_status = store.update_status(&s).await.unwrap();
    let got: Exporter = store.get("lab", "board-1").await.unwrap().unwrap();
    assert_eq!(got, with_status);
    assert_eq!(
        got.status.unwrap().status_message,
        "Exporter registered and available"
    );
    let listed: ObjectList<Exporter> = store
        .list(
            Some("lab"),
            &LabelSelector::parse("board in (rpi4, rpi5)").unwrap(),
            &ListParams::default(),
        )
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    // Kinds are separate: a Client of the same name is a different object.
    assert!(
        store
            .get::<Client>("lab", "board-1")
            .await
            .unwrap()
            .is_none()
    );
}

/// An exporter whose status has a condition changed at `at` (nanoseconds kept in memory; the
/// stored form keeps whole seconds).
fn exporter_changed_at(
    stored: &crate::objects::Exporter,
    at: jiff::Timestamp,
) -> crate::objects::Exporter {
    use crate::objects::{ExporterStatus, conditions, set_condition};
    let mut e = stored.clone();
    let mut st = ExporterStatus {
        status_message: "Available for new lease".into(),
        ..Default::default()
    };
    set_condition(
        &mut st.conditions,
        conditions::REGISTERED,
        true,
        "Register",
        "registered",
        None,
        at,
    );
    e.status = Some(st);
    e
}

/// Creates the exporter `lab/board-1` (with `labels`) and returns it as stored.
async fn create_board(store: &SqliteStore, labels: &[(&str, &str)]) -> crate::objects::Exporter {
    let mut e = crate::objects::Exporter::new("board-1", Default::default());
    e.metadata.namespace = Some("lab".into());
    if !labels.is_empty() {
        e.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    store.create(&e).await.unwrap()
}

/// `update_status` of `stored` with its condition changed at `at`; the answer.
async fn write_status_at(
    store: &SqliteStore,
    stored: &crate::objects::Exporter,
    at: jiff::Timestamp,
) -> crate::objects::Exporter {
    store
        .update_status(&exporter_changed_at(stored, at))
        .await
        .unwrap()
}

/// `update_status_and_metadata_many` of `given` alone, both parts; the answer.
async fn write_both_parts(
    store: &SqliteStore,
    given: crate::objects::Exporter,
) -> crate::objects::Exporter {
    let both = Parts {
        status: true,
        metadata: true,
    };
    store
        .update_status_and_metadata_many(vec![(given, both)])
        .await
        .unwrap()
        .remove(0)
        .unwrap()
}

/// `lab/board-1` as a read returns it.
async fn read_board(store: &SqliteStore) -> crate::objects::Exporter {
    store.get("lab", "board-1").await.unwrap().unwrap()
}

/// Status writes of a typed kind (done on the typed object) and of the value merge behave
/// alike: a write that differs from the stored object only below a second (which its JSON
/// form drops) writes nothing, and an answer is what a later read returns.
#[tokio::test]
async fn a_status_write_that_changes_only_what_json_drops_writes_nothing() {
    let at = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    for value_merge in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = match value_merge {
            false => SqliteStore::open(dir.path()).await.unwrap(),
            true => SqliteStore::open_with_value_merge(dir.path())
                .await
                .unwrap(),
        };
        let created = create_board(&store, &[]).await;
        assert_eq!(created.status, None, "a create writes no status");
        let first = write_status_at(&store, &created, at).await;
        let rv = |e: &crate::objects::Exporter| e.metadata.resource_version.clone();
        assert_ne!(rv(&first), rv(&created));
        assert_eq!(
            read_board(&store).await,
            first,
            "value_merge={value_merge}: the answer is what a read returns"
        );
        // The same status, 0.4 s later within the same second: nothing to write.
        let later = at + jiff::SignedDuration::from_millis(400);
        let again = write_status_at(&store, &first, later).await;
        assert_eq!(
            again, first,
            "value_merge={value_merge}: a write of the same status in JSON is not written"
        );
        // A second later it is a change, answered as stored (whole seconds).
        let next_second = at + jiff::SignedDuration::from_millis(1_400);
        let changed = write_status_at(&store, &again, next_second).await;
        assert_ne!(rv(&changed), rv(&first));
        let got = read_board(&store).await;
        assert_eq!(got, changed, "value_merge={value_merge}");
        let cond = &got.status.as_ref().unwrap().conditions[0];
        assert_eq!(
            cond.last_transition_time.0,
            at + jiff::SignedDuration::from_secs(1)
        );
    }
}

/// Objects written by the value merge (their text in sorted key order) are read and written
/// by the typed one: an unchanged status is not written again, a changed one is.
#[tokio::test]
async fn the_typed_merge_takes_over_objects_the_value_merge_wrote() {
    let at = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let store = SqliteStore::open_with_value_merge(dir.path())
            .await
            .unwrap();
        let created = create_board(&store, &[("board", "rpi4")]).await;
        write_status_at(&store, &created, at).await
    };
    let store = SqliteStore::open(dir.path()).await.unwrap();
    let same = write_both_parts(&store, exporter_changed_at(&written, at)).await;
    assert_eq!(same, written, "nothing changed, nothing written");
    let mut relabelled = written.clone();
    relabelled.metadata.labels = Some([("board".to_string(), "rpi5".to_string())].into());
    relabelled.spec.username = Some("ignored: the spec is not a part written".into());
    let stored = write_both_parts(&store, relabelled).await;
    assert_ne!(
        stored.metadata.resource_version,
        written.metadata.resource_version
    );
    assert_eq!(
        stored.metadata.labels,
        Some([("board".to_string(), "rpi5".to_string())].into())
    );
    assert_eq!(stored.spec, written.spec);
    assert_eq!(stored.status, written.status);
    assert_eq!(read_board(&store).await, stored);
}

/// The writer starts a status write from its copy of the object it last wrote only while
/// that is still the stored revision: after a spec update (written through the value merge),
/// the next status write keeps the new spec.
#[tokio::test]
async fn a_status_write_after_a_spec_update_keeps_the_new_spec() {
    let at = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let (_dir, store) = open().await;
    let created = create_board(&store, &[]).await;
    let mut respec = write_status_at(&store, &created, at).await;
    respec.spec.username = Some("board-1-admin".into());
    let updated = store.update(&respec).await.unwrap();
    assert_eq!(updated.spec.username.as_deref(), Some("board-1-admin"));
    let later = at + jiff::SignedDuration::from_secs(5);
    let restatused = write_status_at(&store, &updated, later).await;
    assert_eq!(restatused.spec.username.as_deref(), Some("board-1-admin"));
    let got = read_board(&store).await;
    assert_eq!(got, restatused);
    assert_eq!(got.metadata.generation, Some(2));
}

#[cfg(feature = "kubernetes")]
fn fake_kube() -> KubeStore {
    KubeStore::new(crate::testing::FakeApiServer::new().client())
}

/// One real-server test at a time: they share the cluster and its namespaces.
static REAL_KUBE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The namespaces the generic tests write to.
const SUITE_NAMESPACES: &[&str] = &["lab", "other", "a", "b", "x", "k"];

/// The Kubernetes store over the real API server of `KUBECONFIG` (`cargo xtask kube-e2e`
/// starts one), with the Widget CRD installed, the suite's namespaces present and emptied of
/// the kinds the suite writes; the guard keeps other real-server tests out.
async fn real_kube() -> (tokio::sync::MutexGuard<'static, ()>, KubeStore) {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, DeleteParams, ListParams as KubeListParams, Patch, PatchParams};

    let guard = REAL_KUBE.lock().await;
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG must name a real cluster's admin kubeconfig (cargo xtask kube-e2e sets it)"
    );
    let store = KubeStore::from_env().await.unwrap().with_watch_timeout(30);
    let client = store.client().clone();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = <Widget as kube::CustomResourceExt>::crd();
    let crd_name = crd.metadata.name.clone().unwrap();
    crds.patch(
        &crd_name,
        &PatchParams::apply("jumpstarter-store-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in SUITE_NAMESPACES {
        let mut n = Namespace::default();
        n.metadata.name = Some((*ns).to_owned());
        namespaces
            .patch(
                ns,
                &PatchParams::apply("jumpstarter-store-tests").force(),
                &Patch::Apply(&n),
            )
            .await
            .unwrap();
    }
    // Served (the CRD may have just been created) and empty.
    let widgets: Api<Widget> = Api::all(client.clone());
    let mut served = false;
    for _ in 0..100 {
        if widgets
            .list(&KubeListParams::default().limit(1))
            .await
            .is_ok()
        {
            served = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(served, "the Widget CRD is not served");
    for ns in SUITE_NAMESPACES {
        let lp = KubeListParams::default();
        let dp = DeleteParams::default();
        Api::<Widget>::namespaced(client.clone(), ns)
            .delete_collection(&dp, &lp)
            .await
            .unwrap();
        Api::<crate::objects::Exporter>::namespaced(client.clone(), ns)
            .delete_collection(&dp, &lp)
            .await
            .unwrap();
        Api::<crate::objects::Client>::namespaced(client.clone(), ns)
            .delete_collection(&dp, &lp)
            .await
            .unwrap();
    }
    (guard, store)
}

async fn status_batch_writes_each_object_on_its_own<S: Store>(store: S) {
    let a = store.create(&widget("lab", "a", 1, &[])).await.unwrap();
    let b = store.create(&widget("lab", "b", 1, &[])).await.unwrap();
    let c = store.create(&widget("lab", "c", 1, &[])).await.unwrap();
    // b is changed behind the batch's back, so the batch's copy of it is stale.
    let mut b2 = b.clone();
    b2.spec.size = 2;
    let b2 = store.update(&b2).await.unwrap();
    let mut watch = store.watch::<Widget>(Some("lab"), None).await.unwrap();

    let with_phase = |w: &Widget, phase: &str| {
        let mut w = w.clone();
        w.status = Some(WidgetStatus {
            phase: phase.into(),
        });
        w
    };
    let mut gone = widget("lab", "gone", 1, &[]);
    gone.metadata.resource_version = Some("1".into());
    let mut no_rv = with_phase(&c, "no version");
    no_rv.metadata.resource_version = None;
    let results = store
        .update_status_many(vec![
            with_phase(&a, "ready"),
            with_phase(&b, "stale"),
            gone,
            no_rv,
            with_phase(&c, "ready"),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 5);
    let a_stored = results[0].as_ref().unwrap();
    assert_eq!(a_stored.status.as_ref().unwrap().phase, "ready");
    assert!(rv(a_stored) > rv(&b2));
    assert!(results[1].as_ref().unwrap_err().is_conflict());
    assert!(results[2].as_ref().unwrap_err().is_not_found());
    assert!(matches!(
        results[3].as_ref().unwrap_err(),
        StoreError::Invalid { .. }
    ));
    assert_eq!(
        results[4].as_ref().unwrap().status.as_ref().unwrap().phase,
        "ready"
    );

    // What failed changed nothing; what succeeded is stored and watched, in order.
    assert_eq!(store.get::<Widget>("lab", "b").await.unwrap().unwrap(), b2);
    assert_eq!(
        &store.get::<Widget>("lab", "a").await.unwrap().unwrap(),
        a_stored
    );
    // (A backend may write the batch's objects concurrently: their order is free.)
    let mut watched = Vec::new();
    for _ in 0..2 {
        let ev = watch.next().await.unwrap().unwrap();
        assert!(matches!(ev, WatchEvent::Modified(_)), "{ev:?}");
        watched.push(ev.object().metadata.name.clone().unwrap());
    }
    watched.sort();
    assert_eq!(watched, ["a", "c"]);
    assert!(
        store
            .update_status_many(Vec::<Widget>::new())
            .await
            .unwrap()
            .is_empty()
    );
}

/// `update_status_and_metadata_many` writes the parts it is told to and nothing else: not
/// the spec, not a part it was not told to write; a stale object fails alone.
async fn status_and_metadata_batch_writes_the_parts_named<S: Store>(store: S) {
    let mut made = Vec::new();
    for name in ["both", "status", "meta", "stale", "neither"] {
        made.push(
            store
                .create(&widget("lab", name, 1, &[("old", "1")]))
                .await
                .unwrap(),
        );
    }
    // "stale" is changed behind the batch's back.
    let mut changed = made[3].clone();
    changed.spec.size = 3;
    let stale_now = store.update(&changed).await.unwrap();
    let given: Vec<Widget> = made
        .iter()
        .map(|w| {
            let mut w = w.clone();
            w.status = Some(WidgetStatus {
                phase: "given".into(),
            });
            w.metadata.labels = Some([("new".to_string(), "2".to_string())].into());
            w.metadata.annotations = Some([("note".to_string(), "n".to_string())].into());
            w.spec.size = 9;
            w
        })
        .collect();
    let parts = |status, metadata| Parts { status, metadata };
    let results = store
        .update_status_and_metadata_many(vec![
            (given[0].clone(), parts(true, true)),
            (given[1].clone(), parts(true, false)),
            (given[2].clone(), parts(false, true)),
            (given[3].clone(), parts(true, true)),
            (given[4].clone(), parts(false, false)),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 5);
    let labels = |w: &Widget| w.metadata.labels.clone().unwrap_or_default();
    let phase = |w: &Widget| w.status.as_ref().map(|s| s.phase.clone());
    for (i, result) in results.iter().enumerate() {
        if i == 3 {
            assert!(result.as_ref().unwrap_err().is_conflict(), "{result:?}");
            continue;
        }
        let returned = result.as_ref().unwrap();
        let stored = store
            .get::<Widget>("lab", made[i].metadata.name.as_deref().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(returned, &stored);
        // The spec is never written, so the generation stays.
        assert_eq!(stored.spec.size, 1);
        assert_eq!(stored.metadata.generation, made[i].metadata.generation);
        // 0: both parts, 1: the status, 2: the metadata, 4: neither.
        let (status, metadata) = (i == 0 || i == 1, i == 0 || i == 2);
        assert_eq!(phase(&stored), status.then(|| "given".to_string()), "{i}");
        let want_labels: BTreeMap<String, String> = match metadata {
            true => [("new".to_string(), "2".to_string())].into(),
            false => [("old".to_string(), "1".to_string())].into(),
        };
        assert_eq!(labels(&stored), want_labels, "{i}");
        assert_eq!(stored.metadata.annotations.is_some(), metadata, "{i}");
        if i == 4 {
            assert_eq!(rv(&stored), rv(&made[4]), "a write of no part wrote");
        }
    }
    assert_eq!(
        store.get::<Widget>("lab", "stale").await.unwrap().unwrap(),
        stale_now
    );
}

/// Instantiates each generic test once per backend.
macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    let (_dir, store) = super::open().await;
                    super::$name(store).await;
                }
            )*
        }
        /// The same with every write through `serde_json::Value` (the merge of the kinds
        /// that are not typed).
        mod sqlite_value_merge {
            $(
                #[tokio::test]
                async fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = super::SqliteStore::open_with_value_merge(dir.path())
                        .await
                        .unwrap();
                    super::$name(store).await;
                }
            )*
        }
        #[cfg(feature = "kubernetes")]
        mod kube_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::fake_kube()).await;
                }
            )*
        }
    };
}

/// Instantiates each generic test against a real API server (ignored unless asked for:
/// `cargo xtask kube-e2e` runs them with `--ignored` against the one it starts).
macro_rules! real_kube_suite {
    ($($name:ident),* $(,)?) => {
        mod real_kube_backend {
            $(
                #[tokio::test]
                #[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
                async fn $name() {
                    let (_guard, store) = super::real_kube().await;
                    super::$name(store).await;
                }
            )*
        }
    };
}

// All of the generic tests but `slow_watcher_is_cut_off_and_writers_never_wait`: a real
// server buffers a slow watcher's events far beyond `WATCH_BUFFER` (its watch cache) and
// does not cut it off at that count.
real_kube_suite!(
    create_get_update_delete,
    stale_resource_versions_conflict,
    concurrent_read_modify_write_loses_nothing,
    list_by_namespace_selector_and_pages,
    watch_delivers_events_in_order_and_filters_namespace,
    list_then_watch_since_misses_nothing,
    bad_keys_are_rejected_without_writing,
    controller_kinds_round_trip_with_status,
    status_batch_writes_each_object_on_its_own,
    status_and_metadata_batch_writes_the_parts_named,
    exporter_health_condition_persists,
);

store_suite!(
    create_get_update_delete,
    stale_resource_versions_conflict,
    concurrent_read_modify_write_loses_nothing,
    list_by_namespace_selector_and_pages,
    watch_delivers_events_in_order_and_filters_namespace,
    list_then_watch_since_misses_nothing,
    slow_watcher_is_cut_off_and_writers_never_wait,
    bad_keys_are_rejected_without_writing,
    controller_kinds_round_trip_with_status,
    status_batch_writes_each_object_on_its_own,
    status_and_metadata_batch_writes_the_parts_named,
    exporter_health_condition_persists,
);

/// The quarantine of an exporter (its `Healthy` condition, ours) is status like any other:
/// kept by every backend, and shown to clients as an `[UNHEALTHY]` status message.
async fn exporter_health_condition_persists<S: Store>(store: S) {
    use crate::objects::{
        Exporter, ExporterSpec, ExporterStatus, conditions, exporter_to_proto, set_condition,
    };
    let mut e = Exporter::new("board-2", ExporterSpec::default());
    e.metadata.namespace = Some("lab".into());
    let mut e = store.create(&e).await.unwrap();
    let mut st = ExporterStatus {
        status_message: "Available for new lease".into(),
        ..Default::default()
    };
    set_condition(
        &mut st.conditions,
        conditions::HEALTHY,
        false,
        conditions::REASON_HEALTH_CHECK_FAILED,
        "healthCheck: failed 3 times in a row\nno answer",
        None,
        jiff::Timestamp::UNIX_EPOCH,
    );
    e.status = Some(st);
    store.update_status(&e).await.unwrap();
    let got: Exporter = store.get("lab", "board-2").await.unwrap().unwrap();
    let c = got.unhealthy().expect("still unhealthy after a round trip");
    assert_eq!(c.reason, conditions::REASON_HEALTH_CHECK_FAILED);
    assert_eq!(c.message, "healthCheck: failed 3 times in a row\nno answer");
    assert_eq!(
        exporter_to_proto(&got).status_message,
        "[UNHEALTHY] healthCheck: failed 3 times in a row\nno answer"
    );
    // Cleared: healthy again, and the ordinary message is back.
    let mut cleared = got.clone();
    let st = cleared.status.as_mut().unwrap();
    set_condition(
        &mut st.conditions,
        conditions::HEALTHY,
        true,
        conditions::REASON_CLEARED,
        "Cleared by an admin",
        None,
        jiff::Timestamp::UNIX_EPOCH,
    );
    store.update_status(&cleared).await.unwrap();
    let got: Exporter = store.get("lab", "board-2").await.unwrap().unwrap();
    assert!(got.unhealthy().is_none());
    assert_eq!(
        exporter_to_proto(&got).status_message,
        "Available for new lease"
    );
}
