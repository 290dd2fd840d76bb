//! The Kubernetes store: requests checked one by one against a scripted API server (the
//! kube-rs `ApiServerVerifier` pattern with tower-test), the lease flow over the in-memory
//! fake API server (the same flow against a real API server is in `real_kube`, run by `cargo
//! xtask kube-e2e`).

use futures::StreamExt;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use jumpstarter_controller::{
    LabelSelector,
    objects::{Client, ClientSpec, Exporter, ExporterSpec, ExporterStatus, Lease, LeaseSpec},
    reconcile_once,
    store::{KubeStore, ListParams, Store, StoreError, WatchEvent, credentials},
    testing::FakeApiServer,
};
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

const EXPORTERS: &str = "/apis/jumpstarter.dev/v1alpha1/namespaces/lab/exporters";

fn mock_store() -> (KubeStore, ApiHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        KubeStore::new(kube::Client::new(service, "default")),
        handle,
    )
}

/// Waits for the next request, checks its method and path (and query, when given), and
/// returns its JSON body (`Null` when empty) and the responder.
async fn expect(
    handle: &mut ApiHandle,
    method: Method,
    path: &str,
    query: Option<&str>,
) -> (Value, SendResponse<Response<Body>>) {
    let (req, send) = handle.next_request().await.expect("a request");
    assert_eq!(req.method(), method, "method of {}", req.uri());
    assert_eq!(req.uri().path(), path);
    if let Some(q) = query {
        assert_eq!(req.uri().query().unwrap_or_default(), q);
    }
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let json = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    (json, send)
}

fn respond(send: SendResponse<Response<Body>>, code: u16, body: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap(),
    );
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "code": code, "reason": reason, "message": message})
}

fn exporter_json(rv: &str, enabled: bool) -> Value {
    json!({
        "apiVersion": "jumpstarter.dev/v1alpha1", "kind": "Exporter",
        "metadata": {"name": "e1", "namespace": "lab", "uid": "uid-1", "resourceVersion": rv,
                     "generation": 1, "labels": {"board": "rpi4"}},
        "spec": {"enabled": enabled}
    })
}

pub(crate) fn exporter(name: &str, labels: &[(&str, &str)]) -> Exporter {
    let mut e = Exporter::new(name, ExporterSpec::default());
    e.metadata.namespace = Some("lab".into());
    e.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    e
}

#[tokio::test]
async fn mock_create_sends_no_server_fields_and_maps_already_exists() {
    let (store, mut handle) = mock_store();
    let server = tokio::spawn(async move {
        let (body, send) = expect(&mut handle, Method::POST, EXPORTERS, None).await;
        assert_eq!(body["metadata"]["name"], json!("e1"));
        assert_eq!(body["kind"], json!("Exporter"));
        let meta = body["metadata"].as_object().unwrap();
        for server_owned in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
            assert!(
                !meta.contains_key(server_owned),
                "{server_owned} sent: {body}"
            );
        }
        respond(send, 201, &exporter_json("7", true));
        let (_, send) = expect(&mut handle, Method::POST, EXPORTERS, None).await;
        respond(
            send,
            409,
            &status(
                409,
                "AlreadyExists",
                "exporters.jumpstarter.dev \"e1\" already exists",
            ),
        );
    });
    let mut e = exporter("e1", &[("board", "rpi4")]);
    e.metadata.resource_version = Some("3".into());
    e.metadata.uid = Some("stale".into());
    let created = store.create(&e).await.unwrap();
    assert_eq!(created.metadata.resource_version.as_deref(), Some("7"));
    assert_eq!(created.metadata.uid.as_deref(), Some("uid-1"));
    let err = store.create(&e).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    assert!(err.to_string().contains("Exporter lab/e1"), "{err}");
    server.await.unwrap();
}

