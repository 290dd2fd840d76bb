//! The web dashboard (`--ui-listen`, see `docs/dashboard.md`): the fleet, the leases and the
//! queue, one exporter, and the exporter pools, as pages under `/ui` that update themselves
//! from the controller's watch of its store (server-sent events), with the admin's actions
//! (end a lease, quarantine, disable) behind an in-page confirmation.
//!
//! - [`serve`] runs it on a listener: bounded connections, request bodies and request times
//!   (as the other listeners).
//! - `app`: what the handlers share (`Ui`).
//! - `login`: the login (an admin token, a client token, an external OIDC issuer's token
//!   pasted or obtained through the issuer's login page) and each request's check of it;
//!   `session`: the session table, its cookie and CSRF token.
//! - `view`: the objects the pages show, kept from the store's watch, and the change counters
//!   the event stream reports.
//! - `layout`: the page around each page; `pages`: the HTML (maud) of each page; `actions`:
//!   the admin's POSTs; `events`: the event stream. `ui.js` and `ui.css` are vendored (no
//!   build step).

// A handler's refusal is its HTTP answer (`Err(Response)`), made at most once per request.
#![allow(clippy::result_large_err)]

mod actions;
mod app;
mod events;
mod layout;
mod login;
mod pages;
mod session;
mod view;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{DefaultBodyLimit, Request},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};

use crate::store::Store;

pub(crate) use app::{Ui, UiOidc, dashboard};

/// Connections open at once; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 128;
/// Bytes a request body may have (a pasted token is a few kilobytes).
pub const MAX_BODY: usize = 16 * 1024;
/// A request other than the event stream must be answered within this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// A connection on which nothing was read or written for this long is closed (an idle
/// keep-alive connection, or one that sends its request too slowly); an event stream writes
/// every 15 seconds.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(45);

/// The routes (see the module docs and `docs/dashboard.md`).
pub(crate) fn router<S: Store>(ui: Arc<Ui<S>>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route(
            "/ui/login",
            get(login::login_form::<S>).post(login::login_submit::<S>),
        )
        .route("/ui/logout", post(login::logout::<S>))
        .route("/ui/login/oidc/start", get(login::oidc_start::<S>))
        .route("/ui/login/oidc/callback", get(login::oidc_callback::<S>))
        .route("/ui/static/ui.js", get(script))
        .route("/ui/static/ui.css", get(style))
        .route("/ui", get(pages::fleet::<S>))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/leases", get(pages::leases::<S>))
        .route("/ui/pools", get(pages::pools::<S>))
        .route(
            "/ui/exporters/{namespace}/{name}",
            get(pages::exporter::<S>),
        )
        .route("/ui/events", get(events::events::<S>))
        .route(
            "/ui/leases/{namespace}/{name}/end",
            post(actions::end_lease::<S>),
        )
        .route(
            "/ui/exporters/{namespace}/{name}/{action}",
            post(actions::exporter_action::<S>),
        )
        .fallback(not_found)
        .layer(middleware::from_fn(headers_and_timeout))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(ui)
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: the dashboard is under /ui",
    )
        .into_response()
}

/// The vendored script.
async fn script() -> Response {
    static_asset("text/javascript; charset=utf-8", include_str!("ui.js"))
}

/// The vendored style sheet.
async fn style() -> Response {
    static_asset("text/css; charset=utf-8", include_str!("ui.css"))
}

fn static_asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// Security headers on every answer, and a time bound on every request but the event stream.
async fn headers_and_timeout(request: Request, next: Next) -> Response {
    let streaming = request.uri().path() == "/ui/events";
    let mut response = if streaming {
        next.run(request).await
    } else {
        match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
            Ok(r) => r,
            Err(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the dashboard did not answer in time; try again",
            )
                .into_response(),
        }
    };
    let h = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
             frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The listener with at most [`MAX_CONNECTIONS`] connections open: one more is closed at once.
struct Bounded {
    listener: TcpListener,
    permits: Arc<Semaphore>,
}

/// A connection holding its place among the [`MAX_CONNECTIONS`], closed after
/// [`IDLE_TIMEOUT`] without a byte read or written.
struct Counted {
    stream: TcpStream,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl Counted {
    fn active(&mut self) {
        self.idle
            .as_mut()
            .reset(tokio::time::Instant::now() + IDLE_TIMEOUT);
    }
}

fn idle_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "dashboard connection idle for too long",
    )
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.idle.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(idle_error()))
            }
            other => other,
        }
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                }
                Poll::Ready(Ok(n))
            }
            // A peer that stopped reading is as idle as one that stopped writing.
            Poll::Pending if self.idle.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(idle_error()))
            }
            other => other,
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Counted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::debug!("dashboard: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let _ = stream.set_nodelay(true);
                    return (
                        Counted {
                            stream,
                            idle: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
                            _permit: permit,
                        },
                        addr,
                    );
                }
                Err(_) => {
                    tracing::warn!(
                        "dashboard: {MAX_CONNECTIONS} connections open; closing one from {addr}"
                    );
                    drop(stream);
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// Serves the dashboard on `listener` until `shutdown` resolves.
pub(crate) async fn serve<S: Store>(
    listener: TcpListener,
    ui: Arc<Ui<S>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let listener = Bounded {
        listener,
        permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
    };
    let app = router(ui);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("dashboard stopped: {e}");
    }
}
