//! Service tests: a real controller over TLS on loopback, driven with raw gRPC as the
//! upstream exporter and client would.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod admin;
mod admin_apply;
mod crds;
mod data_dir;
mod deploy;
mod flow;
mod idle_connections;
#[cfg(feature = "kubernetes")]
mod kube_server;
#[cfg(feature = "kubernetes")]
mod kube_store;
mod limits;
mod log_gathering;
mod log_output;
mod login_page;
mod oidc;
mod pending_guard;
mod policy_update;
mod real_kube;
#[cfg(feature = "kubernetes")]
mod real_kube_pools;
mod real_kube_storm;
mod restart;
mod sharing;
mod store_integrity;
mod ui;
mod ui_http;
mod ui_oidc;

use jumpstarter_controller::{
    ControllerConfig, RunningController,
    objects::{Client, ClientSpec, Exporter, ExporterSpec},
    start,
    store::Store,
};
use jumpstarter_core::{
    auth::{ObjectKind, Subject},
    client::{ConnectOptions, SessionChannel, connect_channel},
};

pub struct Lab {
    pub ctl: RunningController,
    pub dir: tempfile::TempDir,
}

pub async fn lab() -> Lab {
    lab_configured(|_| {}).await
}

/// [`lab`] with its controller's config changed by `change` first.
pub async fn lab_configured(change: impl FnOnce(&mut ControllerConfig)) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ControllerConfig {
        admin_config: Some(dir.path().join("config/admin.yaml")),
        metrics_listen: Some("127.0.0.1:0".into()),
        ..ControllerConfig::loopback(dir.path().join("data"))
    };
    change(&mut config);
    let ctl = start(config).await.unwrap();
    Lab { ctl, dir }
}

/// A channel to `ctl`'s gRPC listener over TLS, trusting its CA (as a client on this
/// machine connects).
pub async fn tls_channel<S: jumpstarter_controller::store::Store>(
    ctl: &RunningController<S>,
) -> jumpstarter_core::client::SessionChannel {
    jumpstarter_core::client::connect_channel(
        &format!("localhost:{}", ctl.addr.port()),
        &jumpstarter_core::client::ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: Some(ctl.ca_pem.clone().into_bytes()),
        },
    )
    .await
    .unwrap()
}

/// Who a test acts as.
#[derive(Clone)]
pub struct Identity {
    pub kind: ObjectKind,
    pub name: String,
    pub token: String,
}

impl Lab {
    pub async fn client(&self, name: &str) -> Identity {
        let mut c = Client::new(name, ClientSpec::default());
        c.metadata.namespace = Some("default".into());
        let c = self.ctl.state.store.create(&c).await.unwrap();
        self.identity(ObjectKind::Client, name, c.metadata.uid.unwrap())
    }

    pub async fn exporter(&self, name: &str, labels: &[(&str, &str)]) -> Identity {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let e = self.ctl.state.store.create(&e).await.unwrap();
        self.identity(ObjectKind::Exporter, name, e.metadata.uid.unwrap())
    }

    fn identity(&self, kind: ObjectKind, name: &str, uid: String) -> Identity {
        let token = self
            .ctl
            .state
            .auth
            .issuer
            .issue(&Subject::new(kind, "default", name, uid))
            .unwrap()
            .token;
        Identity {
            kind,
            name: name.into(),
            token,
        }
    }

    pub async fn channel(&self) -> SessionChannel {
        connect_channel(
            &format!("localhost:{}", self.ctl.addr.port()),
            &ConnectOptions {
                insecure: false,
                passphrase: None,
                ca_pem: Some(self.ctl.ca_pem.clone().into_bytes()),
            },
        )
        .await
        .unwrap()
    }
}

/// A request carrying the upstream authentication metadata.
pub fn req<T>(who: &Identity, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    let md = r.metadata_mut();
    md.insert(
        "authorization",
        format!("Bearer {}", who.token).parse().unwrap(),
    );
    md.insert("jumpstarter-kind", who.kind.as_str().parse().unwrap());
    md.insert("jumpstarter-namespace", "default".parse().unwrap());
    md.insert("jumpstarter-name", who.name.parse().unwrap());
    r
}