#[tokio::test]
async fn mock_update_conflict_then_retry_succeeds() {
    let (store, mut handle) = mock_store();
    let item = format!("{EXPORTERS}/e1");
    let server = tokio::spawn(async move {
        let (_, send) = expect(&mut handle, Method::GET, &item, None).await;
        respond(send, 200, &exporter_json("5", true));
        let (body, send) = expect(&mut handle, Method::PUT, &item, None).await;
        assert_eq!(body["metadata"]["resourceVersion"], json!("5"));
        assert!(
            body["metadata"].get("uid").is_none(),
            "uid is the server's: {body}"
        );
        assert_eq!(body["spec"]["enabled"], json!(false));
        respond(
            send,
            409,
            &status(
                409,
                "Conflict",
                "Operation cannot be fulfilled on exporters.jumpstarter.dev \"e1\": the object has been modified",
            ),
        );
        let (_, send) = expect(&mut handle, Method::GET, &item, None).await;
        respond(send, 200, &exporter_json("6", true));
        let (body, send) = expect(&mut handle, Method::PUT, &item, None).await;
        assert_eq!(body["metadata"]["resourceVersion"], json!("6"));
        respond(send, 200, &exporter_json("8", false));
    });
    let mut conflicts = 0;
    let updated = loop {
        let mut e: Exporter = store.get("lab", "e1").await.unwrap().unwrap();
        e.spec.enabled = Some(false);
        match store.update(&e).await {
            Ok(u) => break u,
            Err(err) if err.is_conflict() => {
                assert!(err.to_string().contains("have resourceVersion 5"), "{err}");
                conflicts += 1;
            }
            Err(err) => panic!("{err}"),
        }
    };
    assert_eq!(conflicts, 1);
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("8"));
    assert!(!updated.is_enabled());
    server.await.unwrap();
}

#[tokio::test]
async fn mock_list_sends_selector_limit_and_continue() {
    let (store, mut handle) = mock_store();
    let server = tokio::spawn(async move {
        let (_, send) = expect(
            &mut handle,
            Method::GET,
            EXPORTERS,
            Some("&labelSelector=board%3Drpi4%2Cenv+in+%28a%2Cb%29&limit=2&continue=tok-1"),
        )
        .await;
        respond(
            send,
            200,
            &json!({"apiVersion": "jumpstarter.dev/v1alpha1", "kind": "ExporterList",
                    "metadata": {"resourceVersion": "42", "continue": "tok-2"},
                    "items": [exporter_json("40", true)]}),
        );
        // All namespaces, no selector, no paging.
        let (_, send) = expect(
            &mut handle,
            Method::GET,
            "/apis/jumpstarter.dev/v1alpha1/exporters",
            Some(""),
        )
        .await;
        respond(
            send,
            200,
            &json!({"apiVersion": "jumpstarter.dev/v1alpha1", "kind": "ExporterList",
                    "metadata": {"resourceVersion": "43"}, "items": []}),
        );
    });
    let page = store
        .list::<Exporter>(
            Some("lab"),
            &LabelSelector::parse("env in (a,b), board=rpi4").unwrap(),
            &ListParams {
                limit: Some(2),
                continue_token: Some("tok-1".into()),
            },
        )
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.resource_version, "42");
    assert_eq!(page.continue_token.as_deref(), Some("tok-2"));
    let all = store
        .list::<Exporter>(None, &LabelSelector::everything(), &ListParams::default())
        .await
        .unwrap();
    assert!(all.items.is_empty());
    assert_eq!(all.continue_token, None);
    server.await.unwrap();
}

