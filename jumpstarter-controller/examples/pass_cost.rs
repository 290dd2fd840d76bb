//! What one reconcile pass costs in a large lab, when it has nothing to do.
//!
//! `pass_cost EXPORTERS LEASES PASSES [ENDED]`
//!
//! Opens the embedded store in a temporary directory, creates EXPORTERS online exporters
//! (label `pool=x`), ENDED leases that have ended (the history a lab keeps: a week of them by
//! default in the embedded store, all of them on Kubernetes; none when not given) and LEASES
//! leases on `pool=x`, starts the exporter feed (as the
//! controller does), lets passes grant every lease, and then runs PASSES more passes, which
//! find nothing to change: the fixed cost every pass pays while 1,000 leases are asked at
//! once and passes run back to back. Prints the median and the fastest pass in ms.
//!
//! Wall times on a shared machine are noisy; for a repeatable figure, count the passes'
//! instructions with callgrind (only `reconcile_once` and what it calls):
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*reconcile_once*' \
//!   target/release/examples/pass_cost 10000 1000 10
//! ```
//!
//! (the first passes, which grant, are counted too; compare runs with the same arguments).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use jumpstarter_controller::{
    GoDuration, LabelSelector,
    objects::{
        Client, Exporter, ExporterSpec, ExporterStatus, LEASE_ENDED_LABEL, Lease, LeaseSpec,
        LeaseStatus,
    },
    reconcile_once,
    store::{SqliteStore, Store},
};
use k8s_openapi::{
    api::core::v1::LocalObjectReference, apimachinery::pkg::apis::meta::v1 as metav1,
};

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn arg(args: &[String], i: usize, what: &str) -> usize {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("usage: pass_cost EXPORTERS LEASES PASSES [ENDED] (bad {what})"))
}

/// A lease of an hour on `pool=x` for the client `alice`, in `default`.
fn alices_lease(name: &str) -> Lease {
    let mut l = Lease::new(
        name,
        LeaseSpec {
            client_ref: LocalObjectReference {
                name: "alice".into(),
            },
            duration: Some(GoDuration::from_secs(3600)),
            selector: LabelSelector::parse("pool=x").expect("selector").to_k8s(),
            ..Default::default()
        },
    );
    l.metadata.namespace = Some("default".into());
    l
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (exporters, leases, passes) = (
        arg(&args, 1, "EXPORTERS"),
        arg(&args, 2, "LEASES"),
        arg(&args, 3, "PASSES"),
    );
    let ended = if args.len() > 4 {
        arg(&args, 4, "ENDED")
    } else {
        0
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = SqliteStore::open(dir.path()).await.expect("open the store");
    let state = jumpstarter_controller::testing::state_with_new_keys(store.clone());

    let mut client = Client::new("alice", Default::default());
    client.metadata.namespace = Some("default".into());
    store.create(&client).await.expect("create the client");
    stream::iter(0..exporters)
        .map(|i| {
            let store = store.clone();
            async move {
                let mut e = Exporter::new(&format!("board-{i:05}"), ExporterSpec::default());
                e.metadata.namespace = Some("default".into());
                e.metadata.labels = Some([("pool".to_string(), "x".to_string())].into());
                let mut e = store.create(&e).await.expect("create an exporter");
                e.status = Some(ExporterStatus {
                    devices: Some(vec![]),
                    last_seen: Some(metav1::Time(Timestamp::now())),
                    ..Default::default()
                });
                store.update_status(&e).await.expect("exporter status");
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    // The history: leases that ended an hour ago, as a pass leaves them (status ended, no
    // exporter, the ended label).
    stream::iter(0..ended)
        .map(|i| {
            let store = store.clone();
            async move {
                let mut l = alices_lease(&format!("ended-{i:06}"));
                l.metadata.labels =
                    Some([(LEASE_ENDED_LABEL.to_string(), "true".to_string())].into());
                let mut l = store.create(&l).await.expect("create an ended lease");
                let hour_ago = Timestamp::now() - jiff::SignedDuration::from_secs(3600);
                l.status = Some(LeaseStatus {
                    begin_time: Some(metav1::Time(hour_ago)),
                    end_time: Some(metav1::Time(hour_ago)),
                    ended: true,
                    ..Default::default()
                });
                store.update_status(&l).await.expect("end a lease");
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    state.start_exporter_feed();
    assert!(
        state
            .exporters
            .synced(std::time::Duration::from_secs(60))
            .await,
        "the exporter feed did not sync"
    );
    reconcile_once(&state).await.expect("first pass");
    stream::iter(0..leases)
        .map(|i| {
            let store = store.clone();
            async move {
                let l = alices_lease(&format!("lease-{i:05}"));
                store.create(&l).await.expect("create a lease");
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;

    // Grant: passes until every lease holds an exporter.
    let granted = |list: &[Lease]| {
        list.iter()
            .filter(|l| !l.is_ended() && l.assigned_exporter().is_some())
            .count()
    };
    for _ in 0..20 {
        reconcile_once(&state).await.expect("granting pass");
        let list = store
            .list::<Lease>(None, &LabelSelector::everything(), &Default::default())
            .await
            .expect("list leases");
        if granted(&list.items) == leases {
            break;
        }
    }
    let list = store
        .list::<Lease>(None, &LabelSelector::everything(), &Default::default())
        .await
        .expect("list leases");
    assert_eq!(granted(&list.items), leases, "not every lease was granted");

    let mut times = Vec::with_capacity(passes);
    for _ in 0..passes {
        let start = Instant::now();
        reconcile_once(&state).await.expect("pass");
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "pass_cost: {exporters} exporters, {leases} leases held, {ended} ended, {passes} passes \
         with nothing to do: median {:.2} ms, fastest {:.2} ms",
        times.get(times.len() / 2).copied().unwrap_or(f64::NAN),
        times.first().copied().unwrap_or(f64::NAN),
    );
}
