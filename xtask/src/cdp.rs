//! A small, synchronous client of the Chrome DevTools protocol: enough to drive Debian's
//! headless `chromium` in the dashboard's end-to-end tests and benchmark (open pages in
//! isolated browser contexts, navigate, evaluate JavaScript, click and type as a user does,
//! take screenshots).
//!
//! One WebSocket (tungstenite, already in the workspace's tree for the WebSocket network)
//! to the browser, with every page attached to it as a flat session. Every read has a
//! deadline; events that arrive while a command waits for its answer are kept in a bounded
//! queue.

use std::{
    collections::VecDeque,
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::procs::Background;

/// How long one DevTools command may take to be answered.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Events kept while waiting for answers (the oldest are dropped beyond this).
const MAX_EVENTS: usize = 1000;

/// The Debian package and the command it installs.
const PACKAGE: &str = "chromium";

/// The `chromium` on `PATH`, installed with `apt-get` when missing (cached by apt:
/// a second run finds it and does nothing).
pub fn ensure_chromium() -> Result<PathBuf> {
    if let Some(p) = find_on_path(PACKAGE) {
        return Ok(p);
    }
    crate::workspace::apt_install(
        &[PACKAGE],
        false,
        "the dashboard's browser tests drive a headless chromium",
    )?;
    find_on_path(PACKAGE).context("apt-get installed chromium but no `chromium` is on PATH")
}

fn find_on_path(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(cmd))
            .find(|p| p.is_file())
    })
}

/// A headless chromium and the WebSocket to its DevTools endpoint; the browser is stopped
/// (and its profile directory removed) when dropped.
pub struct Browser {
    ws: tungstenite::WebSocket<TcpStream>,
    next_id: u64,
    events: VecDeque<Value>,
    // Dropped after the WebSocket: the process, then its profile.
    _process: Background,
    _profile: crate::interop::tempfile_dir::Dir,
}