#[tokio::test]
async fn mock_credential_secret_is_created_or_updated() {
    let (store, mut handle) = mock_store();
    let secrets = "/api/v1/namespaces/lab/secrets";
    let server = tokio::spawn(async move {
        let (body, send) = expect(&mut handle, Method::POST, secrets, None).await;
        assert_eq!(body["metadata"]["name"], json!("e1-exporter"));
        assert_eq!(body["type"], json!("Opaque"));
        // base64("tok-1")
        assert_eq!(body["data"]["token"], json!("dG9rLTE="));
        let owner = &body["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], json!("Exporter"));
        assert_eq!(owner["uid"], json!("uid-1"));
        assert_eq!(owner["controller"], json!(true));
        respond(
            send,
            409,
            &status(
                409,
                "AlreadyExists",
                "secrets \"e1-exporter\" already exists",
            ),
        );
        let (_, send) = expect(
            &mut handle,
            Method::GET,
            &format!("{secrets}/e1-exporter"),
            None,
        )
        .await;
        let old = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "e1-exporter", "namespace": "lab", "resourceVersion": "9"},
            "data": {"token": "b2xk"}});
        respond(send, 200, &old);
        let (body, send) = expect(
            &mut handle,
            Method::PUT,
            &format!("{secrets}/e1-exporter"),
            None,
        )
        .await;
        assert_eq!(body["metadata"]["resourceVersion"], json!("9"));
        assert_eq!(body["data"]["token"], json!("dG9rLTE="));
        let mut stored = body.clone();
        stored["metadata"]["resourceVersion"] = json!("10");
        respond(send, 200, &stored);
    });
    let e: Exporter = serde_json::from_value(exporter_json("7", true)).unwrap();
    let secret = credentials::put_credential(&store, &e, "tok-1")
        .await
        .unwrap();
    assert_eq!(secret.metadata.resource_version.as_deref(), Some("10"));
    server.await.unwrap();
}

#[tokio::test]
async fn mock_errors_name_the_object_and_map_to_store_errors() {
    let (store, mut handle) = mock_store();
    let server = tokio::spawn(async move {
        let (_, send) = expect(&mut handle, Method::GET, &format!("{EXPORTERS}/e1"), None).await;
        respond(
            send,
            403,
            &status(403, "Forbidden", "exporters is forbidden"),
        );
        // A delete reads the object first, then deletes that version of it.
        let (_, send) = expect(&mut handle, Method::GET, &format!("{EXPORTERS}/e1"), None).await;
        respond(send, 200, &exporter_json("3", true));
        let (body, send) = expect(
            &mut handle,
            Method::DELETE,
            &format!("{EXPORTERS}/e1"),
            None,
        )
        .await;
        assert_eq!(body["preconditions"]["resourceVersion"], json!("3"));
        respond(send, 404, &status(404, "NotFound", "not found"));
        let (_, send) = expect(
            &mut handle,
            Method::GET,
            EXPORTERS,
            Some("&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=1"),
        )
        .await;
        respond(
            send,
            410,
            &status(410, "Expired", "too old resource version: 1 (50)"),
        );
        let (_, send) = expect(&mut handle, Method::POST, EXPORTERS, None).await;
        respond(
            send,
            422,
            &status(422, "Invalid", "spec.enabled: Invalid value"),
        );
        let (_, send) = expect(&mut handle, Method::GET, &format!("{EXPORTERS}/e1"), None).await;
        respond(send, 500, &status(500, "InternalError", "etcd is down"));
    });
    let err = store.get::<Exporter>("lab", "e1").await.unwrap_err();
    assert!(matches!(err, StoreError::Kubernetes { .. }), "{err}");
    let said = jumpstarter_core::error_chain(&err);
    assert!(said.contains("get Exporter lab/e1"), "{said}");
    assert!(said.contains("forbidden"), "{said}");
    let err = store
        .delete::<Exporter>("lab", "e1", Some("3"))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = match store.watch::<Exporter>(Some("lab"), Some("1")).await {
        Err(e) => e,
        Ok(_) => panic!("a 410 must fail the watch"),
    };
    assert!(matches!(err, StoreError::WatchLagged { .. }), "{err}");
    let err = store.create(&exporter("e2", &[])).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    assert!(
        jumpstarter_core::error_chain(&err).contains("spec.enabled"),
        "{err:?}"
    );
    let err = store.get::<Exporter>("lab", "e1").await.unwrap_err();
    assert!(
        jumpstarter_core::error_chain(&err).contains("etcd is down"),
        "{err:?}"
    );
    // Requests that cannot be well-formed never reach the server.
    let err = store.get::<Exporter>("Bad NS", "e1").await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    let mut unnamed = exporter("x", &[]);
    unnamed.metadata.name = None;
    let err = store.create(&unnamed).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    server.await.unwrap();
}

