//! `cargo xtask dashboard-e2e [--update-docs] [--no-build]`: the controller's web dashboard in a real
//! headless browser (Debian's `chromium`, driven over the DevTools protocol by
//! [`crate::cdp`]), against a lab on loopback: a controller with its dashboard on port 0, an
//! exporter with mock power run by `jmp run`, and a client created with `jmp admin`.
//!
//! The scenario, each wait a bounded poll:
//! 1. a visit without a login ends on `/ui/login`; the event stream answers 401;
//! 2. the admin logs in through the form (the admin token pasted);
//! 3. the exporter is created and started: its row appears and turns `online` on the open
//!    fleet page without a reload (a marker set on `window` before survives);
//! 4. `jmp shell -l ... -- sh -c 'while j power on; ...'` leases it: its row turns `leased` naming the client,
//!    and the lease appears on the open leases page, both without a reload;
//! 5. the client logs in in a second browser context: the pages are readable, they carry
//!    no action button, and a POST of the end action answers 403;
//! 6. the admin ends the lease from the page (its button, then the in-page dialog's
//!    confirm): the lease leaves the page and `jmp get leases`, `jmp shell` ends (its
//!    command's calls fail), and the row is `online` again.
//!
//! Screenshots of each page (and the fleet at a phone's width) go to the CI artifacts
//! directory, `$CARGO_TARGET_DIR/ci-artifacts/dashboard/`; `--update-docs` copies them into
//! `docs/images/dashboard/` too; `--no-build` takes the debug binaries as they are. `cargo
//! xtask ci` runs it.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    cdp::{Browser, Page},
    procs::{Background, run as run_cmd, wait_path},
    quickstart::fill_export,
};

/// How long the pages may take to show a change of the lab.
const PAGE_WAIT: Duration = Duration::from_secs(30);
/// The exporter, its namespace/name on the pages, and its label.
const EXPORTER: &str = "dash-board";
const EXPORTER_KEY: &str = "default/dash-board";
const LABEL: &str = "board=dashboard";
/// The client.
const CLIENT: &str = "dash-user";
/// What `jmp shell` runs: calls on the exporter until one fails (the lease ended), then
/// exits with 3. `jmp shell` exits with 75 (the lease ended under the command) whether it
/// saw the end first or learnt it when releasing the lease after the command.
const HOLD: &str = "while j power on >/dev/null 2>&1; do sleep 0.5; done; exit 3";
/// The desktop viewport of the screenshots (modest, so the committed PNGs stay small) and
/// a phone's.
const DESKTOP: (u32, u32) = (1100, 700);
const PHONE: (u32, u32) = (390, 780);

/// The screenshots `--update-docs` copies into `docs/images/dashboard/`.
const DOC_IMAGES: &[&str] = &[
    "login.png",
    "fleet.png",
    "leases.png",
    "exporter.png",
    "pools.png",
    "confirm-end-lease.png",
    "client-fleet.png",
    "fleet-phone.png",
];

/// Where the screenshots go: the CI artifacts directory of the dashboard.
pub fn artifacts_dir() -> PathBuf {
    crate::target_dir().join("ci-artifacts").join("dashboard")
}

/// Runs the scenario with the workspace's debug build.
pub fn run(args: &[String]) -> Result<()> {
    let (mut update_docs, mut build) = (false, true);
    for a in args {
        match a.as_str() {
            "--update-docs" => update_docs = true,
            "--no-build" => build = false,
            other => bail!(
                "cargo xtask dashboard-e2e: unknown option {other:?} (--update-docs, --no-build)"
            ),
        }
    }
    let chromium = crate::cdp::ensure_chromium()?;
    let bin = if build {
        crate::debug_build()?
    } else {
        crate::target_dir().join("debug")
    };
    let shots = artifacts_dir();
    if shots.exists() {
        std::fs::remove_dir_all(&shots)
            .with_context(|| format!("cannot clear {}", shots.display()))?;
    }
    let started = Instant::now();
    run_with(
        &bin,
        &chromium,
        &crate::target_dir().join("dashboard-e2e"),
        &shots,
    )?;
    println!(
        "dashboard-e2e: passed in {:.1} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        shots.display()
    );
    if update_docs {
        let docs = crate::workspace_root().join("docs/images/dashboard");
        std::fs::create_dir_all(&docs)?;
        for name in DOC_IMAGES {
            std::fs::copy(shots.join(name), docs.join(name))
                .with_context(|| format!("cannot copy {name} into {}", docs.display()))?;
        }
        println!(
            "copied {} screenshots into {}",
            DOC_IMAGES.len(),
            docs.display()
        );
    }
    Ok(())
}

