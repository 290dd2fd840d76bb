//! The exporter runtime as a library: what an embedder's own binary or test harness does
//! with the `Exporter` facade, with the stock drivers and no CLI.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;

use jumpstarter_core::{
    client::{ConnectOptions, ExporterSession},
    config::ExporterConfig,
    server::local_socket_path,
};
use jumpstarter_exporter::{Exporter, ExporterError};

const CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: bench-1
endpoint: \"\"
token: \"\"
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
";

fn exporter(text: &str) -> Exporter {
    let path = Path::new("/lab/bench-1.yaml");
    let mut config = ExporterConfig::parse(text, path).unwrap();
    config.path = Some(path.to_path_buf());
    Exporter::from_config(config, jumpstarter_drivers::stock_registry())
}

#[tokio::test]
async fn a_local_exporter_serves_its_drivers_on_a_socket_until_stopped() {
    let local = exporter(CONFIG).local().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = local_socket_path(dir.path());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        local
            .serve_unix(&socket, async {
                let _ = stopped.await;
            })
            .unwrap(),
    );

    let session = ExporterSession::connect(&socket.to_string_lossy(), &ConnectOptions::default())
        .await
        .unwrap();
    let power = session.driver("power").unwrap();
    let () = power.call("on", ()).await.unwrap();
    let () = power.call("off", ()).await.unwrap();

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    local.close().await;
}

#[tokio::test]
async fn controller_mode_without_a_controller_is_refused_naming_the_field() {
    let e = exporter(CONFIG)
        .run(std::future::pending::<()>())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            ExporterError::MissingField {
                field: "endpoint",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("/lab/bench-1.yaml"), "{e}");
}

/// A typo of a Rust driver's type is named as one, whatever Python could do with it.
#[tokio::test]
async fn a_typo_in_a_rust_drivers_type_says_did_you_mean() {
    let text = CONFIG.replace("MockPower", "MockPowr");
    let e = jumpstarter_core::error_chain(&exporter(&text).local().await.err().unwrap());
    assert!(
        e.ends_with(
            "export.power.type: unknown driver type \"jumpstarter_driver_power.driver.MockPowr\": \
             did you mean \"jumpstarter_driver_power.driver.MockPower\"?"
        ),
        "{e}"
    );
}

#[tokio::test]
async fn an_unknown_driver_type_is_refused_before_anything_is_served() {
    let text = CONFIG.replace(
        "jumpstarter_driver_power.driver.MockPower",
        "no_such_package.driver.Nothing",
    );
    // Python cannot import it either (or is not there): the error names the type's field.
    let e = exporter(&text).local().await.err().unwrap();
    let text = jumpstarter_core::error_chain(&e);
    assert!(matches!(e, ExporterError::Build { .. }), "{e:?}");
    assert!(
        text.starts_with("exporter bench-1: ") && text.contains("export.power.type"),
        "{text}"
    );
}
