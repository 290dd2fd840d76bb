//! The dashboard's layout: the page around each page's content (navigation, who is logged
//! in, the live marker, the confirmation dialog), a page's error, and the login form.

use axum::{
    http::{HeaderMap, StatusCode},
    response::{Html, IntoResponse, Response},
};
use maud::{DOCTYPE, Markup, html};

use super::session::{Login, Role};

/// A rendered page as an HTML response.
pub fn html(m: Markup) -> Html<String> {
    Html(m.into_string())
}

/// Which page a layout is for (the navigation marks it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Fleet,
    Leases,
    Pools,
    Exporter,
}

/// Whether the request asks for the content only.
pub fn wants_fragment(headers: &HeaderMap) -> bool {
    headers
        .get("x-ui-fragment")
        .is_some_and(|v| v.as_bytes() == b"1")
}

/// The page around `content`, or `content` alone for a fragment request. `watch` names the
/// change counters (`exporters leases pools`) after which the script fetches it again.
pub fn page(
    headers: &HeaderMap,
    login: &Login,
    title: &str,
    nav: Nav,
    watch: &str,
    content: Markup,
) -> Html<String> {
    if wants_fragment(headers) {
        return html(content);
    }
    let link = |n: Nav, href: &str, text: &str| {
        html! { a href=(href) class=[(n == nav).then_some("current")] { (text) } }
    };
    html(html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " - Jumpstarter" }
                link rel="stylesheet" href="/ui/static/ui.css";
                script src="/ui/static/ui.js" defer {}
            }
            body data-role=(login.role.as_str()) data-csrf=(login.csrf) data-watch=(watch) {
                header {
                    strong { "Jumpstarter" }
                    nav {
                        (link(Nav::Fleet, "/ui", "Fleet"))
                        (link(Nav::Leases, "/ui/leases", "Leases"))
                        (link(Nav::Pools, "/ui/pools", "Pools"))
                    }
                    span class="who" {
                        @match &login.role {
                            Role::Admin => "admin",
                            Role::Client { namespace, name } => { "client " (namespace) "/" (name) }
                        }
                    }
                    span id="live" class="live" title="live updates" { "" }
                    form method="post" action="/ui/logout" class="logout" {
                        input type="hidden" name="csrf" value=(login.csrf);
                        button id="logout" type="submit" { "Log out" }
                    }
                }
                div id="flash" role="status" {}
                main id="content" { (content) }
                @if login.is_admin() {
                    dialog id="confirm" {
                        p id="confirm-text" { "Are you sure?" }
                        div class="buttons" {
                            button id="confirm-no" type="button" { "Cancel" }
                            button id="confirm-yes" type="button" { "Confirm" }
                        }
                    }
                }
            }
        }
    })
}

/// A 400/404 page naming what is wrong.
pub fn error_page(
    headers: &HeaderMap,
    login: &Login,
    status: StatusCode,
    nav: Nav,
    message: &str,
) -> Response {
    (
        status,
        page(
            headers,
            login,
            "Error",
            nav,
            "",
            html! { p id="error" class="error" { (message) } },
        ),
    )
        .into_response()
}

/// The login page, with `error` after a refused login, and a "Log in with OIDC" button for
/// each of `issuers` (the controller's external OIDC issuers).
pub fn login_page(error: Option<&str>, logged_in: Option<&Login>, issuers: &[String]) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Log in - Jumpstarter" }
                link rel="stylesheet" href="/ui/static/ui.css";
            }
            body class="login" {
                main {
                    h1 { "Jumpstarter dashboard" }
                    @if let Some(l) = logged_in {
                        p { "You are logged in as " (l.role.as_str()) ". " a href="/ui" { "Go to the fleet" } "." }
                    }
                    @if let Some(e) = error {
                        p id="login-error" class="error" { (e) }
                    }
                    form method="post" action="/ui/login" {
                        label for="token" {
                            "Paste a token: the admin token (the " code { "jsadmin_..." }
                            " line of the controller's " code { "admin-token" } " file) to see and act, "
                            "or, to see, a client token (the " code { "token" } " of a client "
                            "config) or a token of an OIDC issuer the controller trusts."
                        }
                        textarea id="token" name="token" rows="4" autocomplete="off"
                            spellcheck="false" required {}
                        button id="login-submit" type="submit" { "Log in" }
                    }
                    @if !issuers.is_empty() {
                        p class="oidc" {
                            "Or log in (to see) through an OIDC issuer, as the client that has "
                            "your username:"
                        }
                        @for (i, issuer) in issuers.iter().enumerate() {
                            p class="oidc" {
                                a id=(format!("oidc-login-{i}")) class="button"
                                    href=(format!("/ui/login/oidc/start?issuer={}",
                                        jumpstarter_core::oidc::url_encode(issuer))) {
                                    "Log in with OIDC: " (issuer)
                                }
                            }
                        }
                    }
                    p class="note" {
                        "The token stays on the controller; the browser keeps only a session "
                        "cookie, for 12 hours."
                    }
                }
            }
        }
    }
}
