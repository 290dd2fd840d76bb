//! The web dashboard (`--ui-listen`) of an in-process controller, over plain HTTP/1.1 on
//! loopback: every route refuses without a login, a client login reads but cannot act, the
//! admin's actions need the session's CSRF token and change the store, bad input is answered
//! with a clear error, the event stream reports a store change, the fleet pages through
//! thousands of exporters, an exporter's page shows its hook runs (with their pushed output)
//! and health events (with each pushed health-check run), the actions read back through the admin gRPC API, and a waiting lease
//! shows the priority it is queued by.

use std::{net::SocketAddr, time::Duration};

use jumpstarter_controller::{
    objects::{Exporter, ExporterSpec, Lease, LeaseSpec},
    store::Store,
};
use k8s_openapi::api::core::v1::LocalObjectReference;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    Lab, lab_configured,
    ui_http::{Answer, csrf, get, login, post, post_token, send},
};

/// Posts the form of the admin's action `path` with the session's CSRF token `token`.
async fn act(addr: SocketAddr, cookie: &str, token: &str, path: &str) -> Answer {
    post(addr, path, Some(cookie), &format!("csrf={token}")).await
}

/// [`act`], which is done (200).
async fn act_done(addr: SocketAddr, cookie: &str, token: &str, path: &str) {
    let a = act(addr, cookie, token, path).await;
    assert_eq!(a.status, 200, "{}", a.body);
}

