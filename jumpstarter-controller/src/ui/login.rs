//! Logins to the dashboard: a token (the admin token, a client token, or an ID token of an
//! external OIDC issuer the controller trusts) pasted once into the login form, or an ID token
//! obtained through an issuer's own login page ("Log in with OIDC": authorization code with
//! PKCE, `oidc_start` and `oidc_callback`), is checked as the API checks it and kept in the
//! session table (`session`); each request's session is checked again before a page, the
//! event stream or an action.

use std::time::{Duration, SystemTime};

use axum::{
    Form,
    extract::Query,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{AppendHeaders, IntoResponse, Redirect, Response},
};
use jumpstarter_core::{
    auth::{ObjectKind, jwt::unix_seconds},
    oidc,
};
use maud::{DOCTYPE, html};
use serde::Deserialize;
use serde_json::Value;

use super::{
    app::{Ui, UiState},
    layout,
    session::{
        CLIENT_RECHECK, CsrfForm, Login, MAX_TOKEN, NoLogin, Pending, Role, cookie, oidc_browser,
        oidc_cookie, random_id, secrets_match, session_id,
    },
};
use crate::{auth::ExternalVerifier, store::Store};

/// The exchanges with an issuer of one login (discovery; or the code exchange and, when
/// needed, its keys) must be done within this (the request's own bound is 15 s).
const ISSUER_TIMEOUT: Duration = Duration::from_secs(10);
/// The scopes of the authorization request (`email` for issuers whose username claim it is).
const SCOPE: &str = "openid profile email";
/// The path the issuer redirects back to.
pub const CALLBACK_PATH: &str = "/ui/login/oidc/callback";

/// The request's login: the session of its cookie, whose token still holds (a client's is
/// checked against the store again every [`CLIENT_RECHECK`]).
pub async fn login<S: Store>(ui: &Ui<S>, headers: &HeaderMap) -> Result<Login, NoLogin> {
    let id = session_id(headers).ok_or(NoLogin::Missing)?;
    let found = ui.sessions.get(&id).ok_or(NoLogin::Missing)?;
    let (role, csrf, token) = (found.role, found.csrf, found.token);
    let still_valid = match (&role, found.external_exp) {
        (Role::Admin, _) => ui.admin_token.matches(&token),
        // An external issuer's token: its expiry on every request, the rest every minute.
        (Role::Client { .. }, Some(exp)) if unix_seconds(SystemTime::now()) >= exp => false,
        (Role::Client { .. }, None) if ui.state.auth.issuer.verify(&token).is_err() => false,
        (Role::Client { .. }, _) if found.checked.elapsed() < CLIENT_RECHECK => true,
        (Role::Client { .. }, _) => {
            let again = check_token(ui, &token).await;
            let same = again.as_ref().is_ok_and(|(r, _)| r == &role);
            if same {
                ui.sessions.checked(&id);
            }
            same
        }
    };
    if !still_valid {
        ui.sessions.remove(&id);
        return Err(NoLogin::Missing);
    }
    let who = match &role {
        Role::Admin => format!("admin (session {})", id.get(..8).unwrap_or_default()),
        Role::Client { namespace, name } => format!("client {namespace}/{name}"),
    };
    Ok(Login { role, csrf, who })
}

/// The login of a page request, or the redirect to the login form.
pub async fn page_login<S: Store>(ui: &Ui<S>, headers: &HeaderMap) -> Result<Login, Response> {
    login(ui, headers)
        .await
        .map_err(|_| Redirect::to("/ui/login").into_response())
}

/// The login of an event-stream or action request, or 401.
pub async fn api_login<S: Store>(ui: &Ui<S>, headers: &HeaderMap) -> Result<Login, Response> {
    login(ui, headers).await.map_err(|_| {
        (
            StatusCode::UNAUTHORIZED,
            "not logged in (or the login expired): log in at /ui/login",
        )
            .into_response()
    })
}

