//! Refusals as a peer sees them: each bad stream gets a status code and a message, is
//! counted, and leaves live tunnels and the router itself untouched.

use std::{
    sync::atomic::Ordering,
    time::{Duration, SystemTime},
};

use http_body_util::BodyExt;
use jumpstarter_core::auth::{
    DEFAULT_ISSUER,
    jwt::{self, Alg, Key, unix_seconds},
};
use tonic::{Code, Status};

use crate::{End, TestRouter, data, next, open, start};

/// A token shaped as the controller issues them to clients (ES256, the controller's issuer
/// and audience, a client subject): a good credential, but not a router token.
fn controller_token() -> String {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    let rng = ring::rand::SystemRandom::new();
    let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref(), &rng).unwrap();
    let now = unix_seconds(SystemTime::now());
    let claims = serde_json::json!({"iss": DEFAULT_ISSUER, "aud": ["jumpstarter"],
        "sub": "client:default:c:uid-1", "iat": now, "nbf": now, "exp": now + 3600});
    jwt::encode(
        Alg::Es256,
        Key::EcdsaSigner(&pair),
        Some("default"),
        &claims,
    )
    .unwrap()
}

/// The status a refused stream ends with, whether the router refuses at once or as the
/// first response item.
async fn refusal(r: &TestRouter, token: &str) -> Status {
    match open(r, token).await {
        Err(e) => e,
        Ok(mut end) => match next(&mut end).await {
            Some(Err(e)) => e,
            other => panic!("stream with token {token:?} was not refused: {other:?}"),
        },
    }
}

/// Sends `payload` from `a` and checks that `b` (and only `b`) gets it.
async fn passes(a: &mut End, b: &mut End, payload: &[u8]) {
    a.tx.send(data(payload)).await.unwrap();
    assert_eq!(next(b).await.unwrap().unwrap().payload, payload);
}

#[tokio::test]
async fn expired_and_foreign_tokens_are_refused_with_a_message() {
    let r = start(Duration::from_secs(30)).await;
    let stats = r.router.stats();
    let before = stats.refused_total.load(Ordering::Relaxed);

    // Minted for this router's key, but its 30 minutes are over.
    let long_ago = SystemTime::now() - Duration::from_secs(2 * 3600);
    let expired = r.key.issue_at("stream-expired", long_ago).unwrap().token;
    // A perfectly good controller token (a client's credential), but not a router token.
    let controller_token = controller_token();
    for (what, token) in [
        ("expired", expired.as_str()),
        ("controller token", controller_token.as_str()),
    ] {
        let e = refusal(&r, token).await;
        assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
        assert_eq!(e.message(), "invalid jwt token", "{what}: {e:?}");
    }
    assert_eq!(stats.refused_total.load(Ordering::Relaxed), before + 2);

    // The router still pairs good streams afterwards.
    let token = r.key.issue().unwrap().token;
    let mut a = open(&r, &token).await.unwrap();
    let mut b = open(&r, &token).await.unwrap();
    passes(&mut a, &mut b, b"after refusals").await;
}

#[tokio::test]
async fn a_third_stream_is_refused_with_a_message_and_the_pair_goes_on() {
    let r = start(Duration::from_secs(30)).await;
    let token = r.key.issue().unwrap().token;
    let mut a = open(&r, &token).await.unwrap();
    let mut b = open(&r, &token).await.unwrap();
    passes(&mut a, &mut b, b"paired").await;

    let e = refusal(&r, &token).await;
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("already used"), "{e:?}");
    // Neither half saw anything of the intruder; both directions still work.
    passes(&mut a, &mut b, b"a to b").await;
    passes(&mut b, &mut a, b"b to a").await;
    assert_eq!(
        r.router.stats().active_tunnels.load(Ordering::Relaxed),
        1,
        "the refused stream must not open or close a tunnel"
    );

    // Once the pair is gone the token stays spent.
    drop(a);
    assert!(next(&mut b).await.is_none_or(|f| f.is_err()));
    let e = refusal(&r, &token).await;
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
}