/// Opens the event stream (`/ui/events`) of `cookie`'s session: the connection, its answer
/// to be read.
async fn events(addr: SocketAddr, cookie: &str) -> tokio::net::TcpStream {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(
        format!("GET /ui/events HTTP/1.1\r\nHost: localhost\r\nCookie: {cookie}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    c
}

/// Reads the event stream `c` into `seen` until `want` arrived; a generous bound only keeps
/// a broken stream from hanging (false then).
async fn until(
    c: &mut tokio::net::TcpStream,
    seen: &mut String,
    buf: &mut [u8],
    want: &str,
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !seen.contains(want) {
        match tokio::time::timeout_at(deadline, c.read(buf)).await {
            Ok(Ok(n)) if n > 0 => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            _ => return false,
        }
    }
    true
}

/// A lab whose controller serves the dashboard on a port of its own.
async fn ui_lab() -> (Lab, SocketAddr) {
    let lab = lab_configured(|c| c.ui_listen = Some("127.0.0.1:0".into())).await;
    let addr = lab.ctl.ui_addr().expect("the dashboard listens");
    (lab, addr)
}

async fn lease(lab: &Lab, name: &str, client: &str, exporter: &str) -> Lease {
    let mut l = Lease::new(
        name,
        LeaseSpec {
            client_ref: LocalObjectReference {
                name: client.into(),
            },
            duration: Some(jumpstarter_controller::GoDuration::from_secs(600)),
            exporter_ref: Some(LocalObjectReference {
                name: exporter.into(),
            }),
            ..Default::default()
        },
    );
    l.metadata.namespace = Some("default".into());
    lab.ctl.state.store.create(&l).await.unwrap()
}

async fn stored_lease(lab: &Lab, name: &str) -> Lease {
    lab.ctl
        .state
        .store
        .get::<Lease>("default", name)
        .await
        .unwrap()
        .unwrap()
}

async fn stored_exporter(lab: &Lab, name: &str) -> Exporter {
    lab.ctl
        .state
        .store
        .get::<Exporter>("default", name)
        .await
        .unwrap()
        .unwrap()
}

const PAGES: [&str; 5] = [
    "/ui",
    "/ui/leases",
    "/ui/pools",
    "/ui/exporters/default/e1",
    "/ui?page=2&selector=a%3Db",
];
const ACTIONS: [&str; 6] = [
    "/ui/leases/default/l1/end",
    "/ui/exporters/default/e1/quarantine",
    "/ui/exporters/default/e1/unquarantine",
    "/ui/exporters/default/e1/disable",
    "/ui/exporters/default/e1/enable",
    "/ui/logout",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_without_a_login() {
    let (lab, addr) = ui_lab().await;
    lab.exporter("e1", &[]).await;
    let root = get(addr, "/", None).await;
    assert_eq!((root.status, root.location()), (303, Some("/ui")));
    let form = get(addr, "/ui/login", None).await;
    assert_eq!(form.status, 200);
    assert!(
        form.body.contains("id=\"token\"") && form.body.contains("id=\"login-submit\""),
        "{}",
        form.body
    );
    let unknown = "jmp_ui=".to_string() + &"ab".repeat(32);
    let cookies = [
        None,
        Some("jmp_ui=garbage"),
        Some(unknown.as_str()),
        Some("jmp_ui=; other=1"),
        Some("jmp_ui=ZZ; jmp_ui=0"),
    ];
    for cookie in cookies {
        for p in PAGES {
            let a = get(addr, p, cookie).await;
            assert_eq!(a.status, 303, "GET {p} with {cookie:?}: {}", a.body);
            assert_eq!(a.location(), Some("/ui/login"), "GET {p}");
            assert!(!a.body.contains("e1"), "{}", a.body);
        }
        let ev = get(addr, "/ui/events", cookie).await;
        assert_eq!(ev.status, 401, "events with {cookie:?}");
        for p in ACTIONS {
            let a = post(addr, p, cookie, "csrf=x").await;
            assert_eq!(a.status, 401, "POST {p} with {cookie:?}: {}", a.body);
            assert!(a.body.contains("log in"), "{}", a.body);
        }
    }
    assert!(stored_exporter(&lab, "e1").await.is_enabled());
    lab.ctl.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_the_pages_but_cannot_act() {
    let (lab, addr) = ui_lab().await;
    let client = lab.client("alice").await;
    let exporter = lab.exporter("e1", &[("board", "rpi4")]).await;
    lease(&lab, "l1", "alice", "e1").await;

    // Refused logins say why, with the form again.
    for (token, why) in [
        ("", "paste a token"),
        ("not-a-token", "refused"),
        (exporter.token.as_str(), "exporter token"),
    ] {
        let a = post_token(addr, token).await;
        assert_eq!(a.status, 401, "{token:?}: {}", a.body);
        assert!(
            a.body.contains("id=\"login-error\"") && a.body.contains(why),
            "{}",
            a.body
        );
        assert!(!a.head.contains("set-cookie"), "{}", a.head);
    }

    let cookie = login(addr, &client.token).await;
    for p in PAGES {
        let a = get(addr, p, Some(&cookie)).await;
        assert_eq!(a.status, 200, "GET {p}: {}", a.body);
        assert!(a.body.contains("data-role=\"client\""), "{}", a.body);
        assert!(!a.body.contains("data-action"), "{p}: {}", a.body);
        assert!(!a.body.contains("id=\"confirm\""), "{p}: {}", a.body);
    }
    let fleet = get(addr, "/ui", Some(&cookie)).await;
    assert!(fleet.body.contains("<table id=\"fleet\""), "{}", fleet.body);
    assert!(
        fleet.body.contains("data-exporter=\"default/e1\""),
        "{}",
        fleet.body
    );
    assert!(fleet.body.contains("board=rpi4"), "{}", fleet.body);
    let leases = get(addr, "/ui/leases", Some(&cookie)).await;
    for id in [
        "id=\"leases\"",
        "id=\"queue\"",
        "id=\"ended\"",
        "data-lease=\"default/l1\"",
    ] {
        assert!(leases.body.contains(id), "{id}: {}", leases.body);
    }

    let token = csrf(addr, &cookie).await;
    for p in &ACTIONS[..5] {
        let a = post(addr, p, Some(&cookie), &format!("csrf={token}")).await;
        assert_eq!(a.status, 403, "POST {p}: {}", a.body);
        assert!(a.body.contains("admin token"), "{}", a.body);
    }
    assert!(!stored_lease(&lab, "l1").await.spec.release);
    let e = stored_exporter(&lab, "e1").await;
    assert!(e.is_enabled() && e.unhealthy().is_none());

    // Logging out ends the session.
    let out = post(addr, "/ui/logout", Some(&cookie), &format!("csrf={token}")).await;
    assert_eq!((out.status, out.location()), (303, Some("/ui/login")));
    assert_eq!(get(addr, "/ui", Some(&cookie)).await.status, 303);
    lab.ctl.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_need_the_csrf_token_and_change_the_store() {
    let (lab, addr) = ui_lab().await;
    lab.client("alice").await;
    lab.exporter("e1", &[]).await;
    lease(&lab, "l1", "alice", "e1").await;
    let cookie = login(addr, &lab.ctl.admin_token).await;
    let fleet = get(addr, "/ui", Some(&cookie)).await;
    assert!(fleet.body.contains("data-role=\"admin\""), "{}", fleet.body);
    assert!(fleet.body.contains("id=\"confirm\""), "{}", fleet.body);
    assert!(
        fleet.body.contains("data-action=\"disable\""),
        "{}",
        fleet.body
    );
    let leases = get(addr, "/ui/leases", Some(&cookie)).await;
    assert!(
        leases
            .body
            .contains("data-action=\"end-lease\" data-lease=\"default/l1\""),
        "{}",
        leases.body
    );
    let token = csrf(addr, &cookie).await;

    // Without, or with a wrong, CSRF token: 403 and nothing changes.
    for form in ["", "csrf=", "csrf=0123", &format!("csrf={token}x")] {
        for p in &ACTIONS[..5] {
            let a = post(addr, p, Some(&cookie), form).await;
            assert_eq!(a.status, 403, "POST {p} {form:?}: {}", a.body);
            assert!(a.body.contains("CSRF"), "{}", a.body);
        }
    }
    assert!(!stored_lease(&lab, "l1").await.spec.release);
    let e = stored_exporter(&lab, "e1").await;
    assert!(e.is_enabled() && e.unhealthy().is_none());

    // Ending the lease: marked for release at once, then ended by the scheduler.
    assert!(!stored_lease(&lab, "l1").await.is_ended());
    act_done(addr, &cookie, &token, "/ui/leases/default/l1/end").await;
    assert!(stored_lease(&lab, "l1").await.spec.release);
    let mut ended = false;
    for _ in 0..200 {
        if stored_lease(&lab, "l1").await.is_ended() {
            ended = true;
            break;
        }
        lab.ctl.state.wake.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ended, "the lease was not ended");
    act_done(addr, &cookie, &token, "/ui/exporters/default/e1/quarantine").await;
    let q = stored_exporter(&lab, "e1").await;
    assert_eq!(
        q.unhealthy().map(|c| c.reason.as_str()),
        Some("QuarantinedByAdmin")
    );
    assert!(q.unhealthy().unwrap().message.contains("admin"));
    act_done(
        addr,
        &cookie,
        &token,
        "/ui/exporters/default/e1/unquarantine",
    )
    .await;
    assert!(stored_exporter(&lab, "e1").await.unhealthy().is_none());
    act_done(addr, &cookie, &token, "/ui/exporters/default/e1/disable").await;
    assert!(!stored_exporter(&lab, "e1").await.is_enabled());
    act_done(addr, &cookie, &token, "/ui/exporters/default/e1/enable").await;
    assert!(stored_exporter(&lab, "e1").await.is_enabled());

    let again = act(addr, &cookie, &token, "/ui/leases/default/l1/end").await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(again.body.contains("already ended"), "{}", again.body);
    let ended_page = get(addr, "/ui/leases", Some(&cookie)).await;
    let ended_table = ended_page
        .body
        .split("id=\"ended\"")
        .nth(1)
        .unwrap_or_default();
    assert!(ended_table.contains("default/l1"), "{}", ended_page.body);
    lab.ctl.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error() {
    let (lab, addr) = ui_lab().await;
    lab.exporter("e1", &[]).await;
    let cookie = login(addr, &lab.ctl.admin_token).await;
    let token = csrf(addr, &cookie).await;
    let form = format!("csrf={token}");

    for (path, status, says) in [
        ("/ui?selector=a%20in%20(", 400, "selector"),
        ("/ui?page=abc", 400, "page"),
        ("/ui?per_page=-3", 400, "per_page"),
        ("/ui?sort=bogus", 400, "sort"),
        ("/ui/exporters/default/nope", 404, "not found"),
        ("/ui/nowhere", 404, "not found"),
    ] {
        let a = get(addr, path, Some(&cookie)).await;
        assert_eq!(a.status, status, "{path}: {}", a.body);
        assert!(a.body.contains(says), "{path}: {}", a.body);
    }
    // Absurd page numbers are clamped to the last page.
    for path in [
        "/ui?page=99999999999",
        "/ui?page=0",
        "/ui?per_page=0",
        "/ui?per_page=99999999",
    ] {
        let a = get(addr, path, Some(&cookie)).await;
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        assert!(a.body.contains("data-exporter=\"default/e1\""), "{path}");
    }
    for (path, status, says) in [
        ("/ui/leases/default/nope/end", 404, "not found"),
        ("/ui/leases/Not_A_Name/x/end", 400, "namespace"),
        ("/ui/exporters/default/e1/explode", 404, "unknown action"),
        ("/ui/exporters/default/nope/disable", 404, "not found"),
        ("/ui/exporters/default/nope/unquarantine", 404, "not found"),
    ] {
        let a = post(addr, path, Some(&cookie), &form).await;
        assert_eq!(a.status, status, "{path}: {}", a.body);
        assert!(a.body.contains(says), "{path}: {}", a.body);
    }
    // Huge bodies are refused before they are read.
    let huge = format!("csrf={token}&pad={}", "x".repeat(200_000));
    let a = post(
        addr,
        "/ui/exporters/default/e1/disable",
        Some(&cookie),
        &huge,
    )
    .await;
    assert_eq!(a.status, 413, "{}", a.body);
    let a = post(
        addr,
        "/ui/login",
        None,
        &format!("token={}", "x".repeat(200_000)),
    )
    .await;
    assert_eq!(a.status, 413, "{}", a.body);
    assert!(stored_exporter(&lab, "e1").await.is_enabled());
    // A form that is not one.
    let a = send(
        addr,
        "POST",
        "/ui/login",
        None,
        None,
        &[
            ("Content-Type", "application/json"),
            ("Content-Length", "2"),
        ],
    )
    .await;
    assert!(
        a.status == 400 || a.status == 415,
        "{} {}",
        a.status,
        a.body
    );
    // The controller still serves.
    assert_eq!(get(addr, "/ui", Some(&cookie)).await.status, 200);
    lab.ctl.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_reports_a_store_change() {
    let (lab, addr) = ui_lab().await;
    let cookie = login(addr, &lab.ctl.admin_token).await;
    let mut c = events(addr, &cookie).await;
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    assert!(
        until(&mut c, &mut seen, &mut buf, "event: ready").await,
        "{seen}"
    );
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(seen.to_lowercase().contains("text/event-stream"), "{seen}");
    seen.clear();
    lab.exporter("newcomer", &[]).await;
    assert!(
        until(&mut c, &mut seen, &mut buf, "exporters").await,
        "{seen}"
    );
    assert!(seen.contains("event: change"), "{seen}");
    lab.ctl.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_pages_through_thousands_of_exporters() {
    const N: usize = 2500;
    let (lab, addr) = ui_lab().await;
    let store = lab.ctl.state.store.clone();
    let mut tasks = Vec::new();
    for chunk in 0..10 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in (chunk..N).step_by(10) {
                let mut e = Exporter::new(&format!("e{i:05}"), ExporterSpec::default());
                e.metadata.namespace = Some("default".into());
                let parity = if i % 2 == 0 { "even" } else { "odd" };
                e.metadata.labels = Some(
                    [("parity".to_string(), parity.to_string())]
                        .into_iter()
                        .collect(),
                );
                store.create(&e).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let cookie = login(addr, &lab.ctl.admin_token).await;
    let total = |body: &str| {
        body.split("data-total=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|n| n.parse::<usize>().ok())
    };
    let rows = |body: &str| body.matches("<tr data-exporter=").count();
    // The view follows the store's watch: wait (bounded) until it has them all.
    let mut first = None;
    for _ in 0..300 {
        let a = get(addr, "/ui?per_page=500", Some(&cookie)).await;
        if total(&a.body) == Some(N) {
            first = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = first.expect("the fleet never showed every exporter");
    assert_eq!(rows(&first.body), 500);
    assert!(first.body.contains("data-exporter=\"default/e00000\""));
    assert!(first.body.contains("page 1 of 5"), "{}", first.body);

    let last = get(addr, "/ui?per_page=500&page=5", Some(&cookie)).await;
    assert_eq!(rows(&last.body), 500);
    assert!(last.body.contains(&format!("default/e{:05}", N - 1)));
    let past = get(addr, "/ui?per_page=500&page=4000000", Some(&cookie)).await;
    assert!(past.body.contains("page 5 of 5"), "{}", past.body);
    let default = get(addr, "/ui", Some(&cookie)).await;
    assert_eq!(rows(&default.body), 100);

    let even = get(
        addr,
        "/ui?selector=parity%3Deven&per_page=500&page=3",
        Some(&cookie),
    )
    .await;
    assert_eq!(total(&even.body), Some(N / 2));
    assert_eq!(even.body.matches("parity=odd").count(), 0);
    let search = get(addr, "/ui?q=e0123", Some(&cookie)).await;
    // e01230..e01239
    assert_eq!(total(&search.body), Some(10), "{}", search.body);
    let sorted = get(addr, "/ui?sort=status&per_page=10", Some(&cookie)).await;
    assert_eq!(sorted.status, 200);
    assert_eq!(rows(&sorted.body), 10);
    lab.ctl.shutdown().await;
}

/// The fleet and the exporter page leave out the labels clients are not shown (the
/// controller's `hiddenLabels`, deprecated labels and `hidden.jumpstarter.dev/` keys), as
/// `jmp get exporters` does; a selector still matches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_labels_are_not_shown() {
    let lab = lab_configured(|c| {
        c.ui_listen = Some("127.0.0.1:0".into());
        c.label_policy.hidden.insert("secret-site".into());
        c.label_policy
            .deprecated
            .insert("old-board".into(), "use board".into());
    })
    .await;
    let addr = lab.ctl.ui_addr().unwrap();
    lab.exporter(
        "e1",
        &[
            ("board", "rpi4"),
            ("secret-site", "bunker"),
            ("old-board", "pi"),
            ("hidden.jumpstarter.dev/serial", "sn-42"),
        ],
    )
    .await;
    let cookie = login(addr, &lab.ctl.admin_token).await;
    for path in ["/ui", "/ui/exporters/default/e1"] {
        let page = get(addr, path, Some(&cookie)).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(page.body.contains("board=rpi4"), "{path}: {}", page.body);
        for hidden in ["bunker", "old-board", "sn-42"] {
            assert!(
                !page.body.contains(hidden),
                "{path} shows {hidden}: {}",
                page.body
            );
        }
    }
    let matched = get(addr, "/ui?selector=secret-site%3Dbunker", Some(&cookie)).await;
    assert!(matched.body.contains("data-exporter=\"default/e1\""));
    // A search does not find an exporter by a label it does not show.
    let searched = get(addr, "/ui?q=bunker", Some(&cookie)).await;
    assert!(
        !searched.body.contains("data-exporter="),
        "{}",
        searched.body
    );
    lab.ctl.shutdown().await;
}

/// An exporter's page shows its driver tree, its recent leases and the log lines they
/// pushed, and says what the controller does not record (hook runs, health-check history).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_page_shows_drivers_leases_and_log_lines() {
    use jumpstarter_controller::objects::Device;
    let (lab, addr) = ui_lab().await;
    lab.client("alice").await;
    lab.exporter("e1", &[]).await;
    let device = |uuid: &str, parent: Option<&str>, name: &str| Device {
        uuid: uuid.into(),
        parent_uuid: parent.map(Into::into),
        labels: [
            ("jumpstarter.dev/name".to_string(), name.to_string()),
            (
                "jumpstarter.dev/client".to_string(),
                "jumpstarter_driver_power.client.PowerClient".to_string(),
            ),
        ]
        .into_iter()
        .collect(),
    };
    jumpstarter_controller::testing::update_exporter_status(
        &lab.ctl.state.store,
        "default",
        "e1",
        |e| {
            e.status.get_or_insert_with(Default::default).devices = Some(vec![
                device("u-root", None, "board-root"),
                device("u-power", Some("u-root"), "power-outlet"),
            ]);
        },
    )
    .await;
    lease(&lab, "l1", "alice", "e1").await;
    let logs = lab
        .ctl
        .state
        .lease_logs
        .as_ref()
        .expect("log gathering is on");
    logs.append(
        "default",
        "l1",
        vec![jumpstarter_proto::v1::LogEntry {
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 0,
            }),
            severity: "info".into(),
            message: "power <on> went fine".into(),
            component: "exporter".into(),
            lease: "l1".into(),
            namespace: "default".into(),
            ..Default::default()
        }],
    );
    let cookie = login(addr, &lab.ctl.admin_token).await;
    let mut page = String::new();
    for _ in 0..200 {
        page = get(addr, "/ui/exporters/default/e1", Some(&cookie))
            .await
            .body;
        if page.contains("power-outlet") && page.contains("data-lease=\"default/l1\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for want in [
        "id=\"drivers\"",
        "board-root",
        "power-outlet",
        "PowerClient",
        "data-lease=\"default/l1\"",
        "power &lt;on&gt; went fine",
        "No hook run since this controller started.",
        "Health history",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
    // The child sits under its parent.
    let root = page.find("board-root").unwrap();
    let child = page.find("power-outlet").unwrap();
    assert!(page[root..child].contains("<ul>"), "{page}");
    lab.ctl.shutdown().await;
}

/// A connection that sends nothing (or stops halfway through its request) does not keep its
/// place among the listener's connections: the dashboard closes it once idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed() {
    let (lab, addr) = ui_lab().await;
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /ui HTTP/1.1\r\nHost: loc")
        .await
        .unwrap();
    for c in [&mut silent, &mut half] {
        let mut buf = [0u8; 256];
        // Only a bound for a broken server: the idle timeout is well below it.
        let r = tokio::time::timeout(Duration::from_secs(150), c.read(&mut buf)).await;
        assert!(
            matches!(r, Ok(Ok(0)) | Ok(Err(_))),
            "the idle connection was not closed: {r:?}"
        );
    }
    // The listener still serves.
    assert_eq!(get(addr, "/ui/login", None).await.status, 200);
    lab.ctl.shutdown().await;
}

/// The same dashboard over the Kubernetes store (the in-memory fake API server): the fleet
/// shows what the store holds, the event stream reports a change, and an admin action writes
/// to the cluster.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_over_the_kubernetes_store() {
    use jumpstarter_controller::{
        ControllerConfig, start_with_store, store::KubeStore, testing::FakeApiServer,
    };
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApiServer::new();
    let store = KubeStore::new(api.client()).with_watch_timeout(5);
    let ctl = start_with_store(
        ControllerConfig {
            ui_listen: Some("127.0.0.1:0".into()),
            ..ControllerConfig::loopback(dir.path().join("data"))
        },
        store.clone(),
    )
    .await
    .unwrap();
    let addr = ctl.ui_addr().expect("the dashboard listens");
    let new_exporter = |name: &str| {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e
    };
    store.create(&new_exporter("k1")).await.unwrap();
    let cookie = login(addr, &ctl.admin_token).await;
    let mut shown = false;
    for _ in 0..200 {
        let page = get(addr, "/ui", Some(&cookie)).await;
        assert_eq!(page.status, 200, "{}", page.body);
        if page.body.contains("data-exporter=\"default/k1\"") {
            shown = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(shown, "the fleet never showed the exporter");

    let mut c = events(addr, &cookie).await;
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut created = false;
    while !seen.contains("exporters") {
        if !created && seen.contains("event: ready") {
            seen.clear();
            store.create(&new_exporter("k2")).await.unwrap();
            created = true;
        }
        match tokio::time::timeout_at(deadline, c.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            _ => panic!("the stream ended or stalled: {seen}"),
        }
    }
    assert!(created && seen.contains("event: change"), "{seen}");

    let token = csrf(addr, &cookie).await;
    act_done(addr, &cookie, &token, "/ui/exporters/default/k1/disable").await;
    let e: Exporter = store.get("default", "k1").await.unwrap().unwrap();
    assert!(!e.is_enabled());
    ctl.shutdown().await;
}

/// Exporter `name` (board=NAME) online, and a lease of `client` on it once granted (its
/// short name), with the exporter's status stream.
async fn granted_lease(
    lab: &Lab,
    client: &crate::Identity,
    name: &str,
) -> (
    crate::Identity,
    tonic::Streaming<jumpstarter_proto::v1::StatusResponse>,
    String,
) {
    use futures::StreamExt;
    let ex = lab.exporter(name, &[("board", name)]).await;
    let ch = lab.channel().await;
    let mut status = crate::admin::bring_online(&ch, &ex).await;
    let lease = crate::admin::create_lease(&ch, client, &format!("board={name}")).await;
    let short = lease.name.rsplit('/').next().unwrap().to_string();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(msg)) = status.next().await {
            if msg.leased && msg.lease_name.as_deref() == Some(short.as_str()) {
                return;
            }
        }
        panic!("status stream ended before the lease was granted");
    })
    .await
    .expect("the lease was not granted within 60 s");
    (ex, status, short)
}

/// The exporter page of `default/NAME` once it contains every one of `want`.
async fn exporter_page_with(addr: SocketAddr, cookie: &str, name: &str, want: &[&str]) -> String {
    let mut page = String::new();
    for _ in 0..200 {
        page = get(addr, &format!("/ui/exporters/default/{name}"), Some(cookie))
            .await
            .body;
        if want.iter().all(|w| page.contains(w)) {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let missing: Vec<_> = want.iter().filter(|w| !page.contains(**w)).collect();
    panic!("missing {missing:?}: {page}");
}

/// Asserts that `first` stands before `then` on `page` (its tables list the newest first).
fn assert_before(page: &str, first: &str, then: &str) {
    assert!(page.find(first) < page.find(then), "{page}");
}

/// What the exporter reported of its hooks (`ReportStatus`) and pushed of their output
/// (`PushLogs`, lines marked `stream=hook`) shows on its page: each run with its lease,
/// result and output, and an `[UNHEALTHY]` report in the health history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_runs_and_health_events_show_on_the_exporter_page() {
    use jumpstarter_proto::v1::{
        ExporterStatus, LogEntry, PushLogsRequest, ReportStatusRequest,
        controller_service_client::ControllerServiceClient,
        telemetry_service_client::TelemetryServiceClient,
    };
    let (lab, addr) = ui_lab().await;
    let alice = lab.client("alice").await;
    let (ex, _status, lease) = granted_lease(&lab, &alice, "b1").await;
    let ch = lab.channel().await;
    let ctl = ControllerServiceClient::new(ch.clone());
    // Reports a status of the exporter (`ReportStatus`).
    let report = |status: ExporterStatus, message: &str| {
        let mut ctl = ctl.clone();
        let req = crate::req(
            &ex,
            ReportStatusRequest {
                status: status as i32,
                message: Some(message.into()),
                release_lease: None,
            },
        );
        async move {
            ctl.report_status(req).await.unwrap();
        }
    };
    let hook_line = |op: &str, message: &str| LogEntry {
        timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        severity: "info".into(),
        message: message.into(),
        lease: lease.clone(),
        operation: op.into(),
        extra_fields: [("stream".to_string(), "hook".to_string())].into(),
        ..Default::default()
    };
    report(ExporterStatus::BeforeLeaseHook, "Running beforeLease hook").await;
    TelemetryServiceClient::new(ch.clone())
        .push_logs(crate::req(
            &ex,
            PushLogsRequest {
                entries: vec![
                    hook_line("beforeLease", "flashing <image> to the board"),
                    hook_line("beforeLease", "flash done"),
                    // A driver call of the same name is no hook output.
                    LogEntry {
                        operation: "beforeLease".into(),
                        message: "not hook output".into(),
                        lease: lease.clone(),
                        ..Default::default()
                    },
                ],
            },
        ))
        .await
        .unwrap();
    report(ExporterStatus::LeaseReady, "Ready for commands").await;
    report(
        ExporterStatus::Available,
        "[UNHEALTHY] healthCheck: failed 3 times in a row (last: exit status 1)\nprobe said no",
    )
    .await;

    let cookie = login(addr, &alice.token).await;
    let page = exporter_page_with(
        addr,
        &cookie,
        "b1",
        &[
            "data-hook=\"beforeLease\" data-result=\"succeeded\"",
            &format!("data-lease=\"default/{lease}\""),
            "flashing &lt;image&gt; to the board\nflash done",
            "data-health=\"unhealthy\"",
            "probe said no",
        ],
    )
    .await;
    let hooks = page
        .split("id=\"hooks\"")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .unwrap_or_default();
    assert!(hooks.contains("flash done"), "{page}");
    // In the lease's log lines, not in the hook's output.
    assert!(!hooks.contains("not hook output"), "{page}");
    assert!(page.contains("not hook output"), "{page}");
    assert!(page.contains("restart forgets"), "{page}");

    // The afterLease hook fails: a failed run of its own.
    report(ExporterStatus::AfterLeaseHook, "Running afterLease hooks").await;
    report(
        ExporterStatus::AfterLeaseHookFailed,
        "afterLease hook failed (on_failure=endLease): exit status 3",
    )
    .await;
    let page = exporter_page_with(
        addr,
        &cookie,
        "b1",
        &[
            "data-hook=\"afterLease\" data-result=\"failed\"",
            "exit status 3",
        ],
    )
    .await;
    // Newest first.
    assert_before(
        &page,
        "data-hook=\"afterLease\"",
        "data-hook=\"beforeLease\"",
    );
    lab.ctl.shutdown().await;
}

/// Each run of an exporter's health check that it pushes (`PushLogs`, a lease-less entry
/// marked `stream=health`) shows in its page's health history, newest first, with its failures
/// in a row out of the threshold, its duration and output, and tells open pages to reload. An
/// exporter cannot push one for another, nor an entry without a lease that is no health
/// check: the whole batch is refused and nothing of it kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_check_runs_show_on_the_exporter_page() {
    use jumpstarter_proto::v1::{
        LogEntry, PushLogsRequest, telemetry_service_client::TelemetryServiceClient,
    };
    let (lab, addr) = ui_lab().await;
    let alice = lab.client("alice").await;
    let hc1 = lab.exporter("hc1", &[]).await;
    lab.exporter("hc2", &[]).await;
    let check = |result: &str, failures: &str, ms: &str, output: &str| LogEntry {
        timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        severity: "info".into(),
        message: output.into(),
        operation: "healthCheck".into(),
        result: result.into(),
        extra_fields: [
            ("stream", "health"),
            ("failures", failures),
            ("threshold", "3"),
            ("duration_ms", ms),
        ]
        .into_iter()
        .chain((result == "error").then_some(("error", "Hook failed with exit code 3")))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    let telemetry = TelemetryServiceClient::new(lab.channel().await);
    let push = |entries: Vec<LogEntry>| {
        let mut t = telemetry.clone();
        let req = crate::req(&hc1, PushLogsRequest { entries });
        async move { t.push_logs(req).await }
    };
    let cookie = login(addr, &alice.token).await;
    let mut c = events(addr, &cookie).await;
    let (mut seen, mut buf) = (String::new(), [0u8; 4096]);
    assert!(
        until(&mut c, &mut seen, &mut buf, "event: ready").await,
        "{seen}"
    );
    seen.clear();

    let pushed = push(vec![check("ok", "0", "12.300", "board answers <ok>")])
        .await
        .unwrap()
        .into_inner();
    assert_eq!((pushed.accepted, pushed.dropped), (1, 0));
    // An open page is told (nothing else changed meanwhile).
    assert!(
        until(&mut c, &mut seen, &mut buf, "exporters").await,
        "{seen}"
    );
    push(vec![check("error", "2", "1500.000", "probe: no answer")])
        .await
        .unwrap();

    // Refused, and nothing of the batch kept: an entry for another exporter...
    let mut other = check("ok", "0", "1.000", "");
    other.exporter = "hc2".into();
    let refused = push(vec![check("ok", "0", "1.000", "refused batch"), other])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("\"hc2\""), "{refused:?}");
    // ... and an entry without a lease that is no health check's.
    let mut not_health = check("ok", "0", "1.000", "");
    not_health
        .extra_fields
        .insert("stream".into(), "hook".into());
    let refused = push(vec![check("ok", "0", "1.000", "refused batch"), not_health])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("lease is empty"), "{refused:?}");

    let page = exporter_page_with(
        addr,
        &cookie,
        "hc1",
        &[
            "data-health=\"check failed\"",
            "data-health=\"check passed\"",
            "probe: no answer",
            "Hook failed with exit code 3",
            "board answers &lt;ok&gt;",
            "1.5 s",
            "12 ms",
        ],
    )
    .await;
    let history = page
        .split("id=\"health-history\"")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .unwrap_or_default();
    assert!(
        history.contains("<td class=\"failures\">2 / 3</td>")
            && history.contains("<td class=\"failures\">0 / 3</td>"),
        "{page}"
    );
    // Newest first.
    assert_before(
        &page,
        "data-health=\"check failed\"",
        "data-health=\"check passed\"",
    );
    assert!(!page.contains("refused batch"), "{page}");
    assert_eq!(
        lab.ctl
            .state
            .hook_history
            .health_events("default", "hc1")
            .len(),
        2
    );
    // Not another exporter's, and no lease's log lines.
    let page = exporter_page_with(addr, &cookie, "hc2", &["id=\"health-history\""]).await;
    assert!(!page.contains("data-health="), "{page}");
    assert!(
        lab.ctl
            .state
            .lease_logs
            .as_ref()
            .unwrap()
            .read("default", "")
            .entries
            .is_empty()
    );
    lab.ctl.shutdown().await;
}

/// The dashboard's actions are the admin API's: what they change reads back through the admin
/// gRPC API, and the page's health history names the admin's quarantine and its clearing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_actions_show_through_the_admin_api() {
    use jumpstarter_proto::admin_v1::admin_service_client::AdminServiceClient;
    let (lab, addr) = ui_lab().await;
    let alice = lab.client("alice").await;
    let (_ex, _status, lease) = granted_lease(&lab, &alice, "b1").await;
    let cookie = login(addr, &lab.ctl.admin_token).await;
    let token = csrf(addr, &cookie).await;
    let mut admin = AdminServiceClient::new(lab.channel().await);
    let get_exporter = |mut admin: AdminServiceClient<_>| {
        let t = lab.ctl.admin_token.clone();
        async move {
            admin
                .get_exporter(crate::admin::admin_req(&t, crate::admin::obj("b1")))
                .await
                .unwrap()
                .into_inner()
        }
    };

    act_done(addr, &cookie, &token, "/ui/exporters/default/b1/quarantine").await;
    let e = get_exporter(admin.clone()).await;
    assert!(e.unhealthy, "{e:?}");
    assert_eq!(e.health_reason, "QuarantinedByAdmin");
    assert!(e.health_message.contains("from the dashboard"), "{e:?}");
    act_done(addr, &cookie, &token, "/ui/exporters/default/b1/disable").await;
    assert!(!get_exporter(admin.clone()).await.enabled);
    act_done(addr, &cookie, &token, "/ui/exporters/default/b1/enable").await;
    assert!(get_exporter(admin.clone()).await.enabled);
    act_done(
        addr,
        &cookie,
        &token,
        "/ui/exporters/default/b1/unquarantine",
    )
    .await;
    assert!(!get_exporter(admin.clone()).await.unhealthy);

    // Ending the lease from the page: the admin API sees the exporter freed.
    assert_eq!(get_exporter(admin.clone()).await.lease, lease);
    act_done(
        addr,
        &cookie,
        &token,
        &format!("/ui/leases/default/{lease}/end"),
    )
    .await;
    let mut freed = false;
    for _ in 0..200 {
        if get_exporter(admin.clone()).await.lease.is_empty() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the exporter still holds the lease");

    // The health history, newest first: cleared, then quarantined by the admin.
    let page = exporter_page_with(
        addr,
        &cookie,
        "b1",
        &[
            "data-health=\"cleared\"",
            "data-health=\"quarantined by an admin\"",
        ],
    )
    .await;
    assert_before(
        &page,
        "data-health=\"cleared\"",
        "data-health=\"quarantined by an admin\"",
    );
    // The admin API's own ClearExporterHealth is the same function: a no-op now, still fine.
    admin
        .clear_exporter_health(crate::admin::admin_req(
            &lab.ctl.admin_token,
            crate::admin::obj("b1"),
        ))
        .await
        .unwrap();

    // A client's session is refused (403) and changes nothing.
    let client = login(addr, &alice.token).await;
    let ctoken = csrf(addr, &client).await;
    let a = post(
        addr,
        "/ui/exporters/default/b1/quarantine",
        Some(&client),
        &format!("csrf={ctoken}"),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(!get_exporter(admin.clone()).await.unhealthy);
    lab.ctl.shutdown().await;
}

/// A waiting lease shows the priority the scheduler orders the queue by (its best access
/// policy rule's), not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lease_shows_the_priority_it_is_queued_by() {
    use jumpstarter_controller::{
        LabelSelector,
        objects::{ExporterAccessPolicy, ExporterAccessPolicySpec, Policy, PolicyFrom},
    };
    let (lab, addr) = ui_lab().await;
    let alice = lab.client("alice").await;
    let mut policy = ExporterAccessPolicy::new(
        "everyone-7",
        ExporterAccessPolicySpec {
            exporter_selector: LabelSelector::parse("board=b1").unwrap().to_k8s(),
            policies: vec![Policy {
                description: "everyone, priority 7".into(),
                priority: 7,
                from: vec![PolicyFrom {
                    client_selector: LabelSelector::everything().to_k8s(),
                }],
                maximum_duration: None,
                spot_access: false,
            }],
        },
    );
    policy.metadata.namespace = Some("default".into());
    lab.ctl.state.store.create(&policy).await.unwrap();
    let (_ex, _status, _first) = granted_lease(&lab, &alice, "b1").await;
    let second = crate::admin::create_lease(&lab.channel().await, &alice, "board=b1").await;
    let second = second.name.rsplit('/').next().unwrap().to_string();
    let cookie = login(addr, &alice.token).await;
    let want = format!("data-lease=\"default/{second}\"");
    let mut queue = String::new();
    for _ in 0..200 {
        let page = get(addr, "/ui/leases", Some(&cookie)).await.body;
        queue = page
            .split("id=\"queue\"")
            .nth(1)
            .and_then(|q| q.split("</table>").next())
            .unwrap_or_default()
            .to_string();
        if queue.contains(&want) && queue.contains("<td class=\"priority\">7</td>") {
            break;
        }
        lab.ctl.state.wake.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(queue.contains(&want), "{queue}");
    assert!(queue.contains("<td class=\"priority\">7</td>"), "{queue}");
    assert_eq!(
        stored_lease(&lab, &second).await.status.unwrap().priority,
        7
    );
    lab.ctl.shutdown().await;
}
