//! Managing virtual target pools with `jmp admin`: `apply -f` (a file and stdin) of a
//! VirtualTargetClass and an ExporterSet, re-applied unchanged and configured, shown by `get`
//! and `describe`, deleted; a bad document among good ones writes nothing. On the embedded
//! store, with the real `jmp`. The sets here keep no replicas (no floor, no warm pool, no
//! lease), so what they show does not depend on the pool engine scaling.

use std::{
    io::Write,
    path::Path,
    process::{Command, Output, Stdio},
};

use jumpstarter_controller::{ControllerConfig, RunningController, start};

use crate::{JMP, text};

const CLASS_AND_POOL: &str = "\
# A class and a pool of MockPower boards.
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata:
  name: local
spec:
  provisioner: local
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: mock-pool
spec:
  virtualTargetClassName: local
  maxReplicas: 3
  scaleDownCooldown: 10s
  selector:
    matchLabels:
      pool: mock
  template:
    metadata:
      labels:
        pool: mock
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
";

const CLASS_ID: &str = "virtualtargetclass.virtualtarget.jumpstarter.dev/local";
const SET_ID: &str = "exporterset.virtualtarget.jumpstarter.dev/mock-pool";

struct Lab {
    rt: tokio::runtime::Runtime,
    controller: Option<RunningController>,
    dir: tempfile::TempDir,
}

impl Lab {
    fn new() -> Self {
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
        }
    }

    fn home(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.home().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(JMP);
        c.args(args)
            .current_dir(self.home())
            .env("JMP_CLIENT_CONFIG_HOME", self.home().join("config"))
            .env("XDG_CONFIG_HOME", self.home().join("xdg"))
            .env("JMP_ADMIN_CONFIG", self.home().join("admin.yaml"))
            .env("TZ", "UTC")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let Some(input) = stdin else {
            return self.cmd(args).output().unwrap();
        };
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs `jmp admin ARGS`, asserts success, returns stdout and stderr.
    fn ok(&self, args: &[&str], stdin: Option<&str>) -> (String, String) {
        let mut all = vec!["admin"];
        all.extend(args);
        let out = self.run(&all, stdin);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "jmp {all:?} failed: {stdout}{stderr}");
        (stdout, stderr)
    }

    /// Runs `jmp admin ARGS`, asserts it fails with a one-line error, returns it.
    fn fails(&self, args: &[&str]) -> String {
        let mut all = vec!["admin"];
        all.extend(args);
        let out = self.run(&all, None);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "jmp {all:?}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.starts_with("Error: "), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        stderr
    }

    /// The NAME column of `jmp admin get KIND`.
    fn names(&self, kind: &str) -> Vec<String> {
        let (out, _) = self.ok(&["get", kind], None);
        out.lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(c) = self.controller.take() {
            self.rt.block_on(c.shutdown());
        }
    }
}

#[test]
fn apply_get_describe_and_delete_a_pool() {
    let lab = Lab::new();
    let file = lab.write("pool.yaml", CLASS_AND_POOL);

    let (out, _) = lab.ok(&["apply", "-f", &file], None);
    assert_eq!(out, format!("{CLASS_ID} created\n{SET_ID} created\n"));
    // Again: nothing changed.
    let (out, _) = lab.ok(&["apply", "-f", &file], None);
    assert_eq!(out, format!("{CLASS_ID} unchanged\n{SET_ID} unchanged\n"));

    // From stdin, with a new ceiling: the set is configured, the class unchanged.
    let raised = CLASS_AND_POOL.replace("maxReplicas: 3", "maxReplicas: 5");
    let (out, _) = lab.ok(&["apply", "-f", "-"], Some(&raised));
    assert_eq!(out, format!("{CLASS_ID} unchanged\n{SET_ID} configured\n"));
    let (out, _) = lab.ok(&["apply", "-f", "-", "-o", "name"], Some(&raised));
    assert_eq!(out, format!("{CLASS_ID}\n{SET_ID}\n"));
    let (out, _) = lab.ok(&["apply", "-f", &file, "-o", "json"], None);
    let applied: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(applied["items"][1]["kind"], "ExporterSet");
    assert_eq!(applied["items"][1]["action"], "configured");

    // get: the table, names, the upstream-format object.
    let (out, _) = lab.ok(&["get", "exportersets"], None);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "CLASS",
            "REPLICAS",
            "READY",
            "AVAILABLE",
            "LEASED",
            "MIN",
            "MAX"
        ]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row.len(), 8, "{out}");
    assert_eq!(
        (row[0], row[1], row[6], row[7]),
        ("mock-pool", "local", "0", "3")
    );
    assert_eq!(lines.next(), None);
    let (out, _) = lab.ok(&["get", "es", "-o", "name"], None);
    assert_eq!(out, format!("{SET_ID}\n"));
    let (out, _) = lab.ok(&["get", "exporterset", "mock-pool", "-o", "yaml"], None);
    assert!(out.contains("kind: ExporterSet"), "{out}");
    assert!(out.contains("maxReplicas: 3"), "{out}");
    assert!(out.contains("virtualTargetClassName: local"), "{out}");
    let (out, _) = lab.ok(&["get", "exportersets", "-o", "json"], None);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"][0]["metadata"]["name"], "mock-pool");
    let (out, _) = lab.ok(&["get", "virtualtargetclasses"], None);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["local", "local", "Immediate", "Delete"],
        "{out}"
    );

    // describe: spec, status, conditions, decisions.
    let (out, _) = lab.ok(&["describe", "exporterset", "mock-pool"], None);
    for want in [
        "Name:         mock-pool\n",
        "Namespace:    default\n",
        "Class:        local (provisioner local)\n",
        "Selector:     pool=mock\n",
        "Replicas:     min 0, max 3, min available 0\n",
        "Scale down:   after 10s idle\n",
        "Drivers:      power (jumpstarter_driver_power.driver.MockPower)\n",
        "Conditions:\n",
        "Recent scaling decisions:\n",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    let (out, _) = lab.ok(&["describe", "virtualtargetclass", "local"], None);
    assert!(out.contains("Provisioner:  local\n"), "{out}");

    // A class a set names is not deleted; the set is, then the class.
    let err = lab.fails(&["delete", "virtualtargetclass", "local"]);
    assert!(err.contains("used by exporter set(s) mock-pool"), "{err}");
    let (out, _) = lab.ok(&["delete", "exporterset", "mock-pool"], None);
    assert_eq!(
        out,
        "exporterset.virtualtarget.jumpstarter.dev \"mock-pool\" deleted\n"
    );
    assert!(lab.names("exportersets").is_empty());
    let err = lab.fails(&["describe", "exporterset", "mock-pool"]);
    assert!(err.contains("not found"), "{err}");
    let (out, _) = lab.ok(&["delete", "vtc", "local", "-o", "name"], None);
    assert_eq!(out, format!("{CLASS_ID}\n"));
    assert!(lab.names("virtualtargetclasses").is_empty());
}

