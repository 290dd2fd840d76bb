//! Refusals as a peer sees them: each bad stream gets a status code and a message, is
//! counted, and leaves live tunnels and the router itself untouched.

use std::{
    sync::atomic::Ordering,
    time::{Duration, SystemTime},
};

use jumpstarter_core::auth::{ObjectKind, Subject, TokenIssuer};
use tonic::{Code, Status};

use crate::{End, TestRouter, data, next, open, start};

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
    let issuer = TokenIssuer::generate().unwrap();
    let controller_token = issuer
        .issue(&Subject::new(ObjectKind::Client, "default", "c", "uid-1"))
        .unwrap()
        .token;
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
