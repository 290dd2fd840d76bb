//! The dashboard's OIDC logins against the fake issuer on loopback HTTPS: "Log in with OIDC"
//! (authorization code with PKCE, `state` bound to the browser, `nonce`) ends logged in as the
//! client whose username is the user's, read-only; a bad, replayed or foreign `state`, a
//! denial and an unreachable issuer are refused with a clear message; a pasted ID token logs
//! in as its client and one that is expired or for another audience is refused.

use std::{net::SocketAddr, time::Duration};

use jumpstarter_controller::{
    objects::{Client, ClientSpec},
    read_authentication_file,
    store::Store,
    testing::FakeIssuer,
};
use jumpstarter_core::oidc::{HttpsClient, url_encode};

use crate::{
    Lab, lab_configured,
    ui_http::{Answer, csrf, get, login, post, post_token, set_cookie},
};

const PREFIX: &str = "fake:";

/// A lab trusting `issuer` (username `fake:<sub>`), serving the dashboard.
async fn oidc_lab(issuer: &FakeIssuer) -> (Lab, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.yaml");
    std::fs::write(&file, issuer.authentication_yaml(PREFIX)).unwrap();
    let (auth, _) = read_authentication_file(&file).unwrap();
    let lab = lab_configured(|c| {
        c.ui_listen = Some("127.0.0.1:0".into());
        c.jwt_authenticators = auth.jwt;
    })
    .await;
    let addr = lab.ctl.ui_addr().expect("the dashboard listens");
    (lab, addr)
}

async fn add_client(lab: &Lab, name: &str, username: &str) {
    let mut c = Client::new(
        name,
        ClientSpec {
            username: Some(username.into()),
        },
    );
    c.metadata.namespace = Some("default".into());
    lab.ctl.state.store.create(&c).await.unwrap();
}

/// A begun OIDC login: the browser's binding cookie and the issuer's redirect back (path
/// and query on the dashboard).
struct Begun {
    cookie: String,
    callback: String,
}

/// Clicks "Log in with OIDC" and lets the issuer answer (it approves at once).
async fn begin(addr: SocketAddr, issuer: &FakeIssuer) -> Begun {
    let a = get(
        addr,
        &format!("/ui/login/oidc/start?issuer={}", url_encode(&issuer.url)),
        None,
    )
    .await;
    assert_eq!(a.status, 303, "{} {}", a.head, a.body);
    let (cookie, header) = set_cookie(&a, "jmp_ui_oidc").expect("a browser binding cookie");
    for part in ["httponly", "secure", "samesite=lax", "path=/ui/login/oidc"] {
        assert!(header.contains(part), "{header}");
    }
    let authorize = a.location().expect("a redirect to the issuer").to_string();
    let lower = authorize.to_lowercase();
    assert!(
        authorize.starts_with(&format!("{}/authorize?", issuer.url)),
        "{authorize}"
    );
    for part in [
        "client_id=jumpstarter-cli",
        "code_challenge_method=s256",
        "response_type=code",
        "nonce=",
        "state=",
        &format!(
            "redirect_uri={}",
            url_encode("http://localhost/ui/login/oidc/callback")
        )
        .to_lowercase(),
    ] {
        assert!(lower.contains(part), "{part} not in {authorize}");
    }
    let location = authorize;
    let http = HttpsClient::new(Some(&issuer.ca_pem), false).unwrap();
    let answer = http.get(&location).await.unwrap();
    assert_eq!(answer.status.as_u16(), 302, "{:?}", answer.body);
    let back = answer.headers["location"].to_str().unwrap().to_string();
    let callback = back
        .strip_prefix("http://localhost")
        .unwrap_or_else(|| panic!("the issuer redirects to {back}"))
        .to_string();
    assert!(
        callback.starts_with("/ui/login/oidc/callback?"),
        "{callback}"
    );
    Begun { cookie, callback }
}

/// Begins a login and brings the issuer's answer back to its own browser: the callback's
/// answer.
async fn log_in(addr: SocketAddr, issuer: &FakeIssuer) -> Answer {
    let begun = begin(addr, issuer).await;
    get(addr, &begun.callback, Some(&begun.cookie)).await
}