impl Browser {
    /// Starts `chromium --headless=new` with a fresh profile and DevTools on a port it
    /// chooses (read back from the profile's `DevToolsActivePort`), and connects to it.
    pub fn launch(chromium: &Path) -> Result<Self> {
        let profile = crate::interop::tempfile_dir::Dir::new("jmp-chromium")?;
        let mut cmd = Command::new(chromium);
        cmd.arg("--headless=new")
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args([
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-gpu",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--metrics-recording-only",
                "--password-store=basic",
                "--use-mock-keychain",
                "--hide-scrollbars",
                "--mute-audio",
                "--font-render-hinting=none",
                "about:blank",
            ]);
        // Root in a container has no user namespace for chromium's sandbox.
        if is_root() {
            cmd.arg("--no-sandbox");
        }
        let process = Background::start("chromium", cmd)?;
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(60);
        let (port, path) = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Some(found) = parse_active_port(&text)
            {
                break found;
            }
            if Instant::now() > deadline {
                let said: Vec<String> = process.lines.try_iter().collect();
                bail!(
                    "chromium wrote no {} within 60 s; it printed:\n{}",
                    port_file.display(),
                    said.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stream = TcpStream::connect(("127.0.0.1", port))
            .with_context(|| format!("cannot connect to chromium's DevTools on port {port}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        let url = format!("ws://127.0.0.1:{port}{path}");
        let (ws, _) = tungstenite::client(url.as_str(), stream)
            .map_err(|e| anyhow::anyhow!("DevTools WebSocket handshake with {url}: {e}"))?;
        // From now on reads wake up often, so that each call can keep its own deadline.
        ws.get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(Self {
            ws,
            next_id: 1,
            events: VecDeque::new(),
            _process: process,
            _profile: profile,
        })
    }

    /// Sends `method` with `params` (to a page's `session`, or to the browser) and returns
    /// its result; a protocol error is an error naming the method.
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(tungstenite::Message::text(msg.to_string()))
            .with_context(|| format!("cannot send {method} to chromium"))?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let v = self
                .read_message(deadline)
                .with_context(|| format!("waiting for chromium's answer to {method}"))?;
            if v.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(err) = v.get("error") {
                    bail!("chromium refused {method}: {err}");
                }
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
            if v.get("method").is_some() {
                if self.events.len() >= MAX_EVENTS {
                    self.events.pop_front();
                }
                self.events.push_back(v);
            }
        }
    }

    /// Reads the next JSON message, by `deadline`.
    fn read_message(&mut self, deadline: Instant) -> Result<Value> {
        loop {
            match self.ws.read() {
                Ok(tungstenite::Message::Text(t)) => {
                    return serde_json::from_str(t.as_str())
                        .with_context(|| format!("chromium sent bad JSON: {t}"));
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => bail!("the DevTools connection failed: {e}"),
            }
            if Instant::now() > deadline {
                bail!("no message from chromium within {CALL_TIMEOUT:?}");
            }
        }
    }

    /// A new isolated browser context (its own cookies, as a second browser profile).
    pub fn new_context(&mut self) -> Result<String> {
        let r = self.call(None, "Target.createBrowserContext", json!({}))?;
        r["browserContextId"]
            .as_str()
            .map(str::to_string)
            .context("Target.createBrowserContext answered no browserContextId")
    }

    /// A new page (tab) of `width` x `height` CSS pixels in `context` (the default context
    /// when `None`), at about:blank.
    pub fn new_page(&mut self, context: Option<&str>, width: u32, height: u32) -> Result<Page> {
        let mut params = json!({"url": "about:blank"});
        if let Some(c) = context {
            params["browserContextId"] = json!(c);
        }
        let r = self.call(None, "Target.createTarget", params)?;
        let target = r["targetId"]
            .as_str()
            .context("Target.createTarget answered no targetId")?
            .to_string();
        let r = self.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        )?;
        let session = r["sessionId"]
            .as_str()
            .context("Target.attachToTarget answered no sessionId")?
            .to_string();
        let page = Page { session };
        self.call(Some(&page.session), "Page.enable", json!({}))?;
        self.call(Some(&page.session), "Runtime.enable", json!({}))?;
        page.set_viewport(self, width, height, false)?;
        Ok(page)
    }
}

impl Drop for Browser {
    /// Asks the browser to close (it then ends its renderers itself); the process is
    /// stopped anyway right after.
    fn drop(&mut self) {
        let close = json!({"id": 0, "method": "Browser.close"}).to_string();
        let _ = self.ws.send(tungstenite::Message::text(close));
    }
}

/// `(port, browser path)` from a `DevToolsActivePort` file's two lines.
fn parse_active_port(text: &str) -> Option<(u16, String)> {
    let mut lines = text.lines();
    let port = lines.next()?.trim().parse().ok()?;
    let path = lines.next()?.trim();
    path.starts_with("/devtools/browser/")
        .then(|| (port, path.to_string()))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// One page (tab) of a [`Browser`], by its DevTools session.
pub struct Page {
    session: String,
}

impl Page {
    fn call(&self, b: &mut Browser, method: &str, params: Value) -> Result<Value> {
        b.call(Some(&self.session), method, params)
    }

    /// The viewport: `width` x `height` CSS pixels, as a phone when `mobile`.
    pub fn set_viewport(
        &self,
        b: &mut Browser,
        width: u32,
        height: u32,
        mobile: bool,
    ) -> Result<()> {
        self.call(
            b,
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        )?;
        Ok(())
    }

    /// Evaluates `expression` in the page (promises awaited) and returns its value; a
    /// JavaScript exception is an error carrying its text.
    pub fn eval(&self, b: &mut Browser, expression: &str) -> Result<Value> {
        let r = self.call(
            b,
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            let text = ex["exception"]["description"]
                .as_str()
                .or(ex["text"].as_str())
                .unwrap_or("?");
            bail!("the page threw evaluating {expression:?}: {text}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Polls `expression` every 100 ms until it is truthy (returning its value), for at most
    /// `timeout`; `what` names the wait in the error, with the page's URL and text.
    pub fn wait_for(
        &self,
        b: &mut Browser,
        expression: &str,
        timeout: Duration,
        what: &str,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut last_err = None;
        loop {
            match self.eval(b, expression) {
                Ok(v) if truthy(&v) => return Ok(v),
                Ok(_) => {}
                // A navigation in progress destroys the context the expression ran in.
                Err(e) => last_err = Some(e),
            }
            if Instant::now() > deadline {
                let url = self
                    .eval(b, "location.href")
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                let text = self
                    .eval(
                        b,
                        "document.body ? document.body.innerText.slice(0, 2000) : ''",
                    )
                    .map(|v| v.as_str().unwrap_or_default().to_string())
                    .unwrap_or_default();
                bail!(
                    "{what}: not so within {timeout:?} ({expression}){}\nat {url}, the page \
                     said:\n{text}",
                    last_err
                        .map(|e| format!("; last error: {e:#}"))
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Loads `url` and waits until the new document has loaded (a marker set on the old
    /// document's `window` is gone and `document.readyState` is `complete`).
    pub fn navigate(&self, b: &mut Browser, url: &str) -> Result<()> {
        let _ = self.eval(b, "window.__jmpLeaving = true");
        let r = self.call(b, "Page.navigate", json!({"url": url}))?;
        if let Some(e) = r.get("errorText").and_then(Value::as_str) {
            bail!("cannot load {url}: {e}");
        }
        self.wait_loaded(b, &format!("loading {url}"))
    }

    /// Waits until a navigation the page started (a form's submit, a redirect) has loaded:
    /// see [`Page::navigate`] (the caller set `window.__jmpLeaving` before).
    pub fn wait_loaded(&self, b: &mut Browser, what: &str) -> Result<()> {
        self.wait_for(
            b,
            "!window.__jmpLeaving && document.readyState === 'complete'",
            Duration::from_secs(30),
            what,
        )
        .map(|_| ())
    }

    /// Clicks the element `selector` as a user does: scrolled into view, then a mouse press
    /// and release at its centre. Fails when there is no such element or it has no size.
    pub fn click(&self, b: &mut Browser, selector: &str) -> Result<()> {
        let sel = serde_json::to_string(selector)?;
        let rect = self.eval(
            b,
            &format!(
                "(() => {{ const e = document.querySelector({sel}); if (!e) return null; \
                 e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
                 return [r.x + r.width / 2, r.y + r.height / 2, r.width * r.height]; }})()"
            ),
        )?;
        let Some([x, y, area]) = rect.as_array().and_then(|a| {
            let n: Vec<f64> = a.iter().filter_map(Value::as_f64).collect();
            <[f64; 3]>::try_from(n).ok()
        }) else {
            bail!("no element {selector} to click");
        };
        if area <= 0.0 {
            bail!("{selector} is not shown (no size), so it cannot be clicked");
        }
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                b,
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            )?;
        }
        Ok(())
    }

    /// Focuses `selector` and types `text` into it (as a paste would).
    pub fn type_into(&self, b: &mut Browser, selector: &str, text: &str) -> Result<()> {
        let sel = serde_json::to_string(selector)?;
        let found = self.eval(
            b,
            &format!(
                "(() => {{ const e = document.querySelector({sel}); if (!e) return false; \
                 e.focus(); return document.activeElement === e; }})()"
            ),
        )?;
        if found != Value::Bool(true) {
            bail!("no element {selector} to type into");
        }
        self.call(b, "Input.insertText", json!({"text": text}))?;
        Ok(())
    }

    /// A PNG of the viewport (or of the whole page when `full_page`), written to `path`.
    pub fn screenshot(&self, b: &mut Browser, path: &Path, full_page: bool) -> Result<()> {
        // A page behind another paints no frame to capture: to the front first.
        self.call(b, "Page.bringToFront", json!({}))?;
        let mut params = json!({"format": "png"});
        if full_page {
            params["captureBeyondViewport"] = json!(true);
            let m = self.call(b, "Page.getLayoutMetrics", json!({}))?;
            let w = m["cssContentSize"]["width"].as_f64().unwrap_or(1024.0);
            // At most 4,000 pixels tall: a long table is cut.
            let h = m["cssContentSize"]["height"]
                .as_f64()
                .unwrap_or(768.0)
                .min(4000.0);
            params["clip"] = json!({"x": 0, "y": 0, "width": w, "height": h, "scale": 1});
        }
        let r = self.call(b, "Page.captureScreenshot", params)?;
        let data = r["data"]
            .as_str()
            .context("Page.captureScreenshot answered no data")?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .context("Page.captureScreenshot answered bad base64")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(path, png).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// JavaScript's truthiness of a returned value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_active_port_file_gives_port_and_path() {
        assert_eq!(
            parse_active_port("40123\n/devtools/browser/ab-cd\n"),
            Some((40123, "/devtools/browser/ab-cd".to_string()))
        );
        // Written but not yet complete, or not ours.
        assert_eq!(parse_active_port("40123\n"), None);
        assert_eq!(parse_active_port("x\n/devtools/browser/a"), None);
        assert_eq!(parse_active_port("1\n/other"), None);
    }

    #[test]
    fn truthiness_is_javascripts() {
        for v in [json!(null), json!(false), json!(0), json!("")] {
            assert!(!truthy(&v), "{v}");
        }
        for v in [json!(true), json!(1), json!("x"), json!([]), json!({})] {
            assert!(truthy(&v), "{v}");
        }
    }
}
