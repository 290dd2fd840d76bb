//! ExporterService and RouterService behaviour, error codes and texts.

use futures::StreamExt;
use jumpstarter_core::value;
use jumpstarter_proto::v1::{
    DriverCallRequest, EndSessionRequest, ExporterStatus, GetStatusRequest, ResetRequest,
    StreamRequest, exporter_service_client::ExporterServiceClient,
    router_service_client::RouterServiceClient,
};
use tonic::Code;

use crate::{serve, serve_ready, thermostat::ThermostatStatus, tree};

#[tokio::test]
async fn report_describes_the_tree() {
    let served = serve_ready();
    let client = served.client().await;
    assert_eq!(client.labels().get("board").map(String::as_str), Some("x"));
    let t = client.driver("thermostat").unwrap();
    assert_eq!(t.node().client_class(), "my_lab.client.ThermostatClient");
    assert_eq!(
        t.node()
            .labels
            .get("jumpstarter.dev/name")
            .map(String::as_str),
        Some("thermostat")
    );
    let err = client.driver("nope").err().unwrap().to_string();
    assert!(err.contains("thermostat"), "{err}");
}

#[tokio::test]
async fn unary_and_streaming_calls() {
    let served = serve_ready();
    let t = served.client().await.driver("thermostat").unwrap();
    let prev: f64 = t.call("set_target", (25,)).await.unwrap();
    assert_eq!(prev, 0.0);
    let status: ThermostatStatus = t.call("status", ()).await.unwrap();
    assert_eq!(
        status,
        ThermostatStatus {
            target: 25.0,
            heating: true
        }
    );
    let readings: Vec<f64> = t
        .streaming_call::<f64>("readings", (2,))
        .await
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
        .await;
    assert_eq!(readings, vec![19.5, 19.6]);
}

async fn raw_call(
    served: &crate::Served,
    uuid: &str,
    method: &str,
    args: Vec<value::Value>,
) -> Result<value::Value, tonic::Status> {
    let mut stub = ExporterServiceClient::new(served.channel().await);
    stub.driver_call(DriverCallRequest {
        uuid: uuid.into(),
        method: method.into(),
        args,
    })
    .await
    .map(|r| r.into_inner().result.unwrap())
}

#[tokio::test]
async fn errors_map_to_upstream_codes_and_texts() {
    let served = serve_ready();
    let client = served.client().await;
    let uuid = client.driver("thermostat").unwrap().node().uuid.clone();

    let e = raw_call(&served, &uuid, "nope", vec![]).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "method nope not found on driver");

    let e = raw_call(&served, &uuid, "readings", vec![])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(
        e.message(),
        "method readings missing marker marker_drivercall"
    );

    let bogus = uuid::Uuid::new_v4().to_string();
    let e = raw_call(&served, &bogus, "status", vec![])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unknown);
    assert!(e.message().contains(&bogus), "{}", e.message());

    let e = raw_call(&served, "not-a-uuid", "status", vec![])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unknown);

    let text = value::to_value("hot").unwrap();
    let e = raw_call(&served, &uuid, "set_target", vec![text])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    let one = value::to_value(&1).unwrap();
    let e = raw_call(&served, &uuid, "status", vec![one])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unknown);
    assert_eq!(
        e.message(),
        "Thermostat.status() takes 1 positional argument but 2 were given"
    );

    let too_hot = value::to_value(&500).unwrap();
    let e = raw_call(&served, &uuid, "set_target", vec![too_hot])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("outside"), "{}", e.message());

    // After all that, the server still serves.
    let ok = raw_call(&served, &uuid, "status", vec![]).await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test]
async fn status_end_session_and_reset() {
    let served = serve_ready();
    let mut stub = ExporterServiceClient::new(served.channel().await);
    let s = stub
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.status, ExporterStatus::LeaseReady as i32);
    assert_eq!(s.status_version, 1);
    assert_eq!(s.previous_status, Some(ExporterStatus::Available as i32));
    let e = stub
        .end_session(EndSessionRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!e.success);
    assert_eq!(e.message.as_deref(), Some("No active lease context"));
    let r = stub.reset(ResetRequest {}).await.unwrap_err();
    assert_eq!(r.code(), Code::Unimplemented);
}

#[tokio::test]
async fn calls_are_refused_until_the_exporter_is_ready() {
    let served = serve(jumpstarter_core::Session::new(tree(), Default::default()));
    let uuid = served
        .client()
        .await
        .driver("thermostat")
        .unwrap()
        .node()
        .uuid
        .clone();
    let e = raw_call(&served, &uuid, "status", vec![])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .starts_with("Exporter not ready for driver calls"),
        "{}",
        e.message()
    );
    served.session.set_status(ExporterStatus::LeaseReady, None);
    assert!(raw_call(&served, &uuid, "status", vec![]).await.is_ok());
}

