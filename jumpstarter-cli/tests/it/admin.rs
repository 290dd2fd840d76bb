//! `jmp admin`, `jmp get`, `jmp describe` and the lease commands against an in-process
//! controller on loopback, following the seed walkthrough; plus `jmp config` (no controller).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use jumpstarter_controller::{ControllerConfig, RunningController, start};

use crate::{JMP, text};

/// Labs run one at a time: where `/etc/jumpstarter` is writable, `--save` puts every lab's
/// `example-distributed.yaml` at the same system path.
static ONE_LAB_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A controller running in-process, and a scratch home for the tools.
struct Lab {
    rt: tokio::runtime::Runtime,
    controller: Option<RunningController>,
    dir: tempfile::TempDir,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl Lab {
    fn new() -> Self {
        let turn = ONE_LAB_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut cfg = ControllerConfig::loopback(dir.path().join("data"));
        cfg.admin_config = Some(dir.path().join("admin.yaml"));
        let controller = rt.block_on(start(cfg)).unwrap();
        Self {
            rt,
            controller: Some(controller),
            dir,
            _turn: turn,
        }
    }

    fn home(&self) -> &Path {
        self.dir.path()
    }

    fn config_dir(&self) -> PathBuf {
        self.home().join("config")
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(JMP);
        c.current_dir(self.home())
            .env("JMP_CLIENT_CONFIG_HOME", self.config_dir())
            .env("XDG_CONFIG_HOME", self.home().join("xdg"))
            .env("JMP_ADMIN_CONFIG", self.home().join("admin.yaml"))
            // A killed exporter's temporary medium stays in the lab's directory.
            .env("TMPDIR", self.home())
            .env("TZ", "UTC")
            .env_remove("JMP_NAME")
            .env_remove("JMP_NAMESPACE")
            .env_remove("JMP_ENDPOINT")
            .env_remove("JMP_TOKEN")
            .env_remove("JMP_GRPC_INSECURE")
            .env_remove("JUMPSTARTER_GRPC_INSECURE")
            .env_remove("JMP_LEASE")
            .stdin(Stdio::null());
        c
    }

    fn jmp(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    /// Runs `jmp`, asserts success, returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.jmp(args);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "jmp {args:?} failed: {stdout}{stderr}"
        );
        stdout
    }

    /// Runs `jmp`, asserts exit code 1 with a one-line error, returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.jmp(args);
        let (stdout, stderr) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "jmp {args:?} should fail: {stdout}{stderr}"
        );
        assert!(stderr.starts_with("Error: "), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        stderr
    }

    /// Creates the seed's exporter and client; returns the exporter config path.
    fn seed_objects(&self) -> PathBuf {
        let out = self.ok(&[
            "admin",
            "create",
            "exporter",
            "example-distributed",
            "--label",
            "foo=bar",
            "--save",
            "--insecure-tls",
        ]);
        let path = out
            .lines()
            .find_map(|l| l.strip_prefix("Exporter configuration saved to "))
            .unwrap_or_else(|| panic!("no saved path in {out}"))
            .to_string();
        self.ok(&[
            "admin",
            "create",
            "client",
            "hello",
            "--save",
            "--unsafe",
            "--insecure-tls",
        ]);
        PathBuf::from(path)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(c) = self.controller.take() {
            self.rt.block_on(c.shutdown());
        }
    }
}