/// Asserts that `a` is refused with `status` and says `why`.
fn assert_refused(a: &Answer, status: u16, why: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert!(a.body.contains(why), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_in_with_oidc_ends_logged_in_as_the_user_s_client_read_only() {
    let issuer = FakeIssuer::start().await;
    let (lab, addr) = oidc_lab(&issuer).await;
    add_client(&lab, "carol", "fake:carol").await;

    // The login page offers the issuer.
    let page = get(addr, "/ui/login", None).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("oidc-login-0"), "{}", page.body);
    assert!(
        page.body.contains(&format!(
            "/ui/login/oidc/start?issuer={}",
            url_encode(&issuer.url)
        )),
        "{}",
        page.body
    );

    let begun = begin(addr, &issuer).await;
    let a = get(addr, &begun.callback, Some(&begun.cookie)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.contains("Logged in as client default/carol"),
        "{}",
        a.body
    );
    assert!(
        a.body.contains("url=/ui"),
        "the page moves on to /ui: {}",
        a.body
    );
    let (session, header) = set_cookie(&a, "jmp_ui").expect("a session cookie");
    for part in ["httponly", "secure", "samesite=strict", "path=/ui"] {
        assert!(header.contains(part), "{header}");
    }
    let (_, cleared) = set_cookie(&a, "jmp_ui_oidc").expect("the binding cookie is cleared");
    assert!(cleared.contains("max-age=0"), "{cleared}");

    // Logged in as the client: the pages, no action.
    let fleet = get(addr, "/ui", Some(&session)).await;
    assert_eq!(fleet.status, 200, "{}", fleet.body);
    assert!(
        fleet.body.contains("client default/carol"),
        "{}",
        fleet.body
    );
    assert!(
        fleet.body.contains("data-role=\"client\""),
        "{}",
        fleet.body
    );
    let token = csrf(addr, &session).await;
    let act = post(
        addr,
        "/ui/exporters/default/e1/disable",
        Some(&session),
        &format!("csrf={token}"),
    )
    .await;
    assert_eq!(act.status, 403, "{}", act.body);

    // The same answer again (a replayed state) is refused, and says so.
    let again = get(addr, &begun.callback, Some(&begun.cookie)).await;
    assert_refused(&again, 400, "already used");
    assert!(set_cookie(&again, "jmp_ui").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_foreign_or_denied_oidc_login_is_refused_with_a_clear_message() {
    let issuer = FakeIssuer::start().await;
    let (lab, addr) = oidc_lab(&issuer).await;
    add_client(&lab, "carol", "fake:carol").await;

    // A state this controller never handed out.
    let begun = begin(addr, &issuer).await;
    let forged = begun.callback.replace("state=", "state=00");
    let a = get(addr, &forged, Some(&begun.cookie)).await;
    assert_refused(&a, 400, "unknown, expired");
    assert!(set_cookie(&a, "jmp_ui").is_none());

    // The issuer's answer brought to another browser (no binding cookie, or another one).
    for cookie in [None, Some(format!("jmp_ui_oidc={}", "ab".repeat(32)))] {
        let begun = begin(addr, &issuer).await;
        let a = get(addr, &begun.callback, cookie.as_deref()).await;
        assert_refused(&a, 400, "another browser");
        assert!(set_cookie(&a, "jmp_ui").is_none());
        // ... and the login cannot be finished afterwards by its own browser either.
        let a = get(addr, &begun.callback, Some(&begun.cookie)).await;
        assert_eq!(a.status, 400, "{}", a.body);
    }

    // The user says no at the issuer.
    issuer.set_authorize_error(Some("access_denied"));
    let a = log_in(addr, &issuer).await;
    assert_refused(&a, 401, "did not log you in: access_denied");
    assert!(a.body.contains("the user said no"), "{}", a.body);
    issuer.set_authorize_error(None);

    // An ID token that is not this login's (another nonce).
    issuer.set_id_token_nonce(Some("another-login-s-nonce"));
    let a = log_in(addr, &issuer).await;
    assert_refused(&a, 401, "nonce is not this login");
    assert!(set_cookie(&a, "jmp_ui").is_none());
    issuer.set_id_token_nonce(None);

    // A user without a client.
    lab.ctl
        .state
        .store
        .delete::<Client>("default", "carol", None)
        .await
        .unwrap();
    let a = log_in(addr, &issuer).await;
    assert_refused(&a, 403, "no client in namespace default");

    // An issuer the controller does not trust.
    let a = get(
        addr,
        "/ui/login/oidc/start?issuer=https%3A%2F%2Fevil.example",
        None,
    )
    .await;
    assert_refused(&a, 400, "not an OIDC issuer this controller trusts");

    // The issuer down: the login page says so.
    let url = issuer.url.clone();
    drop(issuer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = get(
        addr,
        &format!("/ui/login/oidc/start?issuer={}", url_encode(&url)),
        None,
    )
    .await;
    assert_refused(&a, 502, "cannot reach the OIDC issuer");
    assert!(a.body.contains("login-error"), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pasted_oidc_token_logs_in_as_its_client_until_it_expires() {
    let issuer = FakeIssuer::start().await;
    let (lab, addr) = oidc_lab(&issuer).await;
    add_client(&lab, "alice", "fake:alice").await;
    // A client named after another user's name is not theirs.
    add_client(&lab, "dave", "fake:someone-else").await;

    let token = issuer.mint(&issuer.claims("alice", "jumpstarter-cli", 600));
    let session = login(addr, &token).await;
    let fleet = get(addr, "/ui", Some(&session)).await;
    assert_eq!(fleet.status, 200, "{}", fleet.body);
    assert!(
        fleet.body.contains("client default/alice"),
        "{}",
        fleet.body
    );

    // Refused: expired, for another audience, signed by another key, a user without client.
    for (token, why) in [
        (
            issuer.mint(&issuer.claims("alice", "jumpstarter-cli", -10)),
            "expired",
        ),
        (
            issuer.mint(&issuer.claims("alice", "other-app", 600)),
            "audience",
        ),
        (
            issuer.mint_with_foreign_key(
                FakeIssuer::KID,
                &issuer.claims("alice", "jumpstarter-cli", 600),
            ),
            "signature",
        ),
        (
            issuer.mint(&issuer.claims("bob", "jumpstarter-cli", 600)),
            "no client in namespace default for user &quot;fake:bob&quot;",
        ),
        (
            issuer.mint(&issuer.claims("dave", "jumpstarter-cli", 600)),
            "permission denied",
        ),
    ] {
        let a = post_token(addr, &token).await;
        assert_eq!(a.status, 401, "{why}: {}", a.body);
        assert!(a.body.contains(why), "{why}: {}", a.body);
        assert!(set_cookie(&a, "jmp_ui").is_none());
    }

    // The token's expiry ends the session.
    let short = issuer.mint(&issuer.claims("alice", "jumpstarter-cli", 2));
    let session = login(addr, &short).await;
    assert_eq!(get(addr, "/ui", Some(&session)).await.status, 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = get(addr, "/ui", Some(&session)).await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(a.location(), Some("/ui/login"));
}
