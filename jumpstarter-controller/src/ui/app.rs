//! What the dashboard's handlers share: the controller's state, the admin API, the session
//! table and the view kept from the store's watch.

use std::sync::Arc;

use axum::extract::State;
use tokio::sync::watch;

use super::{
    session::{PendingLogins, Sessions},
    view::View,
};
use crate::{auth::admin_token::AdminToken, state::ControllerState, store::Store};

/// What the dashboard's handlers share.
pub(crate) struct Ui<S: Store> {
    /// The controller's state (store, auth, lease logs, pool decisions).
    pub state: Arc<ControllerState<S>>,
    /// The admin API, whose code path the admin's actions share.
    pub admin: crate::service::admin::AdminApi<S>,
    /// The admin token a login may present.
    pub admin_token: AdminToken,
    /// The logins.
    pub sessions: Sessions,
    /// The objects as the store's watch delivers them.
    pub view: Arc<View>,
    /// Says true when the controller stops (ends the event streams).
    pub stopped: watch::Receiver<bool>,
    /// How logins through the external OIDC issuers go.
    pub oidc: UiOidc,
    /// The OIDC logins waiting for the issuer's answer.
    pub pending: PendingLogins,
}

/// How the dashboard logs in through the controller's external OIDC issuers (`login`).
#[derive(Debug, Clone, Default)]
pub(crate) struct UiOidc {
    /// The client id of the authorization requests (`None`: `jumpstarter-cli` when the
    /// issuer accepts that audience, else its first audience, as `/v1/auth/config` says).
    pub client_id: Option<String>,
    /// The dashboard's public base URL (`https://lab.example.com`) for the redirect URI
    /// `<url>/ui/login/oidc/callback`; `None`: `http://` + the request's `Host`.
    pub public_url: Option<String>,
    /// The namespace of the Clients an external user logs in as (`/v1/auth/config`'s).
    pub namespace: String,
}

/// Builds the dashboard over `state` and starts keeping its view from the store.
pub(crate) fn dashboard<S: Store>(
    state: Arc<ControllerState<S>>,
    admin_token: AdminToken,
    ca_pem: String,
    stopped: watch::Receiver<bool>,
    oidc: UiOidc,
) -> Arc<Ui<S>> {
    let view = View::start(&state.store, stopped.clone());
    Arc::new(Ui {
        admin: crate::service::admin::AdminApi::new(state.clone(), admin_token.clone(), ca_pem),
        state,
        admin_token,
        sessions: Sessions::default(),
        view,
        stopped,
        oidc,
        pending: PendingLogins::default(),
    })
}

/// `State` of the handlers.
pub(crate) type UiState<S> = State<Arc<Ui<S>>>;