/// A child process killed (and reaped) when dropped, whose exit can be polled.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lab of the scenario: its home, its binaries and the commands to run them.
pub struct Lab {
    bin: PathBuf,
    home: PathBuf,
}

impl Lab {
    /// A lab in `home` (cleared) with the binaries of `bin`.
    pub fn new(bin: &Path, home: &Path) -> Result<Self> {
        if home.exists() {
            std::fs::remove_dir_all(home)
                .with_context(|| format!("cannot clear {}", home.display()))?;
        }
        std::fs::create_dir_all(home)?;
        Ok(Self {
            bin: bin.to_path_buf(),
            home: home.to_path_buf(),
        })
    }

    /// A command for `program` of the lab's binaries, with the lab's config homes.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.env("JMP_CLIENT_CONFIG_HOME", self.home.join("config"))
            .env("JMP_ADMIN_CONFIG", self.admin_config())
            .env_remove("JMP_NAME")
            .env_remove("JMP_LEASE")
            .env_remove("JUMPSTARTER_HOST");
        cmd
    }

    /// The admin config the controller writes.
    pub fn admin_config(&self) -> PathBuf {
        self.home.join("config").join("admin.yaml")
    }

    /// A path in the lab's home.
    pub fn path(&self, name: &str) -> PathBuf {
        self.home.join(name)
    }

    /// Runs `jmp ARGS` to its end (60 s at most); fails on a non-zero exit; returns stdout.
    pub fn jmp(&self, args: &[&str]) -> Result<String> {
        let mut cmd = self.command("jmp");
        cmd.args(args);
        let out = run_cmd(cmd, Duration::from_secs(60))?;
        if out.code != 0 {
            bail!(
                "jmp {} failed: {}{}",
                args.join(" "),
                out.stdout,
                out.stderr
            );
        }
        Ok(out.stdout)
    }

    /// Starts the controller (embedded store, in-process router, everything on port 0,
    /// `extra` arguments after) and waits for its admin config and its dashboard; returns it
    /// with the dashboard's base URL (`http://127.0.0.1:PORT`).
    pub fn start_controller(&self, extra: &[&str]) -> Result<(Background, String)> {
        let data = self.path("data").to_string_lossy().into_owned();
        let admin = self.admin_config().to_string_lossy().into_owned();
        let mut cmd = self.command("jumpstarter-controller");
        cmd.args([
            "--data-dir",
            &data,
            "--listen",
            "127.0.0.1:0",
            "--router-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "off",
            "--ui-listen",
            "127.0.0.1:0",
            "--admin-config",
            &admin,
        ])
        .args(extra);
        let mut controller = Background::start("jumpstarter-controller", cmd)?;
        let line = controller.wait_for_line("dashboard listening on", Duration::from_secs(60))?;
        let base = dashboard_base(&line)
            .with_context(|| format!("no dashboard address in the controller's {line:?}"))?;
        wait_path(&self.admin_config(), Duration::from_secs(60))
            .context("the controller did not write its admin config")?;
        Ok((controller, base))
    }

    /// The admin token (`jsadmin_...`) of the admin config the controller wrote.
    pub fn admin_token(&self) -> Result<String> {
        let path = self.admin_config();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        find_token(&text, true).with_context(|| format!("no jsadmin_ token in {}", path.display()))
    }
}

/// `http://ADDR` from the controller's `dashboard listening on http://ADDR/ui` line.
fn dashboard_base(line: &str) -> Option<String> {
    let rest = line.split("dashboard listening on http://").nth(1)?;
    let addr = rest.split("/ui").next()?.trim();
    (!addr.is_empty() && !addr.contains(char::is_whitespace)).then(|| format!("http://{addr}"))
}

