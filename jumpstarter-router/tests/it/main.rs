//! Router tests: a real TLS router on loopback, raw streams as the client and exporter.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod binary;
mod refusals;

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use jumpstarter_core::{
    auth::CertificateAuthority,
    client::{ConnectOptions, connect_channel},
};
use jumpstarter_proto::v1::{
    FrameType, StreamRequest, StreamResponse, router_service_client::RouterServiceClient,
};
use jumpstarter_router::{Router, RouterConfig, RouterTokenKey, serve};
use tokio::sync::mpsc;
use tonic::{Code, Request, Status, Streaming};

struct TestRouter {
    addr: String,
    ca: String,
    key: RouterTokenKey,
    router: Router,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(pair_timeout: Duration) -> TestRouter {
    let ca = CertificateAuthority::generate("test ca").unwrap();
    let cert = ca.issue_server_cert(&["localhost"]).unwrap();
    let (key, _) = RouterTokenKey::generate().unwrap();
    let router = Router::new(key.clone(), RouterConfig { pair_timeout });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(
        router.clone(),
        listener,
        Some(cert),
        jumpstarter_core::server::listener::ConnectionGuard::new("router", Default::default()),
        async {
            let _ = stopped.await;
        },
    ));
    TestRouter {
        addr: format!("localhost:{port}"),
        ca: ca.cert_pem().to_string(),
        key,
        router,
        _stop: stop,
    }
}

/// One end of a tunnel: a sender of frames and the responses.
struct End {
    tx: mpsc::Sender<StreamRequest>,
    rx: Streaming<StreamResponse>,
}

async fn open(r: &TestRouter, token: &str) -> Result<End, Status> {
    let channel = connect_channel(
        &r.addr,
        &ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: Some(r.ca.clone().into_bytes()),
        },
    )
    .await
    .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let mut req = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let resp = RouterServiceClient::new(channel).stream(req).await?;
    Ok(End {
        tx,
        rx: resp.into_inner(),
    })
}

fn data(b: &[u8]) -> StreamRequest {
    StreamRequest {
        payload: b.to_vec().into(),
        frame_type: FrameType::Data as i32,
    }
}

async fn next(end: &mut End) -> Option<Result<StreamResponse, Status>> {
    tokio::time::timeout(Duration::from_secs(10), end.rx.next())
        .await
        .expect("no frame within 10s")
}

