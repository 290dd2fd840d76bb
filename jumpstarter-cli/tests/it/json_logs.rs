//! `--log-format json`: the real `jumpstarter-controller` (with its in-process router) and
//! `jmp run`, one `jmp shell -- j power on`; every line each writes is one JSON object, and
//! the lease's story is there from the controller, the router and the exporter, each line
//! carrying the lease's id.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{JMP, Running, Scratch, text};

/// A process whose stderr lines are collected as they come.
pub(crate) struct Logged {
    _proc: Running,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Logged {
    pub(crate) fn start(mut c: Command) -> Self {
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            _proc: Running(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (up to 60 s) for a line for which `f` holds; every line read is kept.
    pub(crate) fn wait_for(&mut self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        if let Some(l) = self.seen.iter().find(|l| f(l)) {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if f(&l) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "no line {what} within 60 s; seen:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Whether a line so far (those already written included) holds `f`.
    pub(crate) fn seen_any(&mut self, f: impl Fn(&str) -> bool) -> bool {
        self.seen.extend(self.lines.try_iter());
        self.seen.iter().any(|l| f(l))
    }

    /// Every line written so far, as text.
    pub(crate) fn lines_seen(&mut self) -> &[String] {
        self.seen.extend(self.lines.try_iter());
        &self.seen
    }

    /// Every line so far (waits a moment for the ones in flight), each parsed as JSON.
    fn objects(&mut self) -> Vec<Value> {
        std::thread::sleep(Duration::from_millis(300));
        self.seen.extend(self.lines.try_iter());
        self.seen
            .iter()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not one JSON object: {l:?}: {e}"))
            })
            .collect()
    }
}

/// The lines of `objects` about `lease` with `message`.
fn about<'a>(objects: &'a [Value], lease: &str, message: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| o["lease_id"] == lease && o["message"] == message)
        .collect()
}

#[test]
fn one_lease_is_told_in_json_by_the_controller_the_router_and_the_exporter() {
    let s = Scratch::new();
    let bin = crate::doc_examples::controller_dir().join("jumpstarter-controller");
    let admin = s.path("admin.yaml");
    let with_admin = |mut c: Command| {
        c.env("JMP_ADMIN_CONFIG", &admin);
        c
    };
    let mut ctl = Command::new(bin);
    ctl.current_dir(s.dir.path())
        .arg("--data-dir")
        .arg(s.path("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off", "--admin-config"])
        .arg(&admin)
        .env("JMP_LOG_FORMAT", "json")
        .env_remove("RUST_LOG");
    let mut ctl = Logged::start(ctl);
    ctl.wait_for("saying it is ready", |l| {
        l.contains("jumpstarter-controller ready")
    });

    let exporter = s.mock_board_and_client(&admin, "kind=json-logs");

    let mut run = s.cmd(JMP);
    run.args(["run", "--log-format", "json", "--exporter-config"])
        .arg(&exporter)
        .env_remove("RUST_LOG")
        .env_remove("JMP_LOG");
    let mut run = Logged::start(run);
    run.wait_for("saying it registered", |l| {
        l.contains("registered with controller")
    });

    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--client",
            "ci",
            "-l",
            "kind=json-logs",
            "--context",
            "build_id=123",
            "--context",
            "vcs_ref=refs/heads/main",
            "--",
            "j",
            "power",
            "on",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    run.wait_for("saying the lease ended", |l| l.contains("ended"));
    ctl.wait_for("saying the lease ended", |l| l.contains("\"lease ended\""));

    let controller = ctl.objects();
    let exporter = run.objects();
    let created = controller
        .iter()
        .find(|o| o["message"] == "lease created")
        .unwrap_or_else(|| panic!("no lease created line: {controller:#?}"));
    let lease = created["lease_id"].as_str().unwrap().to_string();
    assert_eq!(created["client"], "ci");
    assert_eq!(created["namespace"], "default");
    assert_eq!(created["component"], "controller");
    assert_eq!(created["level"], "INFO");
    assert!(created["timestamp"].as_str().unwrap().ends_with('Z'));

    // The controller's lines carry the lease's context too, each entry a field of its own.
    assert_eq!(created["build_id"], "123", "{created}");
    assert_eq!(created["vcs_ref"], "refs/heads/main", "{created}");
    for message in ["lease granted", "dial", "lease ended"] {
        let lines = about(&controller, &lease, message);
        assert!(
            !lines.is_empty(),
            "no {message:?} of {lease}: {controller:#?}"
        );
        assert_eq!(lines[0]["exporter"], "board", "{message}");
        assert_eq!(lines[0]["client"], "ci", "{message}");
        assert_eq!(lines[0]["build_id"], "123", "{message}: {}", lines[0]);
    }
    let tunnels = about(&controller, &lease, "tunnel open");
    assert!(!tunnels.is_empty(), "no tunnel of {lease}: {controller:#?}");
    assert_eq!(tunnels[0]["component"], "router");
    assert_eq!(tunnels[0]["namespace"], "default");
    // The router's lines carry the context too (from the token the controller signed).
    assert_eq!(tunnels[0]["build_id"], "123", "{}", tunnels[0]);
    assert_eq!(tunnels[0]["vcs_ref"], "refs/heads/main", "{}", tunnels[0]);

    let call = exporter
        .iter()
        .find(|o| o["message"] == "driver call" && o["operation"] == "on")
        .unwrap_or_else(|| panic!("no driver call line: {exporter:#?}"));
    assert_eq!(call["lease_id"], lease.as_str());
    assert_eq!(call["client"], "ci");
    assert_eq!(call["exporter"], "board");
    assert_eq!(call["component"], "exporter");
    assert_eq!(call["result"], "ok");
    assert!(call["duration_ms"].as_f64().is_some(), "{call}");
    assert_eq!(call["driver_type"], "MockPower", "{call}");
    // The lease's context is on the exporter's lines, each entry a field of its own.
    assert_eq!(call["build_id"], "123", "{call}");
    assert_eq!(call["vcs_ref"], "refs/heads/main", "{call}");
    assert!(
        !about(
            &exporter,
            &lease,
            &format!("lease {lease} started (client ci)")
        )
        .is_empty(),
        "{exporter:#?}"
    );
    // What the driver itself logs is the lease's too.
    let said = exporter
        .iter()
        .find(|o| o["target"] == "driver" && o["message"] == "[driver.MockPower] power on")
        .unwrap_or_else(|| panic!("no driver line: {exporter:#?}"));
    assert_eq!(said["lease_id"], lease.as_str(), "{said}");
    assert_eq!(said["build_id"], "123", "{said}");

    // The lease's story as the controller gathered it: its own events and the exporter's
    // pushed entries (driver calls and driver lines), in time order, with the context.
    let story = crate::log_gathering::story(&s, &lease, &["--client", "ci"], "power on");
    let messages: Vec<&str> = story.iter().filter_map(|o| o["message"].as_str()).collect();
    for m in [
        "lease created",
        "lease granted",
        "dial",
        "driver call",
        "power on",
        "lease ended",
    ] {
        assert!(messages.contains(&m), "no {m:?} in {messages:?}");
    }
    let pos = |m: &str| messages.iter().position(|x| *x == m).unwrap();
    assert!(pos("lease created") < pos("lease granted") && pos("lease granted") < pos("dial"));
    assert!(pos("dial") < pos("driver call"), "{messages:?}");
    let pushed = story
        .iter()
        .find(|o| o["message"] == "driver call" && o["operation"] == "on")
        .unwrap_or_else(|| panic!("no driver call entry: {story:#?}"));
    assert_eq!(pushed["component"], "exporter", "{pushed}");
    assert_eq!(pushed["driver_type"], "MockPower", "{pushed}");
    assert_eq!(pushed["result"], "ok", "{pushed}");
    assert_eq!(pushed["lease_id"], lease.as_str(), "{pushed}");
    assert_eq!(pushed["build_id"], "123", "{pushed}");
    let created = story
        .iter()
        .find(|o| o["message"] == "lease created")
        .unwrap();
    assert_eq!(created["component"], "controller");
    assert_eq!(created["vcs_ref"], "refs/heads/main", "{created}");
    let driver_line = story.iter().find(|o| o["message"] == "power on").unwrap();
    assert_eq!(driver_line["driver_type"], "MockPower", "{driver_line}");
    let times: Vec<&str> = story
        .iter()
        .filter_map(|o| o["timestamp"].as_str())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // As text, by default; and the admin reads it too.
    let out = s
        .cmd(JMP)
        .args(["get", "lease", &lease, "--logs", "--client", "ci"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.lines().any(|l| l.contains("exporter")
            && l.contains("driver call")
            && l.contains("operation=on")
            && l.contains("build_id=123")),
        "{stdout}"
    );
    let out = with_admin(s.cmd(JMP))
        .args(["admin", "logs", "--lease", &lease, "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(
        text(&out).0.lines().count(),
        story.len(),
        "{:?}",
        text(&out)
    );
    // Another client is told the lease does not exist, as with its other reads.
    let out = with_admin(s.cmd(JMP))
        .args(["admin", "create", "client", "other", "--save", "--unsafe"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let out = s
        .cmd(JMP)
        .args(["get", "lease", &lease, "--logs", "--client", "other"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.contains("not found"), "{:?}", text(&out));

    // `jmp create lease --context` shows it back; a bad one is refused and creates nothing.
    let jmp = |args: &[&str]| s.cmd(JMP).args(args).output().unwrap();
    let out = jmp(&[
        "create",
        "lease",
        "--client",
        "ci",
        "-l",
        "kind=json-logs",
        "--duration",
        "1m",
        "--context",
        "image_digest=sha256:0123",
        "-o",
        "yaml",
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(
        text(&out).0.contains("image_digest: sha256:0123"),
        "{:?}",
        text(&out)
    );
    let before = text(&jmp(&["get", "leases", "--client", "ci", "-o", "name"])).0;
    let out = jmp(&[
        "create",
        "lease",
        "--client",
        "ci",
        "-l",
        "kind=json-logs",
        "--duration",
        "1m",
        "--context",
        "bad key=1",
    ]);
    assert!(!out.status.success());
    let err = text(&out).1;
    assert!(
        err.contains("invalid lease context") && err.contains("bad key"),
        "{err}"
    );
    assert_eq!(
        text(&jmp(&["get", "leases", "--client", "ci", "-o", "name"])).0,
        before
    );
    let out = jmp(&[
        "shell",
        "--exporter-config",
        "x.yaml",
        "--context",
        "a=b",
        "--",
        "true",
    ]);
    assert!(
        text(&out)
            .1
            .contains("--context sets the context of a lease"),
        "{:?}",
        text(&out)
    );
}

#[test]
fn a_bad_log_format_is_refused_naming_it() {
    let s = Scratch::new();
    let out = s
        .cmd(JMP)
        .args(["run", "--log-format", "yaml", "--exporter-config"])
        .arg(s.path("exporter.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let (_, err) = text(&out);
    assert!(
        err.contains("yaml") && err.contains("--log-format"),
        "{err}"
    );
}
