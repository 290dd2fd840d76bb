//! A custom driver, end to end: define it, serve it, call it.
//!
//! Run with `cargo run -p jumpstarter-core --example custom_driver`.
//!
//! A driver is a struct plus an `impl` block marked `#[driver(client = "...")]`. Methods
//! marked `#[export]` are unary calls, `#[export(streaming)]` server-streaming calls, and
//! `#[export(stream)]` byte streams. Arguments and results are any serde types; they travel
//! as `google.protobuf.Value`, so Python clients can call them too.

mod driver;

use std::{collections::BTreeMap, sync::Arc};

use driver::{Thermostat, ThermostatStatus};
use futures::StreamExt;
use jumpstarter_core::{DriverNode, Session};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The exporter side: a tree with one child, served on a private Unix socket.
    let root = DriverNode::new(Arc::new(Thermostat::default()));
    let tree = DriverNode::new(Arc::new(Thermostat::default())).with_child("thermostat", root);
    let session = Session::new_ready(tree, BTreeMap::new());
    let dir = tempfile::tempdir()?;
    let socket = jumpstarter_core::server::local_socket_path(dir.path());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(jumpstarter_core::server::serve_unix(
        session,
        &socket,
        async {
            let _ = stopped.await;
        },
    )?);

    // The client side: what `j` or a Rust program does.
    let opts = jumpstarter_core::client::ConnectOptions::default();
    let exporter =
        jumpstarter_core::client::ExporterSession::connect(&socket.to_string_lossy(), &opts)
            .await?;
    let thermostat = exporter.driver("thermostat")?;
    let previous: f64 = thermostat.call("set_target", (21.5,)).await?;
    let status: ThermostatStatus = thermostat.call("status", ()).await?;
    println!("previous target {previous}, now {status:?}");
    let mut readings = thermostat.streaming_call::<f64>("readings", (3,)).await?;
    while let Some(r) = readings.next().await {
        println!("reading {}", r?);
    }
    if let Err(e) = thermostat.call::<f64>("set_target", (500.0,)).await {
        println!("refused as expected: {e}");
    }

    let _ = stop.send(());
    server.await??;
    Ok(())
}