/// `GET /ui/login`.
pub async fn login_form<S: Store>(
    axum::extract::State(ui): UiState<S>,
    headers: HeaderMap,
) -> Response {
    let logged_in = login(&ui, &headers).await.ok();
    layout::html(layout::login_page(None, logged_in.as_ref(), &issuers(&ui))).into_response()
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    /// The pasted token.
    #[serde(default)]
    token: String,
}

/// The URLs of the external issuers (a "Log in with OIDC" button each).
fn issuers<S: Store>(ui: &Ui<S>) -> Vec<String> {
    ui.state
        .auth
        .external_auth
        .issuers()
        .map(|v| v.issuer().to_owned())
        .collect()
}

/// Checks a pasted token: the admin token, a client token of ours whose client exists with
/// the token's uid (as the client API checks it), or an external issuer's token (see
/// [`check_external`]). A client's role comes with the external token's `exp`.
async fn check_token<S: Store>(ui: &Ui<S>, token: &str) -> Result<(Role, Option<i64>), String> {
    if token.is_empty() {
        return Err(
            "paste a token: the admin token (jsadmin_...), a client token, or an ID token of \
             an OIDC issuer the controller trusts"
                .into(),
        );
    }
    if token.len() > MAX_TOKEN {
        return Err(format!("a token has at most {MAX_TOKEN} characters"));
    }
    if ui.admin_token.matches(token) {
        return Ok((Role::Admin, None));
    }
    if let Some(verifier) = ui.state.auth.external_auth.verifier_for(token) {
        let (username, claims) = verify_external(verifier, token).await?;
        let role = external_client(ui, token, &username).await?;
        return Ok((role, Some(expiry(&claims)?)));
    }
    let subject = ui.state.auth.issuer.verify(token).map_err(|e| {
        format!(
            "the token is refused: {}",
            jumpstarter_core::error_chain(&e)
        )
    })?;
    if subject.kind != ObjectKind::Client {
        return Err(
            "an exporter token cannot log in to the dashboard: use a client token or the \
             admin token"
                .into(),
        );
    }
    let mut md = tonic::metadata::MetadataMap::new();
    let pairs = [
        ("authorization", format!("Bearer {token}")),
        ("jumpstarter-kind", ObjectKind::Client.as_str().to_string()),
        ("jumpstarter-namespace", subject.namespace.clone()),
        ("jumpstarter-name", subject.name.clone()),
    ];
    for (k, v) in pairs {
        let v = v
            .parse()
            .map_err(|_| "the token holds characters a token cannot have".to_string())?;
        md.insert(k, v);
    }
    let caller = ui
        .state
        .auth
        .authenticate(&md, ObjectKind::Client)
        .await
        .map_err(|s| format!("the token is refused: {}", s.message()))?;
    Ok((
        Role::Client {
            namespace: caller.namespace,
            name: caller.name,
        },
        None,
    ))
}

/// Verifies an external issuer's token as the client API does (signature by the issuer's
/// keys, issuer, audience, expiry, claim rules): the username and the claims.
async fn verify_external(
    verifier: &ExternalVerifier,
    token: &str,
) -> Result<(String, serde_json::Map<String, Value>), String> {
    let username = verifier.verify(token).await.map_err(|e| {
        format!(
            "the token of {} is refused: {}",
            verifier.issuer(),
            jumpstarter_core::error_chain(&e)
        )
    })?;
    // Verified just now: its claims are the issuer's.
    let claims = oidc::unverified_claims(token).map_err(|e| {
        format!(
            "the token is refused: {}",
            jumpstarter_core::error_chain(&e)
        )
    })?;
    Ok((username, claims))
}

/// The `exp` of verified claims.
fn expiry(claims: &serde_json::Map<String, Value>) -> Result<i64, String> {
    claims
        .get("exp")
        .and_then(Value::as_i64)
        .ok_or_else(|| "the token has no expiry (exp)".to_string())
}

