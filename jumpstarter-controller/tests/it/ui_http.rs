//! The dashboard tests' HTTP/1.1 client (`ui`, `ui_oidc`): one request a connection, a login
//! with a pasted token, the CSRF token of a session's pages.

use std::{net::SocketAddr, time::Duration};

use jumpstarter_core::oidc::url_encode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer: status code, head (as sent, and lower-cased), body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    raw_head: String,
    pub(crate) head: String,
    pub(crate) body: String,
}

impl Answer {
    /// The `Location` header, case kept.
    pub(crate) fn location(&self) -> Option<&str> {
        self.raw_head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("location").then(|| v.trim())
        })
    }
}

/// One request on its own connection (`Connection: close`), the whole answer read.
pub(crate) async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: Option<&str>,
    extra: &[(&str, &str)],
) -> Answer {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if let Some(id) = cookie {
        req += &format!("Cookie: {id}\r\n");
    }
    for (k, v) in extra {
        req += &format!("{k}: {v}\r\n");
    }
    match form {
        Some(body) => {
            req += &format!(
                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
        None if method == "POST" => req += "Content-Length: 0\r\n\r\n",
        None => req += "\r\n",
    }
    // A refused large body may close the connection before all of it is written.
    let _ = c.write_all(req.as_bytes()).await;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut raw))
        .await
        .expect("the dashboard did not answer")
        .ok();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Answer {
        status,
        raw_head: head.to_string(),
        head: head.to_lowercase(),
        body: body.to_string(),
    }
}

pub(crate) async fn get(addr: SocketAddr, path: &str, cookie: Option<&str>) -> Answer {
    send(addr, "GET", path, cookie, None, &[]).await
}

pub(crate) async fn post(addr: SocketAddr, path: &str, cookie: Option<&str>, form: &str) -> Answer {
    send(addr, "POST", path, cookie, Some(form), &[]).await
}

/// The `name=value` of the `Set-Cookie` header for cookie `name`, and the whole header
/// (lower-cased).
pub(crate) fn set_cookie(a: &Answer, name: &str) -> Option<(String, String)> {
    a.head
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| {
            (
                v.split(';').next().unwrap().trim().to_string(),
                v.to_string(),
            )
        })
}

/// Posts the login form with a pasted `token`.
pub(crate) async fn post_token(addr: SocketAddr, token: &str) -> Answer {
    post(
        addr,
        "/ui/login",
        None,
        &format!("token={}", url_encode(token)),
    )
    .await
}

/// Logs in with a pasted `token`: the `Cookie` header value of the session, whose cookie is
/// HTTP-only, secure, strict and does not hold the token.
pub(crate) async fn login(addr: SocketAddr, token: &str) -> String {
    let a = post_token(addr, token).await;
    assert_eq!(a.status, 303, "{} {}", a.head, a.body);
    assert_eq!(a.location(), Some("/ui"));
    let (id, set) = set_cookie(&a, "jmp_ui").expect("a session cookie");
    for part in ["httponly", "secure", "samesite=strict", "path=/ui"] {
        assert!(set.contains(part), "{set}");
    }
    assert!(
        !set.contains(&token.to_lowercase()),
        "the cookie holds the token: {set}"
    );
    id
}

/// The CSRF token a page of `cookie`'s session carries.
pub(crate) async fn csrf(addr: SocketAddr, cookie: &str) -> String {
    let page = get(addr, "/ui", Some(cookie)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    page.body
        .split("data-csrf=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("the page carries the CSRF token")
        .to_string()
}
