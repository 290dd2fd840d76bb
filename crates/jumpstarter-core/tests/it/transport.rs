//! Direct mode over TCP: plaintext, passphrase, TLS.

use std::{collections::BTreeMap, sync::Arc};

use jumpstarter_core::{
    ClientError, Session,
    client::{ConnectOptions, ExporterSession},
    serve::{ServeOptions, serve_tcp},
};

use crate::{thermostat::ThermostatStatus, tree};

async fn serve_tcp_session(opts: ServeOptions) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let session = Session::new_ready(tree(), BTreeMap::new());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_tcp(Arc::clone(&session), listener, opts, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

async fn status(host: &str, opts: &ConnectOptions) -> Result<ThermostatStatus, ClientError> {
    ExporterSession::connect(host, opts)
        .await?
        .driver("thermostat")?
        .call("status", ())
        .await
}

#[tokio::test]
async fn plaintext_with_passphrase() {
    let (addr, _stop) = serve_tcp_session(ServeOptions {
        tls: None,
        passphrase: Some("s3cret".into()),
    })
    .await;
    let good = ConnectOptions {
        insecure: true,
        passphrase: Some("s3cret".into()),
        ca_pem: None,
    };
    status(&addr, &good).await.unwrap();
    for wrong in [None, Some("s3cre".to_string()), Some("s3cret!".into())] {
        let opts = ConnectOptions {
            insecure: true,
            passphrase: wrong,
            ca_pem: None,
        };
        let e = status(&addr, &opts).await.unwrap_err();
        assert!(
            matches!(&e, ClientError::Authentication(m) if m == "invalid or missing passphrase"),
            "{e:?}"
        );
    }
    status(&addr, &good).await.unwrap();
}

#[tokio::test]
async fn tls_with_our_ca() {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (addr, _stop) = serve_tcp_session(ServeOptions {
        tls: Some((cert.pem().into_bytes(), key.serialize_pem().into_bytes())),
        passphrase: None,
    })
    .await;
    let port = addr.rsplit(':').next().unwrap();
    let host = format!("localhost:{port}");
    let trusted = ConnectOptions {
        insecure: false,
        passphrase: None,
        ca_pem: Some(cert.pem().into_bytes()),
    };
    status(&host, &trusted).await.unwrap();
    // Without the CA the certificate is not trusted.
    let e = status(&host, &ConnectOptions::default()).await.unwrap_err();
    assert!(
        matches!(e, ClientError::Connect { .. } | ClientError::Rpc { .. }),
        "{e:?}"
    );
    // A plaintext client against a TLS server fails cleanly.
    let plain = ConnectOptions {
        insecure: true,
        ..Default::default()
    };
    assert!(status(&host, &plain).await.is_err());
}

#[tokio::test]
async fn unreachable_exporter_is_a_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let opts = ConnectOptions {
        insecure: true,
        ..Default::default()
    };
    let e = status(&addr, &opts).await.unwrap_err().to_string();
    assert!(e.contains(&addr), "{e}");
    let e = status("/nonexistent/socket", &ConnectOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/socket"), "{e}");
}