/// Removes a config the test wrote outside its scratch directory (when /etc/jumpstarter is
/// writable, `--save` puts exporter configs there, as the seed says).
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.0.starts_with("/etc") {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn seed_walkthrough_admin_get_and_describe() {
    let lab = Lab::new();
    let exporter_path = lab.seed_objects();
    let _cleanup = Cleanup(exporter_path.clone());
    assert!(
        exporter_path.starts_with(lab.config_dir()) || exporter_path.starts_with("/etc"),
        "{}",
        exporter_path.display()
    );

    // The saved exporter config carries the CA and insecure: true, and is private.
    let cfg = jumpstarter_core::config::ExporterConfig::load(&exporter_path).unwrap();
    assert_eq!(cfg.metadata.name, "example-distributed");
    assert!(cfg.tls.insecure && !cfg.tls.ca.is_empty());
    assert!(cfg.token.as_deref().is_some_and(|t| !t.is_empty()));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&exporter_path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // The client config went to clients/hello.yaml and became the current client.
    let client_path = lab.config_dir().join("clients/hello.yaml");
    let client = jumpstarter_core::config::ClientConfig::load(&client_path).unwrap();
    assert!(client.allows_unsafe() && client.tls.insecure && !client.tls.ca.is_empty());
    let user = std::fs::read_to_string(lab.config_dir().join("config.yaml")).unwrap();
    assert!(user.contains("current-client: hello"), "{user}");

    // jmp get exporters: exactly the seed's table.
    assert_eq!(
        lab.ok(&["get", "exporters"]),
        "NAME                 LABELS\nexample-distributed  foo=bar\n"
    );
    assert_eq!(
        lab.ok(&["get", "exporter", "-o", "name"]),
        "example-distributed\n"
    );
    let json: serde_json::Value =
        serde_json::from_str(&lab.ok(&["get", "exporters", "-o", "json", "--with", "online"]))
            .unwrap();
    assert_eq!(json["exporters"][0]["name"], "example-distributed");
    assert_eq!(json["exporters"][0]["labels"]["foo"], "bar");
    assert_eq!(json["exporters"][0]["online"], false);
    // An empty listing says so, as upstream's (and kubectl's).
    assert_eq!(
        lab.ok(&["get", "exporters", "-l", "foo=baz"]),
        "No resources found.\n"
    );

    // jmp describe exporter: the seed's layout (the exporter is not running here).
    assert_eq!(
        lab.ok(&["describe", "exporter", "example-distributed"]),
        "Name:       example-distributed
Namespace:  default
Labels:
  foo=bar
Online:   no
Status:   OFFLINE
Enabled:  yes
Lease:  <none>
Drivers:  <unknown> (the exporter has not registered yet)
"
    );
    let y = lab.ok(&["describe", "exporter", "example-distributed", "-o", "yaml"]);
    assert!(y.contains("name: example-distributed"), "{y}");

    // jmp describe client: read locally, token expiry from the JWT.
    let d = lab.ok(&["describe", "client", "hello"]);
    let lines: Vec<&str> = d.lines().collect();
    assert_eq!(lines[0], "Alias:      hello");
    assert_eq!(lines[1], format!("Path:       {}", client_path.display()));
    assert_eq!(lines[2], "Current:    yes");
    assert_eq!(lines[3], "Name:       hello");
    assert_eq!(lines[4], "Namespace:  default");
    assert!(lines[5].starts_with("Endpoint:   localhost:"), "{d}");
    assert_eq!(
        &lines[6..12],
        [
            "TLS:",
            "  CA:        configured",
            "  Insecure:  yes",
            "Drivers:",
            "  Allow:   <none>",
            "  Unsafe:  yes"
        ]
    );
    assert_eq!(lines[12], "Token:");
    assert!(
        lines[13].starts_with("  Expiry:  ") && lines[13].ends_with(" UTC"),
        "{d}"
    );
    assert!(
        lines[14].starts_with("  Status:  Valid (") && lines[14].ends_with(" remaining)"),
        "{d}"
    );
    assert_eq!(lines[15], "Refresh Token Stored:  no");
    let j: serde_json::Value =
        serde_json::from_str(&lab.ok(&["describe", "client", "-o", "json"])).unwrap();
    assert_eq!(j["alias"], "hello");
    assert!(j["token"]["remaining_seconds"].as_i64().unwrap() > 0);

    // Admin listings.
    let t = lab.ok(&["admin", "get", "exporter"]);
    assert!(t.starts_with("NAMESPACE  NAME"), "{t}");
    assert!(t.contains("example-distributed"), "{t}");
    assert_eq!(
        lab.ok(&["admin", "get", "clients", "-o", "name"]),
        "client.jumpstarter.dev/hello\n"
    );
}

/// The seed from `jmp config exporter edit` on: drivers added, `jmp run --exporter`, then
/// the exporter is online and available, and a lease on it is In-Use with the seed's
/// Conditions table.
#[test]
fn seed_walkthrough_with_a_running_exporter() {
    let lab = Lab::new();
    let path = lab.seed_objects();
    let _cleanup = Cleanup(path.clone());
    let original = std::fs::read_to_string(&path).unwrap();
    // As docs/quickstart.md says: the drivers under `export:`.
    let edited = original.replacen(
        "\nexport:\n",
        "\nexport:\n  storage:\n    type: jumpstarter_driver_opendal.driver.MockStorageMux\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        1,
    );
    assert_ne!(edited, original);
    // Through `jmp config exporter edit`, with a non-interactive editor.
    let draft = lab.home().join("edited.yaml");
    std::fs::write(&draft, edited).unwrap();
    let out = lab
        .cmd()
        .env("VISUAL", format!("cp {}", draft.display()))
        .args(["config", "exporter", "edit", "example-distributed"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));

    let _exporter = crate::Running(
        lab.cmd()
            .args(["run", "--exporter", "example-distributed"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let seed = "Name:       example-distributed
Namespace:  default
Labels:
  foo=bar
Online:   yes
Status:   AVAILABLE
Enabled:  yes
Lease:  <none>
Drivers:
  Name     Client                                               Labels
  ----     ------                                               ------
  (root)   jumpstarter_driver_composite.client.CompositeClient  <none>
  storage  jumpstarter_driver_opendal.client.StorageMuxClient   <none>
  power    jumpstarter_driver_power.client.PowerClient          <none>
";
    let mut last = String::new();
    for _ in 0..100 {
        last = lab.ok(&["describe", "exporter", "example-distributed"]);
        if last == seed {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(last, seed);

    // The devices it registered, one row each, and in JSON under the exporter.
    let t = lab.ok(&["admin", "get", "exporter", "example-distributed", "-d"]);
    assert!(t.starts_with("NAMESPACE  EXPORTER"), "{t}");
    let power = t
        .lines()
        .find(|l| l.contains(" power "))
        .unwrap_or_default();
    assert!(
        power.contains("jumpstarter_driver_power.client.PowerClient"),
        "{t}"
    );
    assert!(t.lines().any(|l| l.contains(" storage ")), "{t}");
    let j: serde_json::Value = serde_json::from_str(&lab.ok(&[
        "admin",
        "get",
        "exporter",
        "example-distributed",
        "--devices",
        "-o",
        "json",
    ]))
    .unwrap();
    // With a NAME the object itself, not a one-item list.
    assert!(j.get("items").is_none(), "{j}");
    assert_eq!(j["name"], "example-distributed", "{j}");
    let devices = j["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 3, "{j}");
    let y = lab.ok(&[
        "admin",
        "get",
        "exporter",
        "example-distributed",
        "-o",
        "yaml",
    ]);
    assert!(!y.contains("items:"), "{y}");
    assert!(y.lines().any(|l| l == "name: example-distributed"), "{y}");
    // Without a NAME still a list under `items`.
    let all: serde_json::Value =
        serde_json::from_str(&lab.ok(&["admin", "get", "exporters", "-o", "json"])).unwrap();
    assert!(
        all["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|e| e["name"] == "example-distributed")),
        "{all}"
    );
    assert!(
        devices
            .iter()
            .all(|d| d["uuid"].as_str().is_some_and(|u| !u.is_empty()))
    );

    let name = lab
        .ok(&[
            "create",
            "lease",
            "-l",
            "foo=bar",
            "--duration",
            "5m",
            "-o",
            "name",
        ])
        .trim()
        .to_string();
    let mut d = String::new();
    for _ in 0..100 {
        d = lab.ok(&["describe", "lease", &name]);
        if d.contains("Status:                In-Use") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let lines: Vec<&str> = d.lines().collect();
    assert_eq!(lines[0], format!("Name:                  {name}"), "{d}");
    assert_eq!(
        lines[3], "Exporter:              example-distributed",
        "{d}"
    );
    assert_eq!(lines[4], "Client:                hello", "{d}");
    assert_eq!(lines[5], "Status:                In-Use", "{d}");
    assert_eq!(lines[6], "Duration:              0:05:00", "{d}");
    assert!(
        lines[7].starts_with("Effective Begin Time:  20") && lines[7].ends_with(" UTC"),
        "{d}"
    );
    assert_eq!(lines[8], "Effective End Time:    <none>", "{d}");
    assert_eq!(
        &lines[9..12],
        ["Tags:  <none>", "Context:  <none>", "Conditions:"],
        "{d}"
    );
    assert_eq!(
        lines[12],
        "  Type   Status  Reason  Message                                       Last Transition Time"
    );
    assert_eq!(
        lines[13],
        "  ----   ------  ------  -------                                       --------------------"
    );
    assert!(
        lines[14].starts_with(
            "  Ready  True    Ready   An exporter has been acquired for the client  20"
        ),
        "{d}"
    );
    let t = lab.ok(&["get", "exporters", "--with", "leases"]);
    assert!(t.contains("hello      In-Use"), "{t}");
    lab.ok(&["delete", "leases", &name]);
}

#[test]
fn lease_create_get_describe_update_delete() {
    let lab = Lab::new();
    let _cleanup = Cleanup(lab.seed_objects());

    let name = lab
        .ok(&[
            "create",
            "lease",
            "-l",
            "foo=bar",
            "--duration",
            "5m",
            "--tag",
            "build=7",
            "-o",
            "name",
        ])
        .trim()
        .to_string();
    assert!(!name.is_empty());

    // Listed as the client's own lease, waiting (no exporter is online).
    let t = lab.ok(&["get", "leases"]);
    assert!(
        t.starts_with("NAME") && t.contains(&name) && t.contains("foo=bar"),
        "{t}"
    );
    assert_eq!(
        lab.ok(&["get", "leases", "-o", "name"]),
        format!("{name}\n")
    );
    let j: serde_json::Value =
        serde_json::from_str(&lab.ok(&["get", "leases", "-o", "json"])).unwrap();
    assert_eq!(j["leases"][0]["duration"], 300.0);
    assert_eq!(j["leases"][0]["client"], "hello");
    assert_eq!(j["leases"][0]["tags"]["build"], "7");

    // describe lease: the seed's fields; it says why it waits.
    let d = lab.ok(&["describe", "lease", &name]);
    let expected_head = format!(
        "Name:                  {name}
Namespace:             default
Selector:              foo=bar
Exporter:              <none>
Client:                hello
Status:                Waiting
Duration:              0:05:00
Effective Begin Time:  <none>
Effective End Time:    <none>
Tags:
  build=7
Context:  <none>
"
    );
    assert!(d.starts_with(&expected_head), "{d}");
    if d.contains("Conditions:\n") {
        assert!(d.contains("  Type     Status  Reason"), "{d}");
        assert!(d.contains("Pending"), "{d}");
    }

    // Extend it.
    lab.ok(&["update", "lease", &name, "--duration", "10m"]);
    let d = lab.ok(&["describe", "lease", &name]);
    assert!(d.contains("Duration:              0:10:00"), "{d}");

    // Delete it: upstream's output, and it is gone from the active list.
    assert_eq!(
        lab.ok(&["delete", "leases", &name]),
        format!("lease \"{name}\" deleted\n")
    );
    let mut gone = false;
    for _ in 0..50 {
        if lab.ok(&["get", "leases", "-o", "name"]).is_empty() {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(gone, "lease still active after delete");

    // --all deletes every own active lease.
    lab.ok(&["create", "lease", "-l", "foo=bar", "--duration", "1h"]);
    let out = lab.ok(&["delete", "lease", "--all", "-o", "name"]);
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[test]
fn bad_input_is_one_clear_line_and_changes_nothing() {
    let lab = Lab::new();
    let _cleanup = Cleanup(lab.seed_objects());

    // A bad label: refused before anything is created or written.
    let e = lab.fails(&[
        "admin", "create", "exporter", "bad1", "--label", "foo", "--save",
    ]);
    assert!(e.contains("label"), "{e}");
    let e = lab.fails(&["admin", "create", "exporter", "bad2", "--label", "a=b c"]);
    assert!(e.contains("label"), "{e}");
    let e = lab.fails(&["admin", "create", "exporter", "Bad_Name", "--label", "a=b"]);
    assert!(e.contains("name"), "{e}");
    let names = lab.ok(&["admin", "get", "exporters", "-o", "name"]);
    assert_eq!(names, "exporter.jumpstarter.dev/example-distributed\n");
    assert!(!lab.config_dir().join("exporters/bad1.yaml").exists());

    // An existing name: the controller refuses; the saved config stays as it was.
    let client_path = lab.config_dir().join("clients/hello.yaml");
    let before = std::fs::read(&client_path).unwrap();
    let e = lab.fails(&["admin", "create", "client", "hello", "--save"]);
    assert!(e.contains("hello"), "{e}");
    assert_eq!(std::fs::read(&client_path).unwrap(), before);

    // Malformed selector, unknown names, zero duration.
    let e = lab.fails(&["get", "exporters", "-l", "foo in (("]);
    assert!(e.contains("selector"), "{e}");
    let e = lab.fails(&["describe", "exporter", "nope"]);
    assert!(e.contains("nope"), "{e}");
    let e = lab.fails(&["describe", "lease", "nope"]);
    assert!(e.contains("nope"), "{e}");
    let e = lab.fails(&["create", "lease", "-l", "foo=bar", "--duration", "0"]);
    assert!(e.contains("greater than zero"), "{e}");
    let e = lab.fails(&["create", "lease", "-l", "foo=bar", "--duration", "soon"]);
    assert!(e.contains("duration"), "{e}");
    let e = lab.fails(&["create", "lease", "-l", "foo in ((", "--duration", "5m"]);
    assert!(e.contains("selector"), "{e}");
    let e = lab.fails(&["delete", "leases", "nope"]);
    assert!(e.contains("nope"), "{e}");
    assert_eq!(lab.ok(&["get", "leases", "-a", "-o", "name"]), "");

    // Kubernetes flags this jmp admin cannot honour are refused by name, and nothing is made.
    let e = lab.fails(&[
        "admin",
        "create",
        "exporter",
        "kx",
        "--label",
        "a=b",
        "--kubeconfig",
        "k",
    ]);
    assert!(e.contains("--kubeconfig is not supported"), "{e}");
    let e = lab.fails(&["admin", "get", "clients", "--context", "prod"]);
    assert!(e.contains("--context is not supported"), "{e}");
    let e = lab.fails(&["admin", "delete", "client", "hello", "--kubeconfig", "k"]);
    assert!(e.contains("--kubeconfig"), "{e}");
    let names = lab.ok(&["admin", "get", "exporters", "-o", "name"]);
    assert_eq!(names, "exporter.jumpstarter.dev/example-distributed\n");
    assert!(client_path.exists());

    // Things not offered, and a missing admin config, say what to do.
    let e = lab.fails(&["admin", "create", "cluster", "x", "--kind", "k"]);
    assert!(e.contains("not offered"), "{e}");
    let out = lab
        .cmd()
        .env("JMP_ADMIN_CONFIG", lab.home().join("missing.yaml"))
        .args(["admin", "get", "clients"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("missing.yaml") && stderr.contains("controller"),
        "{stderr}"
    );

    // Unknown client alias.
    let e = lab.fails(&["get", "exporters", "--client", "nobody"]);
    assert!(e.contains("nobody"), "{e}");
}

#[test]
fn admin_delete_rotate_and_import() {
    let lab = Lab::new();
    let _cleanup = Cleanup(lab.seed_objects());
    let client_path = lab.config_dir().join("clients/hello.yaml");
    let old = jumpstarter_core::config::ClientConfig::load(&client_path).unwrap();

    // Rotate with --save: a new token in the same file, other settings kept.
    // Upstream's words, which its e2e suite checks.
    let out = lab.ok(&["admin", "rotate", "client", "hello", "--save"]);
    assert!(
        out.starts_with(
            "Token rotated for client 'hello'\nClient configuration updated with new token ("
        ),
        "{out}"
    );
    let new = jumpstarter_core::config::ClientConfig::load(&client_path).unwrap();
    assert_ne!(new.token, old.token);
    assert!(new.allows_unsafe());
    assert_eq!(
        lab.ok(&["get", "exporters", "-o", "name"]),
        "example-distributed\n"
    );

    // jmp auth: status from the JWT, rotate through ClientService.RotateToken.
    let st = lab.ok(&["auth", "status"]);
    assert!(st.contains("Status:                Valid ("), "{st}");
    let out = lab.ok(&["auth", "rotate"]);
    assert!(out.starts_with("Token rotated; saved to "), "{out}");
    let rotated = jumpstarter_core::config::ClientConfig::load(&client_path).unwrap();
    assert_ne!(rotated.token, new.token);
    assert_eq!(
        lab.ok(&["get", "exporters", "-o", "name"]),
        "example-distributed\n"
    );
    let e = lab.fails(&["auth", "refresh"]);
    assert!(e.contains("no refresh token"), "{e}");

    // Import writes a config for an existing client.
    let out_path = lab.home().join("imported.yaml");
    let p = lab.ok(&[
        "admin",
        "import",
        "client",
        "hello",
        "--out",
        out_path.to_str().unwrap(),
        "-o",
        "path",
    ]);
    assert_eq!(p.trim(), out_path.display().to_string());
    let imported = jumpstarter_core::config::ClientConfig::load(&out_path).unwrap();
    assert_eq!(imported.metadata.name, "hello");

    // Delete with --delete removes the object and the local file.
    assert_eq!(
        lab.ok(&[
            "admin", "delete", "client", "hello", "--delete", "-o", "name"
        ]),
        "client.jumpstarter.dev/hello\n"
    );
    assert!(!client_path.exists());
    assert_eq!(lab.ok(&["admin", "get", "clients", "-o", "name"]), "");
    let e = lab.fails(&["admin", "delete", "client", "hello"]);
    assert!(e.contains("hello"), "{e}");
}

// ---------------------------------------------------------------------------------------
// jmp config (local files only)

fn config_cmd(home: &Path) -> Command {
    let mut c = Command::new(JMP);
    // Drafts kept after a bad edit land in `home`, not in the machine's /tmp.
    c.current_dir(home)
        .env("JMP_CLIENT_CONFIG_HOME", home.join("config"))
        .env("TMPDIR", home)
        .env_remove("JMP_NAME")
        .stdin(Stdio::null());
    c
}

fn run_ok(c: &mut Command) -> String {
    let out = c.output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    stdout
}

#[test]
fn config_client_create_list_use_delete() {
    let d = tempfile::tempdir().unwrap();
    let home = d.path();
    let p = run_ok(config_cmd(home).args([
        "config", "client", "create", "one", "-e", "ctl:443", "-t", "tok", "--unsafe", "-o", "path",
    ]));
    assert_eq!(
        p.trim(),
        home.join("config/clients/one.yaml").display().to_string()
    );
    run_ok(config_cmd(home).args([
        "config", "client", "create", "two", "-e", "ctl2:443", "-t", "tok2",
    ]));
    let t = run_ok(config_cmd(home).args(["config", "client", "list"]));
    let path1 = home.join("config/clients/one.yaml").display().to_string();
    let path2 = home.join("config/clients/two.yaml").display().to_string();
    assert_eq!(
        t,
        format!(
            "CURRENT  ALIAS  ENDPOINT  PATH\n*        one    ctl:443   {path1}\n         two    ctl2:443  {path2}\n"
        )
    );
    run_ok(config_cmd(home).args(["config", "client", "use", "two"]));
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(config_cmd(home).args(["version", "-o", "json"]))).unwrap();
    assert!(v["gitVersion"].is_string(), "{v}");
    assert!(run_ok(config_cmd(home).args(["version"])).starts_with("Jumpstarter v"));
    // Which upstream release this one works with, in every form.
    assert_eq!(v["compatibleWith"], "0.9.0", "{v}");
    assert!(
        run_ok(config_cmd(home).args(["version"]))
            .trim_end()
            .ends_with("(Rust; compatible with Jumpstarter 0.9.0)")
    );
    let long = run_ok(config_cmd(home).args(["--version"]));
    assert_eq!(
        long,
        format!(
            "jmp {} (Rust; compatible with Jumpstarter 0.9.0)\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    let j: serde_json::Value = serde_json::from_str(&run_ok(
        config_cmd(home).args(["config", "client", "ls", "-o", "json"]),
    ))
    .unwrap();
    assert_eq!(j["currentConfig"], "two");
    assert_eq!(j["kind"], "ClientConfigList");
    assert_eq!(j["items"][0]["alias"], "one");
    assert_eq!(j["items"][0]["refresh_token"], serde_json::Value::Null);
    run_ok(config_cmd(home).args(["config", "client", "delete", "two"]));
    assert_eq!(
        run_ok(config_cmd(home).args(["config", "client", "list", "-o", "name"])),
        "one\n"
    );
    // Bad input.
    for args in [
        &["config", "client", "use", "nope"][..],
        &["config", "client", "delete", "nope"],
        &["config", "client", "create", "x", "-t", "t"],
        &["config", "client", "create", "one", "-e", "e:1", "-t", "t"],
    ] {
        let out = config_cmd(home).args(args).output().unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("Error: "), "{stderr}");
    }
}

#[test]
fn config_exporter_create_edit_list_delete() {
    let d = tempfile::tempdir().unwrap();
    let home = d.path();
    let path = home.join("config/exporters/lab.yaml");
    run_ok(config_cmd(home).args([
        "config",
        "exporter",
        "create",
        "lab",
        "--endpoint",
        "ctl:443",
        "--token",
        "t",
    ]));
    let original = std::fs::read_to_string(&path).unwrap();
    // `export:` with room under it, as docs/quickstart.md says (not `export: {}`).
    assert!(original.contains("\nexport:\n"), "{original}");
    assert!(!original.contains("export: {}"), "{original}");

    // An editor that breaks the file: refused, the old file kept, the edits kept aside.
    let bad_editor = home.join("bad-editor.sh");
    std::fs::write(&bad_editor, "#!/bin/sh\necho 'export: [oops' > \"$1\"\n").unwrap();
    let out = config_cmd(home)
        .env("EDITOR", format!("sh {}", bad_editor.display()))
        .env_remove("VISUAL")
        .args(["config", "exporter", "edit", "lab"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // The config's path once (unchanged), the kept edits' path where the error points and
    // in the command that goes on.
    let kept = stderr
        .split("--from ")
        .nth(1)
        .and_then(|s| s.lines().next())
        .unwrap()
        .to_string();
    let shown = stderr
        .replace(&kept, "KEPT")
        .replace(&path.display().to_string(), "CONFIG");
    let shown = &shown[shown.find("Error:").unwrap()..];
    insta::assert_snapshot!(shown, @r"
    Error: the edited config is invalid: KEPT: error: line 1 column 9: expected mapping start
     --> <input>:1:9
      |
    1 | export: [oops
      |         ^ expected mapping start
    CONFIG is unchanged. Go on editing with: jmp config exporter edit lab --from KEPT
    ");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original);
    // Going on from the kept edits: an editor that repairs them, and the config is saved.
    let fixed = home.join("fixed.yaml");
    std::fs::write(
        &fixed,
        original.replace(
            "\nexport:\n",
            "\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        ),
    )
    .unwrap();
    let fix_editor = home.join("fix-editor.sh");
    std::fs::write(
        &fix_editor,
        format!(
            "#!/bin/sh\ngrep -q oops \"$1\" && cp {} \"$1\"\n",
            fixed.display()
        ),
    )
    .unwrap();
    run_ok(
        config_cmd(home)
            .env("VISUAL", format!("sh {}", fix_editor.display()))
            .args(["config", "exporter", "edit", "lab", "--from", &kept]),
    );
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.contains("MockPower"), "{saved}");
    std::fs::write(&path, &original).unwrap();
    let _ = std::fs::remove_file(&kept);

    // An editor that adds a driver of a type that does not exist: refused with the message
    // `jmp run` gives, the edits kept aside.
    let typo_editor = home.join("typo-editor.sh");
    std::fs::write(
        &typo_editor,
        "#!/bin/sh\nsed -i 's/^export:$/export:\\n  power:\\n    type: jumpstarter_driver_power.driver.MockPowr/' \"$1\"\n",
    )
    .unwrap();
    let out = config_cmd(home)
        .env("VISUAL", format!("sh {}", typo_editor.display()))
        .args(["config", "exporter", "edit", "lab"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let kept = stderr
        .split("--from ")
        .nth(1)
        .and_then(|s| s.lines().next())
        .unwrap()
        .to_string();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original);
    let out = config_cmd(home)
        .args(["run", "--exporter-config", &kept])
        .output()
        .unwrap();
    let (_, run_stderr) = text(&out);
    let unknown =
        "export.power.type: unknown driver type \"jumpstarter_driver_power.driver.MockPowr\"";
    assert!(stderr.contains(unknown), "{stderr}");
    assert!(run_stderr.contains(unknown), "{run_stderr}");
    let _ = std::fs::remove_file(&kept);

    // An editor that adds a driver: saved.
    let good_editor = home.join("good-editor.sh");
    std::fs::write(
        &good_editor,
        "#!/bin/sh\nsed -i 's/^export:$/export:\\n  power:\\n    type: jumpstarter_driver_power.driver.MockPower/' \"$1\"\n",
    )
    .unwrap();
    run_ok(
        config_cmd(home)
            .env("VISUAL", format!("sh {}", good_editor.display()))
            .args(["config", "exporter", "edit", "lab"]),
    );
    let cfg = jumpstarter_core::config::ExporterConfig::load(&path).unwrap();
    assert!(cfg.export.contains_key("power"));

    let t = run_ok(config_cmd(home).args(["config", "exporter", "list"]));
    assert!(t.starts_with("ALIAS  PATH\n"), "{t}");
    assert!(t.contains(&format!("lab    {}", path.display())), "{t}");
    let j: serde_json::Value = serde_json::from_str(&run_ok(
        config_cmd(home).args(["config", "exporter", "list", "-o", "json"]),
    ))
    .unwrap();
    assert_eq!(j["kind"], "ExporterConfigList");
    run_ok(config_cmd(home).args(["config", "exporter", "delete", "lab"]));
    assert!(!path.exists());
    let out = config_cmd(home)
        .args(["config", "exporter", "delete", "lab"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// Every upstream 0.9.0 command path this crate offers, and upstream's aliases, parse.
#[test]
fn upstream_command_paths_and_aliases_parse() {
    use clap::Parser;
    use jumpstarter_cli::Cli;
    let paths = [
        "admin create client",
        "admin create cluster",
        "admin create exporter",
        "admin delete client",
        "admin delete cluster",
        "admin delete exporter",
        "admin get client",
        "admin get cluster",
        "admin get clusters",
        "admin get exporter",
        "admin get lease",
        "admin import client",
        "admin import exporter",
        "admin rotate client",
        "admin version",
        "config client create",
        "config client delete",
        "config client list",
        "config client use",
        "config exporter create",
        "config exporter delete",
        "config exporter edit",
        "config exporter list",
        "create lease",
        "delete leases",
        "get exporters",
        "get leases",
        "update lease",
        "describe exporter",
        "describe lease",
        "describe client",
        "auth status",
        "auth rotate",
        "auth refresh",
        "driver list",
        "driver version",
        // Aliases (upstream's AliasedGroup).
        "a c e",
        "a g clients",
        "a del exporters",
        "a i c",
        "conf c ls",
        "conf exporters ls",
        "g exporter",
        "g e",
        "g lease",
        "c l",
        "c leases",
        "d lease",
        "del l",
        "update leases",
        "admin get leases",
    ];
    for path in paths {
        let mut args = vec!["jmp"];
        args.extend(path.split_whitespace());
        args.push("--help");
        let e = Cli::try_parse_from(&args).unwrap_err();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::DisplayHelp,
            "jmp {path}: {e}"
        );
    }
    // Upstream's flags are there.
    for args in [
        &[
            "jmp",
            "get",
            "exporters",
            "-l",
            "a=b",
            "--with",
            "leases,online",
            "-o",
            "json",
        ][..],
        &[
            "jmp",
            "get",
            "leases",
            "-a",
            "-A",
            "--tag-filter",
            "x=y",
            "-o",
            "yaml",
        ],
        &[
            "jmp",
            "create",
            "lease",
            "-n",
            "ex",
            "--duration",
            "1d",
            "--begin-time",
            "2024-01-01T12:00:00",
            "--lease-id",
            "x",
            "--tag",
            "a=b",
            "--allow-disabled",
            "-o",
            "name",
        ],
        &["jmp", "update", "lease", "x", "--to-client", "y"],
        &["jmp", "delete", "leases", "-a", "-o", "name"],
        &[
            "jmp",
            "admin",
            "create",
            "exporter",
            "x",
            "-l",
            "a=b",
            "-s",
            "--out",
            "f",
            "-n",
            "ns",
            "-k",
            "--nointeractive",
            "-o",
            "yaml",
            "--kubeconfig",
            "k",
            "--context",
            "c",
        ],
        &[
            "jmp",
            "admin",
            "create",
            "client",
            "x",
            "-s",
            "-a",
            "p.*",
            "--unsafe",
            "--out",
            "f",
            "-l",
            "a=b",
            "-k",
            "--oidc-username",
            "u",
            "-o",
            "json",
        ],
        &[
            "jmp",
            "admin",
            "delete",
            "exporter",
            "x",
            "-d",
            "-o",
            "name",
            "--nointeractive",
        ],
        &[
            "jmp", "admin", "import", "client", "x", "--out", "f", "-a", "p", "--unsafe", "-k",
            "-o", "path",
        ],
        &[
            "jmp", "admin", "rotate", "client", "x", "-s", "--out", "f", "-o", "name",
        ],
        &[
            "jmp",
            "config",
            "client",
            "create",
            "x",
            "--namespace",
            "n",
            "--name",
            "m",
            "-e",
            "e:1",
            "-t",
            "t",
            "-a",
            "p",
            "--unsafe",
            "-k",
            "--nointeractive",
            "-o",
            "path",
        ],
        &[
            "jmp",
            "config",
            "exporter",
            "create",
            "x",
            "--namespace",
            "n",
            "--name",
            "m",
            "--endpoint",
            "e:1",
            "--token",
            "t",
            "-k",
            "-o",
            "path",
        ],
    ] {
        assert!(Cli::try_parse_from(args).is_ok(), "{args:?}");
    }
    // Create lease needs a target and a duration; update lease needs a change.
    for args in [
        &["jmp", "create", "lease", "--duration", "1h"][..],
        &["jmp", "create", "lease", "-l", "a=b"],
        &["jmp", "update", "lease", "x"],
        &["jmp", "get", "exporters", "-o", "table"],
    ] {
        assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
    }
}

/// Issue 22 item 4: a `jmp shell` stopped by SIGINT, SIGTERM or SIGHUP while it waits in
/// the queue for a busy exporter releases its lease (upstream's "Releasing Lease").
#[test]
fn a_signalled_shell_waiting_in_the_queue_releases_its_lease() {
    let lab = Lab::new();
    let path = lab.seed_objects();
    let _cleanup = Cleanup(path);
    let _exporter = crate::Running(
        lab.cmd()
            .args(["run", "--exporter", "example-distributed"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Keep the only exporter busy.
    let busy = lab
        .ok(&[
            "create",
            "lease",
            "-l",
            "foo=bar",
            "--duration",
            "5m",
            "-o",
            "name",
        ])
        .trim()
        .to_string();
    let mut in_use = false;
    for _ in 0..100 {
        if lab
            .ok(&["describe", "lease", &busy])
            .contains("Status:                In-Use")
        {
            in_use = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(in_use, "the first lease was never granted");

    for name in ["INT", "TERM", "HUP"] {
        let mut shell = lab
            .cmd()
            .args(["shell", "-l", "foo=bar", "--duration", "5m", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = shell.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        let queued = loop {
            match rx.recv_timeout(std::time::Duration::from_secs(30)) {
                Ok(l) => {
                    let waiting = l.starts_with("Waiting for lease");
                    seen.push(l);
                    if waiting {
                        break true;
                    }
                }
                Err(_) => break false,
            }
        };
        if !queued {
            let _ = shell.kill();
            let _ = shell.wait();
            panic!("SIG{name}: the shell never queued: {seen:?}");
        }
        // Both leases are active now: the busy one and the queued one.
        let active = lab.ok(&["get", "leases", "-o", "name"]);
        assert_eq!(active.lines().count(), 2, "SIG{name}: {active}");

        let sent = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(shell.id().to_string())
            .status()
            .unwrap();
        assert!(sent.success());
        let mut exited = None;
        for _ in 0..200 {
            if let Some(st) = shell.try_wait().unwrap() {
                exited = Some(st);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let Some(status) = exited else {
            let _ = shell.kill();
            let _ = shell.wait();
            panic!("SIG{name}: the shell did not stop");
        };
        assert!(!status.success(), "SIG{name}: {status:?}");
        while let Ok(l) = rx.recv_timeout(std::time::Duration::from_secs(5)) {
            seen.push(l);
        }
        assert!(
            seen.iter().any(|l| l.starts_with("Releasing lease")),
            "SIG{name}: {seen:?}"
        );
        // Only the busy lease is left.
        let mut left = String::new();
        for _ in 0..50 {
            left = lab.ok(&["get", "leases", "-o", "name"]);
            if left.lines().count() == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert_eq!(
            left,
            format!("{busy}\n"),
            "SIG{name}: a lease was left behind"
        );
    }
    lab.ok(&["delete", "leases", &busy]);
}

#[test]
fn quarantined_exporters_are_shown_and_cleared_by_an_admin() {
    use jumpstarter_controller::{
        objects::{Exporter, conditions, set_condition},
        store::Store,
    };
    let lab = Lab::new();
    let exporter_path = lab.seed_objects();
    let _cleanup = Cleanup(exporter_path);
    let store = &lab.controller.as_ref().unwrap().state.store;
    // What the controller records when the exporter reports `[UNHEALTHY] ...`.
    lab.rt.block_on(jumpstarter_controller::testing::update_exporter_status(
        store,
        "default",
        "example-distributed",
        |e| {
            let st = e.status.get_or_insert_with(Default::default);
            set_condition(
                &mut st.conditions,
                conditions::HEALTHY,
                false,
                conditions::REASON_HEALTH_CHECK_FAILED,
                "healthCheck: failed 3 times in a row (last: Hook failed with exit code 3)\nprobe: no answer",
                None,
                jiff::Timestamp::now(),
            );
        },
    ));
    let table = lab.ok(&["get", "exporters", "--with", "status"]);
    assert!(table.contains("UNHEALTHY"), "{table}");
    let d = lab.ok(&["describe", "exporter", "example-distributed"]);
    assert!(
        d.contains(
            "Health Reason:  healthCheck: failed 3 times in a row (last: Hook failed with exit code 3)"
        ),
        "{d}"
    );
    assert!(d.contains("Last Output:\n  probe: no answer\n"), "{d}");
    let admin = lab.ok(&["admin", "get", "exporter", "example-distributed"]);
    assert!(admin.contains("UNHEALTHY"), "{admin}");

    assert_eq!(
        lab.ok(&["admin", "clear-health", "exporter", "example-distributed"]),
        "Cleared the health of exporter \"example-distributed\"\n"
    );
    let healthy = lab.rt.block_on(async {
        let e: Exporter = store
            .get("default", "example-distributed")
            .await
            .unwrap()
            .unwrap();
        e.unhealthy().is_none()
    });
    assert!(healthy);
    let table = lab.ok(&["get", "exporters", "--with", "status"]);
    assert!(!table.contains("UNHEALTHY"), "{table}");
    assert!(
        !lab.ok(&["describe", "exporter", "example-distributed"])
            .contains("Health")
    );
    // Clearing again changes nothing and says so; bad and unknown names are one line.
    assert_eq!(
        lab.ok(&["admin", "clear-health", "exporter", "example-distributed"]),
        "Exporter \"example-distributed\" was not unhealthy\n"
    );
    let e = lab.fails(&["admin", "clear-health", "exporter", "no-such-exporter"]);
    assert!(e.contains("no-such-exporter"), "{e}");
    let e = lab.fails(&["admin", "clear-health", "exporter", "Bad_Name"]);
    assert!(e.contains("invalid exporter name"), "{e}");
}

/// `jmp admin create client|exporter --help` stay as recorded (upstream's flags, in
/// upstream's order): the two commands share one argument struct, and a change there must
/// not move or rename a flag of either.
#[test]
fn admin_create_help_is_unchanged() {
    use clap::Parser;
    use jumpstarter_cli::Cli;
    for (kind, want) in [
        (
            "client",
            include_str!("../data/admin-create-client.help.txt"),
        ),
        (
            "exporter",
            include_str!("../data/admin-create-exporter.help.txt"),
        ),
    ] {
        let e = Cli::try_parse_from(["jmp", "admin", "create", kind, "--help"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        let got = e.to_string();
        assert_eq!(got, want, "jmp admin create {kind} --help changed");
    }
}
