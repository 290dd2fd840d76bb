//! Test support, compiled only for tests and with the `test-util` feature (never in a
//! release build): the fakes this crate's tests and the CLI's end-to-end tests share.
//!
//! - [`FakeApiServer`]: an in-memory Kubernetes API server for [`crate::store::KubeStore`].
//! - [`FakeIssuer`]: an OIDC issuer on loopback HTTPS for the external-authentication tests.

// Test support fails loudly: a broken fixture is a failed test, not an error to handle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod fake_api;
pub mod fake_issuer;

pub use fake_api::{FakeApiServer, FakeBody};
pub use fake_issuer::{DeviceOutcome, DeviceScript, FakeIssuer};

/// A controller state over `store` with newly made token and router keys, no routers and a
/// placeholder endpoint: for tests and benchmarks that drive the state directly (a real
/// controller keeps its keys in its data directory).
pub fn state_with_new_keys<S: crate::store::Store>(
    store: S,
) -> std::sync::Arc<crate::ControllerState<S>> {
    let issuer = std::sync::Arc::new(crate::auth::TokenIssuer::generate().unwrap());
    let (router_key, _) = jumpstarter_router::RouterTokenKey::generate().unwrap();
    crate::ControllerState::new(store, issuer, router_key, vec![], "localhost:1".into())
}

/// Re-reads exporter `namespace/name`, lets `f` change its status and writes it, again on a
/// conflict (the controller's own background writes, such as when exporters were last seen,
/// may land between a test's read and its write), as the controller's services do.
pub async fn update_exporter_status<S: crate::store::Store>(
    store: &S,
    namespace: &str,
    name: &str,
    mut f: impl FnMut(&mut crate::objects::Exporter),
) -> crate::objects::Exporter {
    crate::service::controller::update_exporter(store, namespace, name, true, |e| {
        f(e);
        true
    })
    .await
    .unwrap()
}

/// The exporter event recorder and leader election, for the tests against a real API server
/// (`tests/it/real_kube.rs`).
pub mod internals {
    pub use crate::kubernetes::events::{EventRecorder, EventType, ExporterEvent, reasons};
    pub use crate::kubernetes::leader::{LeaderConfig, LeaderElector};
}
