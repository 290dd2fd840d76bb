//! The client's wait for the beforeLease hook when the exporter goes away meanwhile.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use jumpstarter_core::{
    Session,
    client::{ConnectOptions, connect_channel},
    hooks::wait::{Ready, wait_ready_or},
    server::{local_socket_path, serve_unix},
};
use jumpstarter_proto::v1::ExporterStatus;

use crate::tree;

/// Serves `session` on `socket` until the returned sender is dropped or fired.
fn serve_at(
    session: Arc<Session>,
    socket: &std::path::Path,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = serve_unix(session, socket, async {
        let _ = stopped.await;
    })
    .unwrap();
    let task = tokio::spawn(async move {
        let _ = server.await;
    });
    (stop, task)
}

fn in_hook() -> Arc<Session> {
    let s = Session::new(tree(), Default::default());
    s.set_status(ExporterStatus::BeforeLeaseHook, Some("powering on".into()));
    s
}

#[tokio::test]
async fn an_exporter_that_goes_away_during_the_hook_is_waited_for_while_the_lease_lasts() {
    let dir = tempfile::tempdir().unwrap();
    let socket = local_socket_path(dir.path());
    let (stop_a, server_a) = serve_at(in_hook(), &socket);
    let channel = connect_channel(&socket.to_string_lossy(), &ConnectOptions::default())
        .await
        .unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let waiter = tokio::spawn(wait_ready_or(
        channel,
        Duration::from_secs(120),
        move || {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(false)
        },
    ));
    // The exporter goes away mid-hook; the wait notices and asks about the lease.
    let _ = stop_a.send(());
    server_a.await.unwrap();
    let _ = std::fs::remove_file(&socket);
    for _ in 0..600 {
        if asked.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        asked.load(Ordering::SeqCst) > 0,
        "the loss was never noticed"
    );
    assert!(
        !waiter.is_finished(),
        "the wait ended while the lease lasts"
    );
    // It comes back (restarted) and its hook is over: the wait ends ready.
    let (_stop_b, _server_b) = serve_at(Session::new_ready(tree(), Default::default()), &socket);
    let ready = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the wait did not see the exporter back")
        .unwrap();
    assert_eq!(ready, Ready::Ready { warning: None });
}

#[tokio::test]
async fn a_lost_exporter_whose_lease_ended_ends_the_wait_and_otherwise_the_wait_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = local_socket_path(dir.path());
    let (stop, server) = serve_at(in_hook(), &socket);
    let channel = connect_channel(&socket.to_string_lossy(), &ConnectOptions::default())
        .await
        .unwrap();
    let _ = stop.send(());
    server.await.unwrap();
    let ended = wait_ready_or(channel.clone(), Duration::from_secs(60), || {
        std::future::ready(true)
    })
    .await;
    assert_eq!(ended, Ready::LeaseEnded);
    let timed_out = wait_ready_or(channel, Duration::from_millis(1500), || {
        std::future::ready(false)
    })
    .await;
    match timed_out {
        Ready::Failed(why) => assert!(
            why.contains("Timeout waiting for beforeLease hook")
                && why.contains("could not be reached"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}
