//! Client token expiry (upstream main): each Client's `status.tokenExpiresAt` is when the
//! token this controller last issued to it expires, and its `TokenExpiring` condition says
//! how soon that is ([`crate::objects::set_token_expiry`]). The expiry is recorded whenever
//! a client token is issued (`jmp admin create client`, a rotation, `RotateToken`); the
//! condition is brought up to date every [`REFRESH_INTERVAL`] by [`run`].

use std::time::{Duration, SystemTime};

use jiff::Timestamp;

use crate::{
    objects::{Client, selector::LabelSelector, set_token_expiry},
    store::{ListParams, Store, StoreError},
};

/// How often [`run`] recomputes the `TokenExpiring` conditions (upstream requeues daily; an
/// hour keeps the day count in the message right).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(3600);

/// Writes attempted before a conflicting write is given up.
const TRIES: u32 = 8;

/// Records that the token just issued to client `namespace/name` expires at `expires`.
pub async fn record<S: Store>(
    store: &S,
    namespace: &str,
    name: &str,
    expires: SystemTime,
) -> Result<(), StoreError> {
    let Ok(expires) = Timestamp::try_from(expires) else {
        return Ok(());
    };
    for _ in 0..TRIES {
        let Some(mut c) = store.get::<Client>(namespace, name).await? else {
            return Ok(());
        };
        let generation = c.metadata.generation;
        let status = c.status.get_or_insert_with(Default::default);
        if !set_token_expiry(status, expires, generation, Timestamp::now()) {
            return Ok(());
        }
        match store.update_status(&c).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Recomputes the `TokenExpiring` condition of every client with a recorded expiry, as of
/// `now`; returns how many changed.
pub async fn refresh<S: Store>(store: &S, now: Timestamp) -> Result<usize, StoreError> {
    let list = store
        .list::<Client>(None, &LabelSelector::everything(), &ListParams::default())
        .await?;
    let mut changed = 0;
    for mut c in list.items {
        let generation = c.metadata.generation;
        let Some(status) = c.status.as_mut() else {
            continue;
        };
        let Some(expires) = status.token_expires_at.as_ref().map(|t| t.0) else {
            continue;
        };
        if set_token_expiry(status, expires, generation, now) {
            match store.update_status(&c).await {
                Ok(_) => changed += 1,
                // Changed meanwhile (a new token): the next pass sees it.
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(changed)
}

/// Refreshes the conditions now and every [`REFRESH_INTERVAL`], for as long as it runs.
pub async fn run<S: Store>(store: S) {
    let mut tick = tokio::time::interval(REFRESH_INTERVAL);
    loop {
        tick.tick().await;
        if let Err(e) = refresh(&store, Timestamp::now()).await {
            tracing::warn!(
                "client token expiry: {e}",
                e = jumpstarter_core::error_chain(&e)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use jiff::SignedDuration;

    use super::*;
    use crate::objects::{ClientSpec, TOKEN_EXPIRING, find_condition};
    use crate::store::SqliteStore;

    #[tokio::test]
    async fn the_condition_follows_the_clock_and_a_new_token_resets_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let mut c = Client::new("c1", ClientSpec::default());
        c.metadata.namespace = Some("lab".into());
        store.create(&c).await.unwrap();
        let now = Timestamp::now();
        let in_days = |d: i64| now + SignedDuration::from_hours(d * 24);
        record(&store, "lab", "c1", in_days(40).into())
            .await
            .unwrap();
        let reason = |c: Client| {
            let s = c.status.unwrap();
            find_condition(&s.conditions, TOKEN_EXPIRING)
                .map(|c| c.reason.clone())
                .unwrap()
        };
        let get = || async { store.get::<Client>("lab", "c1").await.unwrap().unwrap() };
        assert_eq!(reason(get().await), "Valid");
        // Twenty days on: within 30 days; nothing else to change after that.
        assert_eq!(refresh(&store, in_days(20)).await.unwrap(), 1);
        assert_eq!(reason(get().await), "ExpiresWithin30Days");
        // Past it: expired.
        refresh(&store, in_days(41)).await.unwrap();
        assert_eq!(reason(get().await), "Expired");
        // A new token: valid again. A client nobody issued a token to is left alone.
        record(&store, "lab", "c1", in_days(400).into())
            .await
            .unwrap();
        assert_eq!(reason(get().await), "Valid");
        record(&store, "lab", "nobody", in_days(1).into())
            .await
            .unwrap();
        assert!(
            store
                .get::<Client>("lab", "nobody")
                .await
                .unwrap()
                .is_none()
        );
    }
}