#[tokio::test]
async fn a_token_for_another_stream_does_not_join_a_tunnel() {
    let r = start(Duration::from_millis(500)).await;
    let stream_token = r.key.issue().unwrap().token;
    let other_token = r.key.issue().unwrap().token;
    let mut a = open(&r, &stream_token).await.unwrap();
    let mut b = open(&r, &stream_token).await.unwrap();

    // Valid, but for another stream: it waits for its own peer, sees none of this tunnel's
    // frames, and is ended with a clear status when none comes.
    let mut intruder = open(&r, &other_token).await.unwrap();
    passes(&mut a, &mut b, b"private").await;
    let e = next(&mut intruder).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains("no peer connected"), "{e:?}");
    assert!(next(&mut intruder).await.is_none());

    // The tunnel is unaffected.
    passes(&mut b, &mut a, b"still private").await;
}

/// Sends `body` raw as a `Stream` call on `path` with `token`; returns how the router
/// answered: the HTTP/2 response's status, if it came back as one.
async fn raw_call(r: &TestRouter, path: &'static str, token: &str, body: &'static [u8]) -> Status {
    let channel = jumpstarter_core::client::connect_channel(
        &r.addr,
        &jumpstarter_core::client::ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: Some(r.ca.clone().into_bytes()),
        },
    )
    .await
    .unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(tonic::body::Body::new(
            http_body_util::Full::new(bytes::Bytes::from_static(body))
                .map_err(|never| match never {}),
        ))
        .unwrap();
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        tower::ServiceExt::oneshot(channel, req),
    )
    .await
    .expect("no answer within 10s")
    .unwrap();
    let (parts, body) = resp.into_parts();
    if let Some(status) = Status::from_header_map(&parts.headers) {
        return status;
    }
    let collected = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("no end within 10s");
    match collected {
        Ok(c) => c
            .trailers()
            .and_then(Status::from_header_map)
            .unwrap_or_else(|| Status::ok("no trailers")),
        Err(e) => e,
    }
}

#[tokio::test]
async fn malformed_messages_end_their_tunnel_and_the_router_goes_on() {
    let r = start(Duration::from_secs(30)).await;
    let cases: [(&str, &'static [u8]); 3] = [
        // Compressed-flag set: compression was never negotiated.
        ("compressed", &[1, 0, 0, 0, 1, 0]),
        // A length prefix over the 4 MiB limit.
        ("oversized", &[0, 0xff, 0xff, 0xff, 0xff]),
        // A message that is not protobuf (field 1 claims 100 bytes, 1 follows).
        ("undecodable", &[0, 0, 0, 0, 3, 0x0a, 100, 1]),
    ];
    for (what, body) in cases {
        let token = r.key.issue().unwrap().token;
        let mut a = open(&r, &token).await.unwrap();
        let raw = raw_call(
            &r,
            jumpstarter_core::wire::stream_rpc::STREAM_PATH,
            &token,
            body,
        );
        let peer = async { next(&mut a).await };
        let (raw, peer) = tokio::join!(raw, peer);
        assert_ne!(raw.code(), Code::Ok, "{what}: {raw:?}");
        assert!(
            matches!(peer, None | Some(Err(_))),
            "{what}: the peer saw {peer:?}"
        );
    }
    // An unknown method of the service, with a valid token.
    let token = r.key.issue().unwrap().token;
    let e = raw_call(&r, "/jumpstarter.v1.RouterService/Other", &token, b"").await;
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    // The router is fine: a new pair forwards.
    let token = r.key.issue().unwrap().token;
    let mut a = open(&r, &token).await.unwrap();
    let mut b = open(&r, &token).await.unwrap();
    passes(&mut a, &mut b, b"after the bad ones").await;
    passes(&mut b, &mut a, b"and back").await;
    assert_eq!(r.router.stats().active_tunnels.load(Ordering::Relaxed), 1);
}