/// The Client an external token acts as, in the namespace `/v1/auth/config` names, as the
/// client API authorizes an external token without `jumpstarter-name`: the Client named
/// after the username (`dex:alice@example.com` → `alice-example-com`) whose `spec.username`
/// is the username, created first when provisioning is on.
async fn external_client<S: Store>(
    ui: &Ui<S>,
    token: &str,
    username: &str,
) -> Result<Role, String> {
    let namespace = &ui.oidc.namespace;
    let mut md = tonic::metadata::MetadataMap::new();
    let pairs = [
        ("authorization", format!("Bearer {token}")),
        ("jumpstarter-kind", ObjectKind::Client.as_str().to_string()),
        ("jumpstarter-namespace", namespace.clone()),
    ];
    for (k, v) in pairs {
        let v = v
            .parse()
            .map_err(|_| "the token holds characters a token cannot have".to_string())?;
        md.insert(k, v);
    }
    match ui.state.auth.authenticate(&md, ObjectKind::Client).await {
        Ok(caller) => Ok(Role::Client {
            namespace: caller.namespace,
            name: caller.name,
        }),
        Err(s) if s.code() == tonic::Code::NotFound => Err(format!(
            "no client in namespace {namespace} for user {username:?} ({}): an admin creates \
             it with that username (spec.username)",
            s.message()
        )),
        Err(s) => Err(format!(
            "the token of user {username:?} is refused: {}",
            s.message()
        )),
    }
}

/// `POST /ui/login`: on success a session cookie and 303 to `/ui`, else 401 with the form.
pub async fn login_submit<S: Store>(
    axum::extract::State(ui): UiState<S>,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let token = match form {
        Ok(Form(f)) => f.token.trim().to_string(),
        Err(e) => {
            let status = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            };
            return (
                status,
                layout::html(layout::login_page(
                    Some(&format!("the form could not be read: {}", e.body_text())),
                    None,
                    &issuers(&ui),
                )),
            )
                .into_response();
        }
    };
    let (role, external_exp) = match check_token(&ui, &token).await {
        Ok(r) => r,
        Err(why) => return refused(&ui, StatusCode::UNAUTHORIZED, &why),
    };
    let Some(id) = new_session(&ui, role, token, external_exp) else {
        return no_randomness();
    };
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie(Some(&id))),
            (header::LOCATION, "/ui".to_string()),
        ],
    )
        .into_response()
}

/// The login form again with `why` (logged), with `status`.
fn refused<S: Store>(ui: &Ui<S>, status: StatusCode, why: &str) -> Response {
    tracing::info!("dashboard: login refused: {why}");
    (
        status,
        layout::html(layout::login_page(Some(why), None, &issuers(ui))),
    )
        .into_response()
}

/// [`refused`] for an OIDC login, which also ends its browser binding.
fn oidc_refused<S: Store>(ui: &Ui<S>, status: StatusCode, why: &str) -> Response {
    let mut answer = refused(ui, status, why);
    if let Ok(c) = HeaderValue::from_str(&oidc_cookie(None)) {
        answer.headers_mut().insert(header::SET_COOKIE, c);
    }
    answer
}

fn no_randomness() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "no randomness for a session id",
    )
        .into_response()
}

/// A session for `role` (logged), or `None` without randomness.
fn new_session<S: Store>(
    ui: &Ui<S>,
    role: Role,
    token: String,
    external_exp: Option<i64>,
) -> Option<String> {
    let id = ui.sessions.create(role.clone(), token, external_exp)?;
    match (&role, external_exp) {
        (Role::Admin, _) => tracing::info!(
            "dashboard: admin logged in (session {})",
            id.get(..8).unwrap_or_default()
        ),
        (Role::Client { namespace, name }, None) => {
            tracing::info!("dashboard: client {namespace}/{name} logged in")
        }
        (Role::Client { namespace, name }, Some(_)) => {
            tracing::info!("dashboard: client {namespace}/{name} logged in with an OIDC token")
        }
    }
    Some(id)
}

