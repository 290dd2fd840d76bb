//! The admin's actions: end a lease, quarantine or unquarantine an exporter, disable or
//! enable it. Each needs an admin login and the session's CSRF token (`csrf` form field),
//! writes through the same store helpers as the admin gRPC API (unquarantine is its
//! `ClearExporterHealth` itself, called with the admin token), wakes the scheduler as it does,
//! and is logged with who did it.

use axum::{
    Form,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use jumpstarter_proto::admin_v1::{ObjectRef, admin_service_server::AdminService};
use tonic::Code;

use super::{
    app::{Ui, UiState},
    login,
    session::{CsrfForm, Login},
};
use crate::{
    objects::conditions,
    service::controller::{update_exporter, update_lease},
    store::Store,
};

/// Reason of the `Healthy=False` condition an admin sets from the dashboard.
pub const REASON_QUARANTINED_BY_ADMIN: &str = "QuarantinedByAdmin";
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

/// `POST /ui/leases/{namespace}/{name}/end`: marks the lease for release (as the admin API
/// releases the leases of a deleted exporter, and a client its own); the scheduler ends it.
pub async fn end_lease<S: Store>(
    State(ui): UiState<S>,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let login = match admin_login(&ui, &headers, form).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    if let Err(r) = names(&namespace, &name) {
        return r;
    }
    let r = update_lease(&ui.state.store, &namespace, &name, |l| {
        if l.is_ended() || l.spec.release {
            return Ok(false);
        }
        l.spec.release = true;
        Ok(true)
    })
    .await;
    match r {
        Ok(l) if l.is_ended() => refuse(
            StatusCode::CONFLICT,
            format!("lease {namespace}/{name} has already ended"),
        ),
        Ok(_) => {
            ui.state.wake.notify_one();
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
        Err(s) => status_response(&s),
    }
}

/// `POST /ui/exporters/{namespace}/{name}/{action}`: `quarantine`, `unquarantine`, `disable`,
/// `enable`.
pub async fn exporter_action<S: Store>(
    State(ui): UiState<S>,
    headers: HeaderMap,
    Path((namespace, name, action)): Path<(String, String, String)>,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let login = match admin_login(&ui, &headers, form).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    if let Err(r) = names(&namespace, &name) {
        return r;
    }
    let store = &ui.state.store;
    let result = match action.as_str() {
        "unquarantine" => {
            // The admin API's own ClearExporterHealth, with the admin token.
            let mut req = tonic::Request::new(ObjectRef {
                namespace: namespace.clone(),
                name: name.clone(),
            });
            match format!("Bearer {}", ui.admin_token.as_str()).parse() {
                Ok(v) => {
                    req.metadata_mut().insert("authorization", v);
                }
                Err(_) => {
                    return refuse(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the admin token cannot be sent",
                    );
                }
            }
            ui.admin.clear_exporter_health(req).await.map(|_| ())
        }
        "quarantine" => {
            let message = format!("Quarantined by an admin from the dashboard ({})", login.who);
            update_exporter(store, &namespace, &name, true, |e| {
                if e.unhealthy().is_some() {
                    return false;
                }
                let st = e.status.get_or_insert_with(Default::default);
                crate::objects::set_condition(
                    &mut st.conditions,
                    conditions::HEALTHY,
                    false,
                    REASON_QUARANTINED_BY_ADMIN,
                    &message,
                    None,
                    jiff::Timestamp::now(),
                )
            })
            .await
            .map(|_| ())
        }
        "disable" | "enable" => {
            let enabled = action == "enable";
            update_exporter(store, &namespace, &name, false, |e| {
                if e.is_enabled() == enabled {
                    return false;
                }
                e.spec.enabled = Some(enabled);
                true
            })
            .await
            .map(|_| ())
        }
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
        Ok(()) => {
            ui.state.wake.notify_one();
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
