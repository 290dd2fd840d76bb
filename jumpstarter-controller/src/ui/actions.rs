//! The admin's actions: end a lease, quarantine or unquarantine an exporter, disable or
//! enable it. Each needs an admin login and the session's CSRF token (`csrf` form field), then
//! calls the admin API's own function for it (`crate::service::admin`: the one code path that
//! writes the change, the admin token checked as its RPCs check it; unquarantine is
//! `ClearExporterHealth`'s, end a lease shares `DeleteLease`'s write), and is logged with who
//! did it (by the admin API and here).

use axum::{
    Form,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use tonic::{Code, metadata::MetadataMap};

use super::{
    app::{Ui, UiState},
    login,
    session::{CsrfForm, Login},
};
use crate::store::Store;

/// Longest namespace or name accepted in a path.
const MAX_NAME: usize = 253;

/// A refused or failed action, as an HTTP answer naming why.
fn refuse(status: StatusCode, why: impl Into<String>) -> Response {
    (status, why.into()).into_response()
}

/// The admin login of an action request, with its CSRF token checked; else 401 or 403.
async fn admin_login<S: Store>(
    ui: &Ui<S>,
    headers: &HeaderMap,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Result<Login, Response> {
    let login = login::api_login(ui, headers).await?;
    if !login.is_admin() {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            format!(
                "forbidden: {} is logged in with a client token; the actions need the admin \
                 token",
                login.who
            ),
        ));
    }
    let csrf = match form {
        Ok(Form(f)) => f.csrf,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(e.into_response()),
        // No form at all: no CSRF token.
        Err(_) => String::new(),
    };
    if !login.csrf_matches(&csrf) {
        tracing::warn!(
            "dashboard: {} sent an action without its CSRF token; refused",
            login.who
        );
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "forbidden: the CSRF token is missing or wrong (reload the page)",
        ));
    }
    Ok(login)
}

/// Checks a namespace and name from a path (the store would refuse them less clearly).
fn names(namespace: &str, name: &str) -> Result<(), Response> {
    for (what, v) in [("namespace", namespace), ("name", name)] {
        if v.is_empty() || v.len() > MAX_NAME {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("the {what} must have 1 to {MAX_NAME} characters"),
            ));
        }
    }
    crate::service::admin_checks::validate_namespace(namespace)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("namespace: {e}")))?;
    crate::objects::selector::validate_dns1123_subdomain(name)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("name: {e}")))?;
    Ok(())
}

/// A gRPC status as an HTTP answer.
fn status_response(s: &tonic::Status) -> Response {
    let code = match s.code() {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::Aborted => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refuse(code, s.message().to_string())
}

/// The admin token as the admin API reads it (`authorization: Bearer ...`): the actions call
/// the admin API's own functions, which check it as the RPCs do.
fn admin_metadata<S: Store>(ui: &Ui<S>) -> Result<MetadataMap, Response> {
    let mut md = MetadataMap::new();
    let v = format!("Bearer {}", ui.admin_token.as_str())
        .parse()
        .map_err(|_| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the admin token cannot be sent",
            )
        })?;
    md.insert("authorization", v);
    Ok(md)
}

/// Who did an action, as the admin API logs it.
fn by(login: &Login) -> String {
    format!("{} from the dashboard", login.who)
}

/// The first steps of an action on object `namespace/name`: its admin login (CSRF token
/// checked), the names checked and the admin token to call the admin API with.
async fn admin_request<S: Store>(
    ui: &Ui<S>,
    headers: &HeaderMap,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
    namespace: &str,
    name: &str,
) -> Result<(Login, MetadataMap), Response> {
    let login = admin_login(ui, headers, form).await?;
    names(namespace, name)?;
    Ok((login, admin_metadata(ui)?))
}

/// `POST /ui/leases/{namespace}/{name}/end`: the admin API's end of a lease (it marks the
/// lease for release, as `jmp delete lease` does; the scheduler ends it).
pub async fn end_lease<S: Store>(
    State(ui): UiState<S>,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let (login, md) = match admin_request(&ui, &headers, form, &namespace, &name).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    match ui
        .admin
        .end_lease(&md, &namespace, &name, &by(&login))
        .await
    {
        Ok(_) => {
            tracing::info!(
                who = %login.who,
                "dashboard: {} ended lease {namespace}/{name}",
                login.who
            );
            (
                StatusCode::OK,
                format!("lease {namespace}/{name} is being ended"),
            )
                .into_response()
        }
        // Ended or released already.
        Err(s) if s.code() == Code::FailedPrecondition => {
            refuse(StatusCode::CONFLICT, s.message().to_string())
        }
        Err(s) => status_response(&s),
    }
}

/// `POST /ui/exporters/{namespace}/{name}/{action}`: `quarantine`, `unquarantine`, `disable`,
/// `enable`, each the admin API's own function.
pub async fn exporter_action<S: Store>(
    State(ui): UiState<S>,
    headers: HeaderMap,
    Path((namespace, name, action)): Path<(String, String, String)>,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let (login, md) = match admin_request(&ui, &headers, form, &namespace, &name).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let (ns, n, who) = (namespace.as_str(), name.as_str(), by(&login));
    let result = match action.as_str() {
        "unquarantine" => ui.admin.clear_health(&md, ns, n, &who).await,
        "quarantine" => ui.admin.quarantine_exporter(&md, ns, n, &who).await,
        "disable" => ui.admin.set_exporter_enabled(&md, ns, n, false, &who).await,
        "enable" => ui.admin.set_exporter_enabled(&md, ns, n, true, &who).await,
        other => {
            return refuse(
                StatusCode::NOT_FOUND,
                format!(
                    "unknown action {:?}: quarantine, unquarantine, disable or enable",
                    other.chars().take(40).collect::<String>()
                ),
            );
        }
    };
    match result {
        Ok(_) => {
            tracing::info!(
                who = %login.who,
                "dashboard: {} did {action} on exporter {namespace}/{name}",
                login.who
            );
            (
                StatusCode::OK,
                format!("exporter {namespace}/{name}: {action} done"),
            )
                .into_response()
        }
        Err(s) => status_response(&s),
    }
}