#[test]
fn a_bad_document_among_good_ones_writes_nothing() {
    let lab = Lab::new();
    let client = "\
apiVersion: jumpstarter.dev/v1alpha1
kind: Client
metadata:
  name: ci
spec: {}
";
    // The second set is invalid: minReplicas over maxReplicas.
    let bad_set = CLASS_AND_POOL
        .split("---\n")
        .nth(1)
        .unwrap()
        .replace("mock-pool", "bad-pool")
        .replace("maxReplicas: 3", "maxReplicas: 3\n  minReplicas: 4");
    let text = format!("{CLASS_AND_POOL}---\n{client}---\n{bad_set}");
    let file = lab.write("mixed.yaml", &text);
    let err = lab.fails(&["apply", "-f", &file]);
    // The fourth document starts on the line after the third `---`.
    let marker = text.lines().enumerate().filter(|(_, l)| *l == "---").nth(2);
    let line = marker.unwrap().0 + 2;
    assert!(
        err.contains(&format!("(document 4 of {file}, from line {line})")),
        "{err}"
    );
    assert!(
        err.contains(
            "document 4 (ExporterSet bad-pool): spec.minReplicas: minReplicas must be less \
             than or equal to maxReplicas"
        ),
        "{err}"
    );
    assert!(lab.names("virtualtargetclasses").is_empty());
    assert!(lab.names("exportersets").is_empty());
    assert!(!lab.names("clients").contains(&"ci".to_string()));

    // A document that does not parse is named with its line; nothing is sent.
    let broken = lab.write(
        "broken.yaml",
        &format!("{CLASS_AND_POOL}---\nkind: Client\nmetadata:\n  name: [ci\n"),
    );
    let err = lab.fails(&["apply", "-f", &broken]);
    let from = CLASS_AND_POOL.lines().count() + 2;
    assert!(
        err.contains(&format!(
            "{broken}: document 3 (from line {from}) does not parse"
        )),
        "{err}"
    );
    for (doc, want) in [
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            "document 1 (ConfigMap x): unknown kind \"ConfigMap\"",
        ),
        (
            "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1\nkind: VirtualTargetClass\nmetadata: {name: x, namespace: lab}\nspec: {provisioner: local}\n",
            "its namespace \"lab\" does not match the namespace \"default\"",
        ),
        (
            "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1\nkind: VirtualTargetClass\nmetadata: {name: x}\nspec: {provisioner: local, colour: red}\n",
            "unknown field \"spec.colour\"",
        ),
    ] {
        let f = lab.write("one.yaml", doc);
        let err = lab.fails(&["apply", "-n", "default", "-f", &f]);
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    assert!(lab.names("virtualtargetclasses").is_empty());

    // The good documents alone apply; the client's token is where the note says.
    let good = lab.write("good.yaml", &format!("{CLASS_AND_POOL}---\n{client}"));
    let (out, err) = lab.ok(&["apply", "-f", &good], None);
    assert!(
        out.ends_with("client.jumpstarter.dev/ci created\n"),
        "{out}"
    );
    assert!(
        err.contains("client.jumpstarter.dev/ci: a token was issued")
            && err.contains("`jmp admin import client ci -n default`"),
        "{err}"
    );
    let config = lab.home().join("ci.yaml").display().to_string();
    lab.ok(&["import", "client", "ci", "--out", &config], None);
    assert!(std::fs::read_to_string(&config).unwrap().contains("token:"));
}
