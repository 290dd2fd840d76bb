//! `GET /ui/events`: server-sent events telling a page which of its objects changed.
//!
//! Each stream holds no queue: it waits on the view's change counters and the hook history's
//! (`watch`es, which keep only the latest value), then waits [`COALESCE`] more so that a burst
//! of store changes is one event, and sends one `change` event naming the parts that moved
//! (`exporters`, `leases`, `pools`; a hook run, health event or pushed hook output is a change
//! of `exporters`, whose pages show them). A slow browser only makes its own stream skip to the latest counters.
//! The stream ends when the login ends (a `logout` event first) or the controller stops.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    extract::State,
    http::HeaderMap,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::Stream;

use super::{
    app::{Ui, UiState},
    login,
    view::Changes,
};
use crate::store::Store;

/// How long a stream gathers changes before it reports them.
pub const COALESCE: Duration = Duration::from_millis(200);
/// How often a quiet stream checks that its login still holds.
const RECHECK: Duration = Duration::from_secs(30);
/// How often a quiet stream sends a comment to keep proxies from closing it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The names of the parts whose counters differ between `before` and `now`.
pub fn moved(before: &Changes, now: &Changes) -> Vec<&'static str> {
    let mut parts = Vec::new();
    if before.exporters != now.exporters {
        parts.push("exporters");
    }
    if before.leases != now.leases {
        parts.push("leases");
    }
    if before.pools != now.pools {
        parts.push("pools");
    }
    parts
}

/// `GET /ui/events` (401 without a login).
pub async fn events<S: Store>(State(ui): UiState<S>, headers: HeaderMap) -> Response {
    if let Err(r) = login::api_login(&ui, &headers).await {
        return r;
    }
    Sse::new(stream(ui, headers))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// What one stream carries from one event to the next.
struct Follow<S: Store> {
    ui: Arc<Ui<S>>,
    headers: HeaderMap,
    rx: tokio::sync::watch::Receiver<Changes>,
    /// The hook history's counter (not in the store: the view does not see it).
    history: tokio::sync::watch::Receiver<u64>,
    stopped: tokio::sync::watch::Receiver<bool>,
    last: Changes,
    started: bool,
    done: bool,
}

fn stream<S: Store>(
    ui: Arc<Ui<S>>,
    headers: HeaderMap,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let mut rx = ui.view.subscribe();
    let last = *rx.borrow_and_update();
    let mut history = ui.state.hook_history.subscribe();
    history.borrow_and_update();
    let follow = Follow {
        history,
        stopped: ui.stopped.clone(),
        ui,
        headers,
        rx,
        last,
        started: false,
        done: false,
    };
    futures::stream::unfold(follow, |mut f| async move {
        if f.done {
            return None;
        }
        if !f.started {
            f.started = true;
            return Some((Ok(Event::default().event("ready").data("live")), f));
        }
        loop {
            enum Woke {
                Changed,
                History,
                Gone,
                Recheck,
            }
            let woke = tokio::select! {
                r = f.rx.changed() => if r.is_err() { Woke::Gone } else { Woke::Changed },
                r = f.history.changed() => if r.is_err() { Woke::Gone } else { Woke::History },
                _ = f.stopped.wait_for(|s| *s) => Woke::Gone,
                _ = tokio::time::sleep(RECHECK) => Woke::Recheck,
            };
            match woke {
                Woke::Gone => return None,
                Woke::Recheck => {
                    if login::login(&f.ui, &f.headers).await.is_err() {
                        f.done = true;
                        return Some((Ok(Event::default().event("logout").data("login ended")), f));
                    }
                    continue;
                }
                Woke::Changed | Woke::History => {}
            }
            let history_moved = matches!(woke, Woke::History);
            tokio::time::sleep(COALESCE).await;
            if login::login(&f.ui, &f.headers).await.is_err() {
                f.done = true;
                return Some((Ok(Event::default().event("logout").data("login ended")), f));
            }
            let now = *f.rx.borrow_and_update();
            let mut parts = moved(&f.last, &now);
            f.last = now;
            if f.history.has_changed().unwrap_or(false) || history_moved {
                f.history.borrow_and_update();
                if !parts.contains(&"exporters") {
                    parts.push("exporters");
                }
            }
            if parts.is_empty() {
                continue;
            }
            return Some((
                Ok(Event::default().event("change").data(parts.join(" "))),
                f,
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_moved_parts_are_named() {
        let a = Changes::default();
        let b = Changes { leases: 3, ..a };
        assert_eq!(moved(&a, &b), vec!["leases"]);
        assert!(moved(&b, &b).is_empty());
        let c = Changes {
            exporters: 1,
            leases: 3,
            pools: 9,
        };
        assert_eq!(moved(&a, &c), vec!["exporters", "leases", "pools"]);
    }
}