/// A Client, an online registered Exporter and a Lease for it in `namespace`; then
/// reconcile passes until the lease, watched through the store, goes Pending -> Ready.
pub(crate) async fn lease_goes_pending_then_ready<S: Store>(
    store: S,
    namespace: &str,
    suffix: &str,
) {
    let (client_name, exporter_name, lease_name) = (
        format!("alice{suffix}"),
        format!("board{suffix}"),
        format!("lease{suffix}"),
    );
    let state = jumpstarter_controller::testing::state_with_new_keys(store.clone());
    let mut c = Client::new(&client_name, ClientSpec::default());
    c.metadata.namespace = Some(namespace.into());
    store.create(&c).await.unwrap();
    let mut e = exporter(&exporter_name, &[("board", &format!("kube-test{suffix}"))]);
    e.metadata.namespace = Some(namespace.into());
    let mut e = store.create(&e).await.unwrap();
    // Seen, but not registered yet: the lease must wait.
    e.status = Some(ExporterStatus {
        last_seen: Some(metav1::Time(jiff::Timestamp::now())),
        ..Default::default()
    });
    store.update_status(&e).await.unwrap();

    let listed = store
        .list::<Lease>(
            Some(namespace),
            &LabelSelector::everything(),
            &ListParams::default(),
        )
        .await
        .unwrap();
    let mut watch = store
        .watch::<Lease>(Some(namespace), Some(&listed.resource_version))
        .await
        .unwrap();
    let mut l = Lease::new(
        &lease_name,
        LeaseSpec {
            client_ref: LocalObjectReference {
                name: client_name.clone(),
            },
            duration: Some(jumpstarter_controller::GoDuration::from_secs(600)),
            selector: LabelSelector::parse(&format!("board=kube-test{suffix}"))
                .unwrap()
                .to_k8s(),
            ..Default::default()
        },
    );
    l.metadata.namespace = Some(namespace.into());
    store.create(&l).await.unwrap();

    let mut seen = Vec::new();
    let cond = |l: &Lease, t: &str| {
        l.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
            .map(|c| c.status.clone())
    };
    // After each pass the Lease is read back (its writes are done when the pass returns) and
    // the watch is followed up to that version: what the watch showed, in order, without
    // guessing how long the server takes to deliver an event.
    let mut last_rv = None;
    let mut follow = async |seen: &mut Vec<_>| {
        let now: Lease = store.get(namespace, &lease_name).await.unwrap().unwrap();
        let rv = now.metadata.resource_version.clone();
        if rv == last_rv {
            return;
        }
        for _ in 0..1000 {
            let ev = tokio::time::timeout(std::time::Duration::from_secs(60), watch.next())
                .await
                .unwrap_or_else(|_| panic!("the watch never showed version {rv:?}: {seen:?}"))
                .expect("the watch ended")
                .unwrap();
            if let WatchEvent::Modified(l) | WatchEvent::Added(l) = ev
                && l.metadata.name.as_deref() == Some(lease_name.as_str())
            {
                seen.push((
                    cond(&l, "Pending"),
                    cond(&l, "Ready"),
                    l.assigned_exporter().map(str::to_owned),
                ));
                if l.metadata.resource_version == rv {
                    last_rv = rv;
                    return;
                }
            }
        }
        panic!("no version {rv:?} in 1000 events: {seen:?}");
    };
    reconcile_once(&state).await.unwrap();
    follow(&mut seen).await;
    assert!(
        seen.iter()
            .any(|s| s.0.as_deref() == Some("True") && s.2.is_none()),
        "never Pending: {seen:?}"
    );
    // The exporter registers: the next passes assign it.
    let mut e: Exporter = store.get(namespace, &exporter_name).await.unwrap().unwrap();
    let mut st = e.status.clone().unwrap_or_default();
    st.devices = Some(vec![]);
    st.last_seen = Some(metav1::Time(jiff::Timestamp::now()));
    e.status = Some(st);
    store.update_status(&e).await.unwrap();
    for _ in 0..10 {
        reconcile_once(&state).await.unwrap();
        follow(&mut seen).await;
        if seen.iter().any(|s| s.1.as_deref() == Some("True")) {
            break;
        }
    }
    let ready = seen
        .iter()
        .find(|s| s.1.as_deref() == Some("True"))
        .unwrap_or_else(|| panic!("never Ready: {seen:?}"));
    assert_eq!(ready.2.as_deref(), Some(exporter_name.as_str()));
    let e: Exporter = store.get(namespace, &exporter_name).await.unwrap().unwrap();
    assert_eq!(
        e.status.unwrap().lease_ref.map(|r| r.name),
        Some(lease_name.clone())
    );

    // Clean up (matters on a real cluster).
    store
        .delete::<Lease>(namespace, &lease_name, None)
        .await
        .unwrap();
    store
        .delete::<Exporter>(namespace, &exporter_name, None)
        .await
        .unwrap();
    store
        .delete::<Client>(namespace, &client_name, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn fake_api_lease_flow_pending_to_ready() {
    let fake = FakeApiServer::new();
    lease_goes_pending_then_ready(KubeStore::new(fake.client()), "lab", "").await;
    assert!(fake.requests() > 10);
}

#[tokio::test]
async fn fake_api_watch_resumes_after_the_server_ends_a_request() {
    let fake = FakeApiServer::new();
    let store = KubeStore::new(fake.client()).with_watch_timeout(1);
    let mut watch = store.watch::<Exporter>(Some("lab"), None).await.unwrap();
    store.create(&exporter("before", &[])).await.unwrap();
    // Outlive the first request (1 s), then write again: the stream must carry on.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    store.create(&exporter("after", &[])).await.unwrap();
    let mut names = Vec::new();
    for _ in 0..2 {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(5), watch.next())
            .await
            .expect("an event")
            .expect("stream open")
            .unwrap();
        names.push(ev.object().metadata.name.clone().unwrap());
    }
    assert_eq!(names, ["before", "after"]);
}

#[tokio::test]
async fn fake_api_serves_raw_watches_and_secrets_like_a_cluster() {
    use kube::api::{WatchEvent as RawEvent, WatchParams};
    let fake = FakeApiServer::new();
    let store = KubeStore::new(fake.client());
    store
        .create(&exporter("old", &[("pool", "a")]))
        .await
        .unwrap();
    store
        .create(&exporter("other", &[("pool", "b")]))
        .await
        .unwrap();
    let api: kube::Api<Exporter> = kube::Api::namespaced(fake.client(), "lab");
    // No resourceVersion: the current matching objects first, then changes.
    let mut raw = api
        .watch(&WatchParams::default().labels("pool=a").timeout(5), "")
        .await
        .unwrap()
        .boxed();
    store
        .create(&exporter("new", &[("pool", "b")]))
        .await
        .unwrap();
    store
        .create(&exporter("newer", &[("pool", "a")]))
        .await
        .unwrap();
    let mut names = Vec::new();
    for _ in 0..2 {
        match raw.next().await.unwrap().unwrap() {
            RawEvent::Added(e) => names.push(e.metadata.name.unwrap()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(names, ["old", "newer"]);

    // Secrets live under the core API group.
    let e: Exporter = store.get("lab", "old").await.unwrap().unwrap();
    credentials::put_credential(&store, &e, "t1").await.unwrap();
    credentials::put_credential(&store, &e, "t2").await.unwrap();
    assert_eq!(
        credentials::read_credential(&store, "lab", "old-exporter")
            .await
            .unwrap()
            .as_deref(),
        Some("t2")
    );
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(fake.client(), "lab");
    let s = secrets.get("old-exporter").await.unwrap();
    assert_eq!(s.metadata.owner_references.unwrap()[0].name, "old");
}

#[tokio::test]
async fn sqlite_lease_flow_pending_to_ready() {
    let dir = tempfile::tempdir().unwrap();
    let store = jumpstarter_controller::store::SqliteStore::open(dir.path())
        .await
        .unwrap();
    lease_goes_pending_then_ready(store, "lab", "").await;
}
