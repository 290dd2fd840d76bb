//! Direct mode over TCP: plaintext, passphrase, TLS.

use std::{collections::BTreeMap, sync::Arc};

use jumpstarter_core::{
    ClientError, Session,
    client::{ConnectOptions, ExporterSession},
    server::{ServeOptions, serve_tcp},
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
        ..Default::default()
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
        ..Default::default()
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

/// Answers every call with an INTERNAL status whose `grpc-status-details-bin` is not
/// base64: in the response headers ("trailers-only") for `GetReport`, in the trailers
/// after the headers for anything else.
#[derive(Clone)]
struct MalformedDetails;

impl tonic::server::NamedService for MalformedDetails {
    const NAME: &'static str = "jumpstarter.v1.ExporterService";
}

impl tower::Service<http::Request<tonic::body::Body>> for MalformedDetails {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let mut status = http::HeaderMap::new();
        status.insert("grpc-status", http::HeaderValue::from_static("13"));
        status.insert(
            "grpc-message",
            http::HeaderValue::from_static("on%20purpose"),
        );
        status.insert(
            "grpc-status-details-bin",
            http::HeaderValue::from_static("!!not base64!!"),
        );
        let mut resp = http::Response::new(tonic::body::Body::empty());
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/grpc"),
        );
        if req.uri().path().ends_with("/GetReport") {
            resp.headers_mut().extend(status);
        } else {
            let trailers =
                futures::stream::iter([Ok::<_, tonic::Status>(http_body::Frame::trailers(status))]);
            *resp.body_mut() = tonic::body::Body::new(http_body_util::StreamBody::new(trailers));
        }
        std::future::ready(Ok(resp))
    }
}

/// tonic panics on a malformed `grpc-status-details-bin`; our channels drop the header,
/// so a bad peer is an error with its code and message, not a crash.
#[tokio::test]
async fn malformed_status_details_are_an_error_not_a_panic() {
    use jumpstarter_proto::v1::{
        DriverCallRequest, exporter_service_client::ExporterServiceClient,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MalformedDetails)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let opts = ConnectOptions {
        insecure: true,
        passphrase: None,
        ca_pem: None,
    };
    let channel = jumpstarter_core::client::connect_channel(&addr, &opts)
        .await
        .unwrap();
    let mut client = ExporterServiceClient::new(channel);
    let e = client.get_report(()).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Internal, "on purpose")
    );
    let e = client
        .driver_call(DriverCallRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Internal, "on purpose")
    );
    // Through the typed client too.
    let e = status(&addr, &opts).await.unwrap_err();
    assert!(e.to_string().contains("on purpose"), "{e}");
}
