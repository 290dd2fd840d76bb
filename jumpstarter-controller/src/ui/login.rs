//! Logins to the dashboard: a token (the admin token or a client token) pasted once into the
//! login form is checked as the API checks it and kept in the session table (`session`);
//! each request's session is checked again before a page, the event stream or an action.

use axum::{
    Form,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
};
use jumpstarter_core::auth::ObjectKind;
use serde::Deserialize;

use super::{
    app::{Ui, UiState},
    layout,
    session::{CLIENT_RECHECK, CsrfForm, Login, MAX_TOKEN, NoLogin, Role, cookie, session_id},
};
use crate::store::Store;

/// The request's login: the session of its cookie, whose token still holds (a client's is
/// checked against the store again every [`CLIENT_RECHECK`]).
pub async fn login<S: Store>(ui: &Ui<S>, headers: &HeaderMap) -> Result<Login, NoLogin> {
    let id = session_id(headers).ok_or(NoLogin::Missing)?;
    let (role, csrf, token, checked) = ui.sessions.get(&id).ok_or(NoLogin::Missing)?;
    let still_valid = match &role {
        Role::Admin => ui.admin_token.matches(&token),
        Role::Client { .. } if ui.state.auth.issuer.verify(&token).is_err() => false,
        Role::Client { .. } if checked.elapsed() < CLIENT_RECHECK => true,
        Role::Client { .. } => {
            let again = check_token(ui, &token).await;
            if again.as_ref() == Ok(&role) {
                ui.sessions.checked(&id);
            }
            again.as_ref() == Ok(&role)
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
    layout::html(layout::login_page(None, logged_in.as_ref())).into_response()
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    /// The pasted token.
    #[serde(default)]
    token: String,
}

/// Checks a pasted token: the admin token, or a client token of ours whose client exists with
/// the token's uid (as the client API checks it).
async fn check_token<S: Store>(ui: &Ui<S>, token: &str) -> Result<Role, String> {
    if token.is_empty() {
        return Err("paste a token: the admin token (jsadmin_...) or a client token".into());
    }
    if token.len() > MAX_TOKEN {
        return Err(format!("a token has at most {MAX_TOKEN} characters"));
    }
    if ui.admin_token.matches(token) {
        return Ok(Role::Admin);
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
    Ok(Role::Client {
        namespace: caller.namespace,
        name: caller.name,
    })
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
                )),
            )
                .into_response();
        }
    };
    let role = match check_token(&ui, &token).await {
        Ok(r) => r,
        Err(why) => {
            tracing::info!("dashboard: login refused: {why}");
            return (
                StatusCode::UNAUTHORIZED,
                layout::html(layout::login_page(Some(&why), None)),
            )
                .into_response();
        }
    };
    let Some(id) = ui.sessions.create(role.clone(), token) else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "no randomness for a session id",
        )
            .into_response();
    };
    match &role {
        Role::Admin => tracing::info!(
            "dashboard: admin logged in (session {})",
            id.get(..8).unwrap_or_default()
        ),
        Role::Client { namespace, name } => {
            tracing::info!("dashboard: client {namespace}/{name} logged in")
        }
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie(Some(&id))),
            (header::LOCATION, "/ui".to_string()),
        ],
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