#[tokio::test]
async fn pairs_two_streams_and_forwards_frames_unchanged() {
    let r = start(Duration::from_secs(30)).await;
    let token = r.key.issue().unwrap().token;
    let mut a = open(&r, &token).await.unwrap();
    let mut b = open(&r, &token).await.unwrap();
    a.tx.send(data(b"from a")).await.unwrap();
    let f = next(&mut b).await.unwrap().unwrap();
    assert_eq!(f.payload, &b"from a"[..]);
    b.tx.send(data(b"from b")).await.unwrap();
    b.tx.send(StreamRequest {
        payload: Default::default(),
        frame_type: FrameType::Ping as i32,
    })
    .await
    .unwrap();
    assert_eq!(next(&mut a).await.unwrap().unwrap().payload, &b"from b"[..]);
    assert_eq!(
        next(&mut a).await.unwrap().unwrap().frame_type,
        FrameType::Ping as i32
    );
    // Many frames keep their order.
    for i in 0..200u32 {
        a.tx.send(data(&i.to_be_bytes())).await.unwrap();
    }
    for i in 0..200u32 {
        assert_eq!(
            next(&mut b).await.unwrap().unwrap().payload,
            &i.to_be_bytes()[..]
        );
    }
    let stats = r.router.stats();
    assert_eq!(
        stats
            .active_tunnels
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // One side ending ends the other.
    drop(a.tx);
    assert!(next(&mut b).await.is_none_or(|r| r.is_err()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        stats
            .active_tunnels
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn bad_tokens_are_refused() {
    let r = start(Duration::from_secs(30)).await;
    let (other_key, _) = RouterTokenKey::generate().unwrap();
    let forged = other_key.issue().unwrap().token;
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let expired = r.key.issue_at("stream-x", hour_ago).unwrap().token;
    for token in [forged.as_str(), expired.as_str(), "garbage", ""] {
        let e = match open(&r, token).await {
            Err(e) => e,
            Ok(mut end) => match next(&mut end).await {
                Some(Err(e)) => e,
                other => panic!("token {token:?} accepted: {other:?}"),
            },
        };
        assert!(
            matches!(e.code(), Code::Unauthenticated | Code::InvalidArgument),
            "{token:?}: {e:?}"
        );
    }
}

#[tokio::test]
async fn a_third_stream_on_a_paired_token_is_refused() {
    let r = start(Duration::from_secs(30)).await;
    let token = r.key.issue().unwrap().token;
    let mut a = open(&r, &token).await.unwrap();
    let mut b = open(&r, &token).await.unwrap();
    let third = open(&r, &token).await;
    let e = match third {
        Err(e) => e,
        Ok(mut end) => next(&mut end).await.unwrap().unwrap_err(),
    };
    assert_eq!(e.code(), Code::AlreadyExists);
    // The pair is unaffected.
    a.tx.send(data(b"still here")).await.unwrap();
    assert_eq!(
        next(&mut b).await.unwrap().unwrap().payload,
        &b"still here"[..]
    );
    let _ = &mut a;
}

#[tokio::test]
async fn streams_of_different_tokens_do_not_pair_and_time_out() {
    let r = start(Duration::from_millis(300)).await;
    let t1 = r.key.issue().unwrap().token;
    let t2 = r.key.issue().unwrap().token;
    let mut a = open(&r, &t1).await.unwrap();
    let mut b = open(&r, &t2).await.unwrap();
    a.tx.send(data(b"lost")).await.unwrap();
    let e = next(&mut b).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    let e = next(&mut a).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
}

/// Issue 27: a client that stops reading is throttled: its exporter end can soon push no more
/// (what is in flight is bounded by the HTTP/2 windows and the router's buffer, not kept
/// growing in the router), another tunnel through the same router still carries its frames,
/// and once the client reads again it gets every frame that was pushed, in order.
#[tokio::test]
async fn a_client_that_stops_reading_is_throttled_and_other_tunnels_still_flow() {
    let r = start(Duration::from_secs(30)).await;
    let token = r.key.issue().unwrap().token;
    let exporter = open(&r, &token).await.unwrap();
    let mut slow = open(&r, &token).await.unwrap();
    // Paired: one frame through before the client stops reading.
    exporter.tx.send(data(b"first")).await.unwrap();
    assert_eq!(
        next(&mut slow).await.unwrap().unwrap().payload,
        &b"first"[..]
    );

    const CHUNK: usize = 256 * 1024;
    // 64 MiB: far more than the windows and buffers on the way hold.
    const LIMIT: usize = 256;
    let mut pushed = 0usize;
    let mut throttled = false;
    while pushed < LIMIT {
        let mut chunk = vec![0u8; CHUNK];
        chunk[..8].copy_from_slice(&(pushed as u64).to_be_bytes());
        match tokio::time::timeout(Duration::from_secs(2), exporter.tx.send(data(&chunk))).await {
            Ok(sent) => {
                sent.unwrap();
                pushed += 1;
            }
            Err(_) => {
                throttled = true;
                break;
            }
        }
    }
    assert!(
        throttled,
        "{pushed} chunks of 256 KiB went into a tunnel whose client does not read"
    );

    // Another tunnel is not held up.
    let other = r.key.issue().unwrap().token;
    let a = open(&r, &other).await.unwrap();
    let mut b = open(&r, &other).await.unwrap();
    for i in 0..50u32 {
        a.tx.send(data(&i.to_be_bytes())).await.unwrap();
        assert_eq!(
            next(&mut b).await.unwrap().unwrap().payload,
            &i.to_be_bytes()[..]
        );
    }

    // The slow client reads again: every byte pushed arrives, in order. (DATA frames are a
    // byte stream: the router may pass a chunk on in the pieces it arrived in.)
    let mut got = Vec::with_capacity(pushed * CHUNK);
    while got.len() < pushed * CHUNK {
        let f = next(&mut slow).await.unwrap().unwrap();
        assert_eq!(f.frame_type, FrameType::Data as i32);
        got.extend_from_slice(&f.payload);
    }
    assert_eq!(got.len(), pushed * CHUNK);
    for (i, chunk) in got.chunks(CHUNK).enumerate() {
        assert_eq!(
            chunk[..8],
            (i as u64).to_be_bytes(),
            "chunk {i} out of order"
        );
        assert!(chunk[8..].iter().all(|b| *b == 0), "chunk {i} changed");
    }
}