/// The query of `GET /ui/login/oidc/start`.
#[derive(Debug, Deserialize)]
pub struct StartQuery {
    /// The issuer's URL (one of the controller's external issuers).
    #[serde(default)]
    issuer: String,
}

/// The verifier of the trusted external issuer whose URL is `issuer`, if any.
fn trusted_issuer<'a, S: Store>(ui: &'a Ui<S>, issuer: &str) -> Option<&'a ExternalVerifier> {
    ui.state
        .auth
        .external_auth
        .issuers()
        .find(|v| v.issuer() == issuer)
}

/// The client id of the dashboard's authorization requests to `verifier`'s issuer.
fn client_id<S: Store>(ui: &Ui<S>, verifier: &ExternalVerifier) -> String {
    use crate::service::login::DEFAULT_CLIENT_ID;
    if let Some(id) = &ui.oidc.client_id {
        return id.clone();
    }
    let audiences = verifier.audiences();
    if audiences.iter().any(|a| a == DEFAULT_CLIENT_ID) {
        return DEFAULT_CLIENT_ID.to_owned();
    }
    audiences
        .first()
        .cloned()
        .unwrap_or_else(|| DEFAULT_CLIENT_ID.to_owned())
}

/// The redirect URI: `--ui-public-url`, else `http://` + the request's `Host`.
fn redirect_uri<S: Store>(ui: &Ui<S>, headers: &HeaderMap) -> Result<String, String> {
    if let Some(base) = &ui.oidc.public_url {
        return Ok(format!("{base}{CALLBACK_PATH}"));
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .ok_or_else(|| {
            "the request names no usable host: start the controller with --ui-public-url"
                .to_string()
        })?;
    Ok(format!("http://{host}{CALLBACK_PATH}"))
}

/// `GET /ui/login/oidc/start?issuer=URL`: discovers the issuer, keeps a pending login (PKCE
/// verifier, `state`, `nonce`, bound to this browser by a cookie) and sends the browser to
/// the issuer's authorization endpoint (303).
pub async fn oidc_start<S: Store>(
    axum::extract::State(ui): UiState<S>,
    headers: HeaderMap,
    query: Result<Query<StartQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return oidc_refused(&ui, StatusCode::BAD_REQUEST, "the login link is malformed");
    };
    let Some(verifier) = trusted_issuer(&ui, &q.issuer) else {
        return oidc_refused(
            &ui,
            StatusCode::BAD_REQUEST,
            &format!(
                "{:?} is not an OIDC issuer this controller trusts",
                q.issuer
            ),
        );
    };
    let redirect_uri = match redirect_uri(&ui, &headers) {
        Ok(r) => r,
        Err(why) => return oidc_refused(&ui, StatusCode::BAD_REQUEST, &why),
    };
    let doc = match tokio::time::timeout(ISSUER_TIMEOUT, verifier.discovery()).await {
        Ok(Ok((doc, _))) => doc,
        Ok(Err(e)) => {
            return oidc_refused(
                &ui,
                StatusCode::BAD_GATEWAY,
                &format!(
                    "cannot reach the OIDC issuer {}: {}",
                    verifier.issuer(),
                    jumpstarter_core::error_chain(&e)
                ),
            );
        }
        Err(_) => {
            return oidc_refused(
                &ui,
                StatusCode::GATEWAY_TIMEOUT,
                &format!(
                    "the OIDC issuer {} did not answer within {} s",
                    verifier.issuer(),
                    ISSUER_TIMEOUT.as_secs()
                ),
            );
        }
    };
    let endpoint = |name: &str| doc.get(name).and_then(Value::as_str).map(str::to_owned);
    let (Some(authorize), Some(token_endpoint)) = (
        endpoint("authorization_endpoint"),
        endpoint("token_endpoint"),
    ) else {
        return oidc_refused(
            &ui,
            StatusCode::BAD_GATEWAY,
            &format!(
                "the OIDC issuer {} names no authorization_endpoint or token_endpoint in its \
                 discovery document",
                verifier.issuer()
            ),
        );
    };
    let (Ok((code_verifier, challenge)), Some(state), Some(nonce), Some(browser)) =
        (oidc::pkce_pair(), random_id(), random_id(), random_id())
    else {
        return no_randomness();
    };
    let client_id = client_id(&ui, verifier);
    let query = oidc::form_encode(&[
        ("response_type", "code"),
        ("client_id", &client_id),
        ("redirect_uri", &redirect_uri),
        ("scope", SCOPE),
        ("state", &state),
        ("nonce", &nonce),
        ("code_challenge", &challenge),
        ("code_challenge_method", "S256"),
    ]);
    let sep = if authorize.contains('?') { '&' } else { '?' };
    let Ok(location) = HeaderValue::from_str(&format!("{authorize}{sep}{query}")) else {
        return oidc_refused(
            &ui,
            StatusCode::BAD_GATEWAY,
            &format!(
                "the OIDC issuer {}'s authorization_endpoint is not a usable URL",
                verifier.issuer()
            ),
        );
    };
    ui.pending.insert(
        state,
        Pending {
            issuer: verifier.issuer().to_owned(),
            client_id,
            redirect_uri,
            token_endpoint,
            code_verifier,
            nonce,
            browser: browser.clone(),
            created: std::time::Instant::now(),
        },
    );
    let mut answer = StatusCode::SEE_OTHER.into_response();
    answer.headers_mut().insert(header::LOCATION, location);
    // Random hex: always a valid header value.
    if let Ok(c) = HeaderValue::from_str(&oidc_cookie(Some(&browser))) {
        answer.headers_mut().insert(header::SET_COOKIE, c);
    }
    answer
}