/// The token of a config's text: the admin's `jsadmin_...` word when `admin`, else the
/// client's JWT (a word of three dot-separated parts starting `eyJ`, wherever YAML folded it).
fn find_token(text: &str, admin: bool) -> Option<String> {
    let prefix = if admin { "jsadmin_" } else { "eyJ" };
    text.split(|c: char| c.is_whitespace() || "\"',:".contains(c))
        .find(|w| {
            w.len() > prefix.len() && w.starts_with(prefix) && (admin || w.split('.').count() == 3)
        })
        .map(str::to_string)
}

/// A JavaScript string literal of `s`.
fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Logs in on `page` through the form with `token`; checks the page lands on `/ui` with
/// `role` on its body. Takes the login page's screenshot into `shot` when given.
pub(crate) fn log_in(
    b: &mut Browser,
    page: &Page,
    base: &str,
    token: &str,
    role: &str,
    shot: Option<&Path>,
) -> Result<()> {
    page.navigate(b, &format!("{base}/ui/login"))?;
    page.wait_for(
        b,
        "document.querySelector('textarea#token') && document.querySelector('#login-submit')",
        PAGE_WAIT,
        "the login form (textarea#token, #login-submit)",
    )?;
    if let Some(path) = shot {
        page.screenshot(b, path, false)?;
    }
    page.type_into(b, "textarea#token", token)?;
    page.eval(b, "window.__jmpLeaving = true")?;
    page.click(b, "#login-submit")?;
    page.wait_loaded(b, "the page after logging in")?;
    page.wait_for(
        b,
        &format!(
            "location.pathname === '/ui' && document.body.dataset.role === {}",
            js(role)
        ),
        PAGE_WAIT,
        &format!("logged in as {role} on /ui"),
    )?;
    Ok(())
}

/// Sets a marker on the page's `window`; [`check_no_reload`] finds it still there when the
/// page was not reloaded.
fn mark(b: &mut Browser, page: &Page) -> Result<()> {
    page.eval(b, "window.__jmpNoReload = 'kept'").map(|_| ())
}

/// Waits until the page's event stream is connected (`#live.on`), so that no change of the
/// lab falls before the page listens.
fn wait_live(b: &mut Browser, page: &Page) -> Result<()> {
    page.wait_for(
        b,
        "document.querySelector('#live.on')",
        PAGE_WAIT,
        "the page's live updates connected (#live.on)",
    )
    .map(|_| ())
}

fn check_no_reload(b: &mut Browser, page: &Page, what: &str) -> Result<()> {
    let v = page.eval(b, "window.__jmpNoReload")?;
    ensure!(
        v == Value::String("kept".into()),
        "{what}: the page was reloaded (its window marker is gone)"
    );
    Ok(())
}

/// The selector of the exporter's row in status `status`.
fn row(status: &str) -> String {
    format!(
        "#fleet tr[data-exporter={}][data-status={}]",
        js(EXPORTER_KEY),
        js(status)
    )
}

/// `document.querySelector(SELECTOR)` as a JavaScript expression.
fn query(selector: &str) -> String {
    format!("document.querySelector({})", js(selector))
}

/// The scenario against binaries of `bin`, the lab in `home`, screenshots into `shots`.
pub fn run_with(bin: &Path, chromium: &Path, home: &Path, shots: &Path) -> Result<()> {
    let lab = Lab::new(bin, home)?;
    let (controller, base) = lab.start_controller(&[])?;
    println!("dashboard on {base}/ui");
    let admin_token = lab.admin_token()?;
    let client_config = lab.path("client.yaml");
    let client_str = client_config.to_string_lossy().into_owned();
    lab.jmp(&[
        "admin",
        "create",
        "client",
        CLIENT,
        "--unsafe",
        "--out",
        &client_str,
    ])?;
    let client_token = std::fs::read_to_string(&client_config)
        .ok()
        .and_then(|t| find_token(&t, false))
        .with_context(|| format!("no token in {client_str}"))?;

    let mut b = Browser::launch(chromium)?;
    let result = scenario(&mut b, &lab, &base, &admin_token, &client_token, shots);
    if result.is_err() {
        let said: Vec<String> = controller.lines.try_iter().collect();
        let tail = said.len().saturating_sub(40);
        eprintln!("the controller's last lines:\n{}", said[tail..].join("\n"));
    }
    result
}

