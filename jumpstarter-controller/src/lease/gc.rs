//! Garbage collection of ended leases on the SQLite store: an ended lease is deleted once
//! it ended more than the retention ago (`--ended-lease-retention`), so that the store does
//! not grow without bound. On Kubernetes ended leases stay as objects, as upstream keeps
//! them (the cluster's own tooling cleans them up).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::{
    objects::{LEASE_ENDED_LABEL, Lease, selector::LabelSelector},
    store::{ListParams, Store, StoreError},
};

/// The default retention: a week of history for `jmp get leases --all`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How often the collector looks, for `retention`: half of it, between 1 s and 10 min.
pub fn interval(retention: Duration) -> Duration {
    (retention / 2).clamp(Duration::from_secs(1), Duration::from_secs(600))
}

/// Deletes the leases that ended more than `retention` before `now`; returns how many.
pub async fn collect<S: Store>(
    store: &S,
    retention: Duration,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let retention = SignedDuration::try_from(retention).unwrap_or(SignedDuration::MAX);
    // The label marks ended leases; `is_ended` below decides either way.
    let ended =
        LabelSelector::parse(LEASE_ENDED_LABEL).unwrap_or_else(|_| LabelSelector::everything());
    let leases = store
        .list::<Lease>(None, &ended, &ListParams::default())
        .await?
        .items;
    let mut n = 0;
    for l in leases.iter().filter(|l| l.is_ended()) {
        let end = l
            .status
            .as_ref()
            .and_then(|s| s.end_time.as_ref())
            .map(|t| t.0)
            .or_else(|| l.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let Some(end) = end else { continue };
        if now.duration_since(end) <= retention {
            continue;
        }
        let (Some(ns), Some(name)) = (l.metadata.namespace.as_deref(), l.metadata.name.as_deref())
        else {
            continue;
        };
        match store.delete::<Lease>(ns, name, None).await {
            Ok(_) => n += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    if n > 0 {
        tracing::info!("deleted {n} lease(s) that ended more than {retention:#} ago");
    }
    Ok(n)
}

/// Runs the collector every [`interval`] until `shutdown` resolves.
pub async fn run<S: Store>(
    store: &S,
    retention: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = collect(store, retention, Timestamp::now()).await {
            tracing::warn!(
                "ended-lease collection failed: {e}",
                e = jumpstarter_core::error_chain(&e)
            );
        }
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(interval(retention)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        objects::{LeaseSpec, LeaseStatus},
        store::SqliteStore,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

    #[tokio::test]
    async fn only_leases_ended_longer_ago_than_the_retention_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let now = Timestamp::now();
        let ago = |s: i64| now.checked_sub(SignedDuration::from_secs(s)).unwrap();
        for (name, ended_at) in [
            ("old", Some(ago(3600))),
            ("recent", Some(ago(10))),
            ("live", None),
        ] {
            let mut l = Lease::new(name, LeaseSpec::default());
            l.metadata.namespace = Some("default".into());
            if ended_at.is_some() {
                l.metadata.labels =
                    Some([(LEASE_ENDED_LABEL.to_string(), "true".to_string())].into());
            }
            let mut l = store.create(&l).await.unwrap();
            if let Some(t) = ended_at {
                l.status = Some(LeaseStatus {
                    ended: true,
                    end_time: Some(metav1::Time(t)),
                    ..Default::default()
                });
                store.update_status(&l).await.unwrap();
            }
        }
        assert_eq!(
            collect(&store, Duration::from_secs(60), now).await.unwrap(),
            1
        );
        let left: Vec<String> = store
            .list::<Lease>(None, &LabelSelector::everything(), &ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|l| l.metadata.name)
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(!left.contains(&"old".to_string()), "{left:?}");
        assert_eq!(
            collect(&store, Duration::from_secs(60), now).await.unwrap(),
            0
        );
        assert_eq!(interval(Duration::from_secs(60)), Duration::from_secs(30));
        assert_eq!(interval(Duration::from_millis(10)), Duration::from_secs(1));
        assert_eq!(interval(DEFAULT_RETENTION), Duration::from_secs(600));
    }
}