/// The query the issuer redirects back with.
#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    #[serde(default)]
    code: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

/// `GET /ui/login/oidc/callback?code=...&state=...`: takes the pending login of `state` (once,
/// from the browser that began it), exchanges the code (with the PKCE verifier) for an ID
/// token, verifies it as a pasted one plus its `nonce`, and logs in as for a pasted token.
/// The answer is a page that moves on to `/ui` itself: the session cookie is
/// `SameSite=Strict`, which a browser would not send on a redirect that began at the issuer.
pub async fn oidc_callback<S: Store>(
    axum::extract::State(ui): UiState<S>,
    headers: HeaderMap,
    query: Result<Query<CallbackQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return oidc_refused(
            &ui,
            StatusCode::BAD_REQUEST,
            "the issuer's answer is malformed",
        );
    };
    let Some(pending) = ui.pending.take(&q.state) else {
        return oidc_refused(
            &ui,
            StatusCode::BAD_REQUEST,
            "this OIDC login is unknown, expired (after 10 minutes) or already used: log in \
             again",
        );
    };
    if !oidc_browser(&headers).is_some_and(|b| secrets_match(&b, &pending.browser)) {
        return oidc_refused(
            &ui,
            StatusCode::BAD_REQUEST,
            "this OIDC login was begun in another browser (or its cookie was lost): log in \
             again",
        );
    }
    if !q.error.is_empty() {
        let mut why = format!(
            "the OIDC issuer {} did not log you in: {}",
            pending.issuer,
            q.error.chars().take(100).collect::<String>()
        );
        if !q.error_description.is_empty() {
            why += &format!(
                " ({})",
                q.error_description.chars().take(300).collect::<String>()
            );
        }
        return oidc_refused(&ui, StatusCode::UNAUTHORIZED, &why);
    }
    if q.code.is_empty() {
        return oidc_refused(
            &ui,
            StatusCode::BAD_REQUEST,
            "the OIDC issuer's answer holds no code",
        );
    }
    let Some(verifier) = trusted_issuer(&ui, &pending.issuer) else {
        return oidc_refused(
            &ui,
            StatusCode::BAD_REQUEST,
            "the OIDC issuer of this login is no longer trusted",
        );
    };
    let exchange = async {
        let tokens = oidc::code_grant(
            verifier.http(),
            &pending.token_endpoint,
            &pending.client_id,
            &q.code,
            &pending.redirect_uri,
            &pending.code_verifier,
        )
        .await
        .map_err(|e| {
            (
                StatusCode::BAD_GATEWAY,
                format!(
                    "the OIDC issuer {} refused the login's code: {}",
                    pending.issuer,
                    jumpstarter_core::error_chain(&e)
                ),
            )
        })?;
        let id_token = tokens.id_token.ok_or_else(|| {
            (
                StatusCode::BAD_GATEWAY,
                format!("the OIDC issuer {} sent no ID token", pending.issuer),
            )
        })?;
        let (username, claims) = verify_external(verifier, &id_token)
            .await
            .map_err(|why| (StatusCode::UNAUTHORIZED, why))?;
        Ok::<_, (StatusCode, String)>((id_token, username, claims))
    };
    let (id_token, username, claims) = match tokio::time::timeout(ISSUER_TIMEOUT, exchange).await {
        Ok(Ok(t)) => t,
        Ok(Err((status, why))) => return oidc_refused(&ui, status, &why),
        Err(_) => {
            return oidc_refused(
                &ui,
                StatusCode::GATEWAY_TIMEOUT,
                &format!(
                    "the OIDC issuer {} did not answer within {} s",
                    pending.issuer,
                    ISSUER_TIMEOUT.as_secs()
                ),
            );
        }
    };
    let nonce = claims.get("nonce").and_then(Value::as_str).unwrap_or("");
    if !secrets_match(nonce, &pending.nonce) {
        return oidc_refused(
            &ui,
            StatusCode::UNAUTHORIZED,
            "the ID token's nonce is not this login's: log in again",
        );
    }
    let exp = match expiry(&claims) {
        Ok(e) => e,
        Err(why) => return oidc_refused(&ui, StatusCode::UNAUTHORIZED, &why),
    };
    let role = match external_client(&ui, &id_token, &username).await {
        Ok(r) => r,
        Err(why) => return oidc_refused(&ui, StatusCode::FORBIDDEN, &why),
    };
    let who = match &role {
        Role::Client { namespace, name } => format!("client {namespace}/{name}"),
        Role::Admin => "admin".into(),
    };
    let Some(id) = new_session(&ui, role, id_token, Some(exp)) else {
        return no_randomness();
    };
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content="0; url=/ui";
                title { "Logged in - Jumpstarter" }
                link rel="stylesheet" href="/ui/static/ui.css";
            }
            body class="login" {
                main {
                    h1 { "Jumpstarter dashboard" }
                    p id="oidc-done" {
                        "Logged in as " (who) " (read-only). " a href="/ui" { "Go to the fleet" } "."
                    }
                }
            }
        }
    };
    (
        StatusCode::OK,
        AppendHeaders([
            (header::SET_COOKIE, cookie(Some(&id))),
            (header::SET_COOKIE, oidc_cookie(None)),
        ]),
        layout::html(page),
    )
        .into_response()
}

/// `POST /ui/logout`: ends the session (with its CSRF token) and clears the cookie.
pub async fn logout<S: Store>(
    axum::extract::State(ui): UiState<S>,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let login = match api_login(&ui, &headers).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let csrf = match form {
        Ok(Form(f)) => f.csrf,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return e.into_response(),
        Err(_) => String::new(),
    };
    if !login.csrf_matches(&csrf) {
        return (
            StatusCode::FORBIDDEN,
            "the CSRF token is missing or wrong: reload the page",
        )
            .into_response();
    }
    if let Some(id) = session_id(&headers) {
        ui.sessions.remove(&id);
    }
    tracing::info!("dashboard: {} logged out", login.who);
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie(None)),
            (header::LOCATION, "/ui/login".to_string()),
        ],
    )
        .into_response()
}