fn scenario(
    b: &mut Browser,
    lab: &Lab,
    base: &str,
    admin_token: &str,
    client_token: &str,
    shots: &Path,
) -> Result<()> {
    let (w, h) = DESKTOP;
    let t0 = Instant::now();
    // Each step that passed, with the seconds since the scenario started.
    macro_rules! ok {
        ($($arg:tt)*) => {
            println!("[{:5.1} s] ok: {}", t0.elapsed().as_secs_f64(), format!($($arg)*))
        };
    }
    // 1. No login: the pages send the browser to the login form, the event stream answers
    // 401.
    let anon_ctx = b.new_context()?;
    let anon = b.new_page(Some(&anon_ctx), w, h)?;
    anon.navigate(b, &format!("{base}/ui/leases"))?;
    anon.wait_for(
        b,
        "location.pathname === '/ui/login'",
        PAGE_WAIT,
        "a visit without a login goes to /ui/login",
    )?;
    let status = anon.eval(b, "fetch('/ui/events').then(r => r.status)")?;
    ensure!(
        status == 401,
        "the event stream without a login answered {status}, not 401"
    );
    ok!("without a login /ui/leases goes to /ui/login and /ui/events answers 401");

    // 2. The admin logs in.
    let admin_ctx = b.new_context()?;
    let fleet = b.new_page(Some(&admin_ctx), w, h)?;
    log_in(
        b,
        &fleet,
        base,
        admin_token,
        "admin",
        Some(&shots.join("login.png")),
    )?;
    ok!("the admin logged in through the form");
    wait_live(b, &fleet)?;
    mark(b, &fleet)?;

    // 3. The exporter is created and started; the open page shows it online.
    let exporter_config = lab.path("exporter.yaml");
    let exporter_str = exporter_config.to_string_lossy().into_owned();
    lab.jmp(&[
        "admin",
        "create",
        "exporter",
        EXPORTER,
        "--label",
        LABEL,
        "--out",
        &exporter_str,
    ])?;
    fill_export(
        &exporter_config,
        "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
    )?;
    let mut run = lab.command("jmp");
    run.args(["run", "--exporter-config", &exporter_str]);
    let exporter = Background::start("jmp run", run)?;
    if let Err(e) = fleet.wait_for(
        b,
        &query(&row("online")),
        PAGE_WAIT,
        "the exporter's row online",
    ) {
        let said: Vec<String> = exporter.lines.try_iter().collect();
        return Err(e.context(format!("jmp run printed:\n{}", said.join("\n"))));
    }
    check_no_reload(b, &fleet, "the exporter going online")?;
    ok!("the exporter's row turned online without a reload");

    let leases = b.new_page(Some(&admin_ctx), w, h)?;
    leases.navigate(b, &format!("{base}/ui/leases"))?;
    leases.wait_for(b, &query("table#leases"), PAGE_WAIT, "the leases table")?;
    ensure!(
        leases.eval(b, &query("#leases tr[data-lease]"))?.is_null(),
        "a lease is listed before any was taken"
    );
    wait_live(b, &leases)?;
    mark(b, &leases)?;

    // 4. `jmp shell` leases it and holds the lease.
    let client_config = lab.path("client.yaml");
    let mut shell_cmd = lab.command("jmp");
    let shell_log = lab.path("shell.log");
    shell_cmd
        .arg("shell")
        .arg("--client-config")
        .arg(&client_config)
        .args(["-l", LABEL, "--", "sh", "-c", HOLD])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&shell_log)?);
    let mut shell = Killed(shell_cmd.spawn().context("starting jmp shell")?);
    fleet.wait_for(
        b,
        &query(&row("leased")),
        PAGE_WAIT,
        "the exporter's row leased",
    )?;
    let holder = fleet.wait_for(
        b,
        &format!(
            "(() => {{ const td = document.querySelector({}); \
             return td && td.textContent.includes({}) ? td.textContent.trim() : null; }})()",
            js(&format!("{} td.holder", row("leased"))),
            js(CLIENT)
        ),
        PAGE_WAIT,
        "the row's holder naming the client",
    )?;
    check_no_reload(b, &fleet, "the exporter being leased")?;
    ok!("the row turned leased (holder {holder}) without a reload");
    let lease_key = leases.wait_for(
        b,
        "(() => { const r = document.querySelector('#leases tr[data-lease]'); \
         return r ? r.dataset.lease : null; })()",
        PAGE_WAIT,
        "the lease on /ui/leases",
    )?;
    let lease_key = lease_key.as_str().unwrap_or_default().to_string();
    let lease_name = lease_key
        .split_once('/')
        .map(|(_, n)| n.to_string())
        .with_context(|| format!("data-lease {lease_key:?} is not NAMESPACE/NAME"))?;
    check_no_reload(b, &leases, "the lease appearing")?;
    let listed = leases_listed(lab)?;
    ensure!(
        listed.contains(&lease_name),
        "jmp get leases does not list {lease_name}: {listed}"
    );
    ok!("lease {lease_key} appeared on /ui/leases without a reload");

    fleet.screenshot(b, &shots.join("fleet.png"), false)?;
    leases.screenshot(b, &shots.join("leases.png"), false)?;
    let detail = b.new_page(Some(&admin_ctx), w, h)?;
    detail.navigate(b, &format!("{base}/ui/exporters/default/{EXPORTER}"))?;
    detail.wait_for(
        b,
        &format!("document.body.innerText.includes({})", js(EXPORTER)),
        PAGE_WAIT,
        "the exporter's page naming it",
    )?;
    detail.screenshot(b, &shots.join("exporter.png"), false)?;
    detail.navigate(b, &format!("{base}/ui/pools"))?;
    detail.wait_for(
        b,
        "document.body.dataset.role === 'admin'",
        PAGE_WAIT,
        "the pools page",
    )?;
    detail.screenshot(b, &shots.join("pools.png"), false)?;
    ok!("screenshots of the fleet, the leases, the exporter and the pools");
    // Through the pages as a person clicks, more times than a browser opens connections to
    // one server (six): each page left must close its event stream, or the back/forward
    // cache keeps it open and a navigation hangs once all are taken.
    for (i, path) in ["/ui", "/ui/leases", "/ui/pools"]
        .iter()
        .cycle()
        .take(9)
        .enumerate()
    {
        detail.navigate(b, &format!("{base}{path}"))?;
        wait_live(b, &detail).with_context(|| format!("page {} of 9 ({path})", i + 1))?;
    }
    ok!("nine pages one after the other, each of them live");

    // 5. The client: the pages are readable, without action buttons; the action refused.
    let client_ctx = b.new_context()?;
    let client = b.new_page(Some(&client_ctx), w, h)?;
    log_in(b, &client, base, client_token, "client", None)?;
    ok!("the client logged in through the form");
    client.wait_for(
        b,
        &query(&row("leased")),
        PAGE_WAIT,
        "the client's fleet page showing the row",
    )?;
    ensure!(
        client.eval(b, &query("[data-action]"))?.is_null(),
        "the client's fleet page shows an action button"
    );
    client.screenshot(b, &shots.join("client-fleet.png"), false)?;
    client.navigate(b, &format!("{base}/ui/leases"))?;
    client.wait_for(
        b,
        &query(&format!("#leases tr[data-lease={}]", js(&lease_key))),
        PAGE_WAIT,
        "the client's leases page showing the lease",
    )?;
    ensure!(
        client.eval(b, &query("[data-action]"))?.is_null(),
        "the client's leases page shows an action button"
    );
    let refused = client.eval(
        b,
        &format!(
            "(() => {{ const csrf = document.body.dataset.csrf || ''; \
             return fetch({}, {{method: 'POST', redirect: 'manual', \
             body: new URLSearchParams({{csrf}})}}) \
             .then(async r => [r.status, await r.text(), csrf !== '']); }})()",
            js(&format!("/ui/leases/{lease_key}/end"))
        ),
    )?;
    let status = refused[0].as_u64().unwrap_or_default();
    let body = refused[1].as_str().unwrap_or_default();
    ensure!(
        status == 403,
        "the client's POST of the end action answered {status}, not 403: {body}"
    );
    ensure!(
        refused[2] == Value::Bool(true),
        "a client's page carries no CSRF token (body data-csrf), so its 403 may be the CSRF \
         check's rather than the role's"
    );
    ok!(
        "the client reads both pages without action buttons; its POST of end-lease with its \
         session's CSRF token answered 403: {}",
        body.chars().take(200).collect::<String>().trim()
    );
    // The lease is still there.
    leases_listed(lab).and_then(|l| {
        ensure!(
            l.contains(&lease_name),
            "the client's refused POST ended the lease"
        );
        Ok(())
    })?;

    // 6. The admin ends the lease from the page.
    let button = format!(
        "button[data-action=\"end-lease\"][data-lease={}]",
        js(&lease_key)
    );
    leases.click(b, &button)?;
    leases.wait_for(
        b,
        "(() => { const d = document.querySelector('dialog#confirm'); return d && d.open; })()",
        PAGE_WAIT,
        "the confirm dialog open",
    )?;
    leases.screenshot(b, &shots.join("confirm-end-lease.png"), false)?;
    leases.click(b, "#confirm-yes")?;
    leases.wait_for(
        b,
        &format!(
            "document.readyState === 'complete' && document.querySelector('table#leases') \
             && !{}",
            query(&format!("#leases tr[data-lease={}]", js(&lease_key)))
        ),
        PAGE_WAIT,
        "the ended lease gone from /ui/leases",
    )?;
    ok!("the admin ended {lease_key} from the page");
    let deadline = Instant::now() + PAGE_WAIT;
    let status = loop {
        if let Some(status) = shell.0.try_wait()? {
            break status;
        }
        ensure!(
            Instant::now() < deadline,
            "jmp shell still runs {PAGE_WAIT:?} after its lease was ended"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let said = std::fs::read_to_string(&shell_log).unwrap_or_default();
    ensure!(
        status.code() == Some(75),
        "jmp shell ended with {status}, not 75 (its lease ended under the command); it \
         printed:\n{said}"
    );
    ensure!(
        !said.contains("could not release"),
        "jmp shell warned about releasing a lease an admin had ended:\n{said}"
    );
    ok!("jmp shell ended ({status}): its lease ended under its command");
    let listed = leases_listed(lab)?;
    ensure!(
        !listed.contains(&lease_name),
        "jmp get leases still lists {lease_name}: {listed}"
    );
    fleet.wait_for(
        b,
        &query(&row("online")),
        PAGE_WAIT,
        "the exporter's row online again",
    )?;
    check_no_reload(b, &fleet, "the lease ending")?;
    ok!("the lease is gone from jmp get leases, and the row is online again without a reload");

    // The fleet at a phone's width.
    let (pw, ph) = PHONE;
    fleet.set_viewport(b, pw, ph, true)?;
    fleet.navigate(b, &format!("{base}/ui"))?;
    fleet.wait_for(
        b,
        &query(&row("online")),
        PAGE_WAIT,
        "the fleet page at a phone's width",
    )?;
    fleet.screenshot(b, &shots.join("fleet-phone.png"), false)?;
    Ok(())
}

fn client_str(lab: &Lab) -> String {
    lab.path("client.yaml").to_string_lossy().into_owned()
}

/// `jmp get leases -o name` as the lab's client.
fn leases_listed(lab: &Lab) -> Result<String> {
    lab.jmp(&[
        "get",
        "leases",
        "--client-config",
        &client_str(lab),
        "-o",
        "name",
    ])
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead, BufReader, Write},
        net::TcpListener,
    };

    use super::*;

    #[test]
    fn the_dashboard_address_comes_from_the_log_line() {
        assert_eq!(
            dashboard_base(
                "2026-12-07T10:00:00Z INFO dashboard listening on http://127.0.0.1:40111/ui"
            ),
            Some("http://127.0.0.1:40111".into())
        );
        assert_eq!(
            dashboard_base("dashboard listening on http://[::1]:8086/ui (admin and clients)"),
            Some("http://[::1]:8086".into())
        );
        assert_eq!(dashboard_base("dashboard listening on http:///ui"), None);
        assert_eq!(dashboard_base("router listening on 127.0.0.1:1"), None);
    }

    #[test]
    fn tokens_are_found_in_configs() {
        let admin = "apiVersion: v1\nendpoint: 127.0.0.1:1\ntoken: \"jsadmin_abc.def\"\n";
        assert_eq!(find_token(admin, true).as_deref(), Some("jsadmin_abc.def"));
        assert_eq!(find_token("token: jsadmin_\n", true), None);
        let client =
            "kind: ClientConfig\ntls:\n  ca: >-\n    LS0tLS1C\ntoken: >-\n  eyJh.eyJ.sig\n";
        assert_eq!(find_token(client, false).as_deref(), Some("eyJh.eyJ.sig"));
        assert_eq!(
            find_token("token: 'eyJ.x.y'\n", false).as_deref(),
            Some("eyJ.x.y")
        );
        assert_eq!(find_token("token: \"\"\n", false), None);
        assert_eq!(find_token("token: eyJonly.two\n", false), None);
    }

    /// A stand-in page with the contract's login form, a row, an action button and its
    /// in-page dialog, served on loopback: the DevTools client types, clicks, waits and takes
    /// a screenshot as the scenario does. Needs `chromium` (CI installs it: under `CI=true`
    /// its absence fails the test).
    #[test]
    fn the_devtools_client_drives_a_page_like_a_user() {
        let Some(chromium) = chromium_for_tests() else {
            return;
        };
        let page_html = r#"<!doctype html><html><body data-role="admin">
<textarea id="token" name="token"></textarea><button id="login-submit"
 onclick="document.body.dataset.token = document.getElementById('token').value">log in</button>
<table id="leases"><tr data-lease="default/l1"><td>l1</td>
<td><button data-action="end-lease" data-lease="default/l1"
 onclick="document.getElementById('confirm').showModal()">end</button></td></tr></table>
<dialog id="confirm"><button id="confirm-yes"
 onclick="document.querySelector('tr[data-lease]').remove(); this.closest('dialog').close()">yes</button></dialog>
</body></html>"#;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{page_html}",
                    page_html.len()
                );
            }
        });
        let mut b = Browser::launch(&chromium).unwrap();
        let ctx = b.new_context().unwrap();
        let page = b.new_page(Some(&ctx), 800, 600).unwrap();
        page.navigate(&mut b, &format!("http://127.0.0.1:{port}/ui"))
            .unwrap();
        page.type_into(&mut b, "textarea#token", "jsadmin_x")
            .unwrap();
        page.click(&mut b, "#login-submit").unwrap();
        page.wait_for(
            &mut b,
            "document.body.dataset.token === 'jsadmin_x'",
            PAGE_WAIT,
            "typed",
        )
        .unwrap();
        mark(&mut b, &page).unwrap();
        page.click(&mut b, "button[data-action=\"end-lease\"]")
            .unwrap();
        page.wait_for(
            &mut b,
            "document.getElementById('confirm').open",
            PAGE_WAIT,
            "dialog",
        )
        .unwrap();
        page.click(&mut b, "#confirm-yes").unwrap();
        page.wait_for(
            &mut b,
            "!document.querySelector('tr[data-lease]')",
            PAGE_WAIT,
            "gone",
        )
        .unwrap();
        check_no_reload(&mut b, &page, "the click").unwrap();
        // A reload loses the marker, and a missing element fails a click and a bounded wait.
        page.navigate(&mut b, &format!("http://127.0.0.1:{port}/ui"))
            .unwrap();
        assert!(check_no_reload(&mut b, &page, "x").is_err());
        assert!(page.click(&mut b, "#nothing").is_err());
        let e = page
            .wait_for(
                &mut b,
                "document.querySelector('#nothing')",
                Duration::from_millis(300),
                "never",
            )
            .unwrap_err();
        assert!(format!("{e:#}").contains("never"), "{e:#}");
        let dir = crate::interop::tempfile_dir::Dir::new("jmp-cdp-test").unwrap();
        let shot = dir.path().join("page.png");
        page.screenshot(&mut b, &shot, false).unwrap();
        let png = std::fs::read(&shot).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000,
            "{}",
            png.len()
        );
    }

    /// `chromium` for the tests above: `None` (the test passes without running) when it is
    /// missing, except under `CI=true`, where its absence fails.
    fn chromium_for_tests() -> Option<PathBuf> {
        match std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("chromium"))
                .find(|p| p.is_file())
        }) {
            Some(p) => Some(p),
            None if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("chromium is not installed (cargo xtask ci-prepare installs it)")
            }
            None => {
                eprintln!("skipped: no chromium on PATH");
                None
            }
        }
    }
}