#[tokio::test]
async fn driver_logs_reach_log_stream() {
    let served = serve_ready();
    let channel = served.channel().await;
    let mut logs = ExporterServiceClient::new(channel)
        .log_stream(())
        .await
        .unwrap()
        .into_inner();
    let t = served.client().await.driver("thermostat").unwrap();
    let _: f64 = t.call("set_target", (22,)).await.unwrap();
    let rec = tokio::time::timeout(std::time::Duration::from_secs(5), logs.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(rec.severity, "INFO");
    assert_eq!(rec.message, "target set to 22 °C");
}

#[tokio::test]
async fn garbage_stream_metadata_is_refused_cleanly() {
    let served = serve_ready();
    let mut router = RouterServiceClient::new(served.channel().await);
    for bad in [
        None,
        Some("not json"),
        Some(r#"{"kind":"teleport"}"#),
        Some(r#"{"kind":"resource","uuid":"00000000-0000-0000-0000-000000000000"}"#),
        Some(r#"{"kind":"driver","uuid":"nope","method":"connect"}"#),
    ] {
        let mut req = tonic::Request::new(futures::stream::empty::<StreamRequest>());
        if let Some(b) = bad {
            req.metadata_mut().insert("request", b.parse().unwrap());
        }
        let e = router.stream(req).await.unwrap_err();
        assert!(
            matches!(e.code(), Code::InvalidArgument | Code::Unknown),
            "{bad:?}: {e:?}"
        );
    }
    // A driver stream on a driver without stream methods: NOT_FOUND.
    let uuid = served
        .client()
        .await
        .driver("thermostat")
        .unwrap()
        .node()
        .uuid
        .clone();
    let meta = format!(r#"{{"kind":"driver","uuid":"{uuid}","method":"connect"}}"#);
    let mut req = tonic::Request::new(futures::stream::empty::<StreamRequest>());
    req.metadata_mut().insert("request", meta.parse().unwrap());
    let e = router.stream(req).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // Still serving.
    let _: ThermostatStatus = served
        .client()
        .await
        .driver("thermostat")
        .unwrap()
        .call("status", ())
        .await
        .unwrap();
}

/// `RouterService.Stream` is served without tonic's codec: requests it cannot serve are
/// refused with a gRPC status, and the server keeps serving.
#[tokio::test]
async fn raw_stream_rpc_refuses_what_it_cannot_serve() {
    let served = serve_ready();
    let channel = served.channel().await;
    let call = |path: &'static str, encoding: Option<&'static str>| {
        let channel = channel.clone();
        async move {
            let mut req = http::Request::builder()
                .method("POST")
                .uri(path)
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .header("request", r#"{"kind":"driver","uuid":"nope","method":"x"}"#);
            if let Some(e) = encoding {
                req = req.header("grpc-encoding", e);
            }
            let req = req.body(tonic::body::Body::empty()).unwrap();
            let resp = tower::ServiceExt::oneshot(channel, req).await.unwrap();
            jumpstarter_core::wire::stream_rpc::status_from_headers(resp.headers())
                .expect("a trailers-only status")
        }
    };
    let s = call("/jumpstarter.v1.RouterService/Teleport", None).await;
    assert_eq!(s.code(), Code::Unimplemented, "{s:?}");
    let s = call("/jumpstarter.v1.RouterService/Stream", Some("gzip")).await;
    assert_eq!(s.code(), Code::Unimplemented, "{s:?}");
    assert!(s.message().contains("compression"), "{s:?}");
    let s = call("/jumpstarter.v1.RouterService/Stream", Some("identity")).await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    let _: ThermostatStatus = served
        .client()
        .await
        .driver("thermostat")
        .unwrap()
        .call("status", ())
        .await
        .unwrap();
}

/// A session whose lease ended refuses its clients' driver calls and streams at once, cuts
/// the ones in progress with the reason, and keeps answering status calls (so that a
/// client can follow the afterLease hook).
#[tokio::test]
async fn a_revoked_session_refuses_driver_calls_and_cuts_open_streams() {
    let served = serve_ready();
    let client = served.client().await;
    let thermostat = client.driver("thermostat").unwrap();
    let uuid = thermostat.node().uuid.clone();
    let mut readings = thermostat
        .streaming_call::<f64>("readings", (u32::MAX,))
        .await
        .unwrap();
    assert!(readings.next().await.unwrap().is_ok());

    served
        .session
        .revoke("lease l1 ended: its duration ran out");
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match readings.next().await {
                Some(Ok(_)) => continue,
                other => break other,
            }
        }
    })
    .await
    .expect("the open stream was not cut");
    let e = end
        .expect("the stream ended without saying why")
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("lease l1 ended: its duration ran out"),
        "{e}"
    );

    let e = raw_call(&served, &uuid, "status", vec![])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(e.message(), "lease l1 ended: its duration ran out");
    let e = thermostat
        .streaming_call::<f64>("readings", (1,))
        .await
        .err()
        .expect("a streaming call after the end");
    assert!(e.to_string().contains("lease l1 ended"), "{e}");

    // A driver stream is refused before the driver is even looked up.
    let req = http::Request::builder()
        .method("POST")
        .uri("/jumpstarter.v1.RouterService/Stream")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header(
            "request",
            format!(r#"{{"kind":"driver","uuid":"{uuid}","method":"connect"}}"#),
        )
        .body(tonic::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(served.channel().await, req)
        .await
        .unwrap();
    let s = jumpstarter_core::wire::stream_rpc::status_from_headers(resp.headers())
        .expect("a trailers-only status");
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");

    // Status calls keep working.
    let status = ExporterServiceClient::new(served.channel().await)
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status, ExporterStatus::LeaseReady as i32);
}
