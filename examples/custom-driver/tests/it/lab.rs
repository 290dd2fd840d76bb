//! A lab for the tests: an in-process controller (with its router) on loopback, objects and
//! configs for exporters and clients, and the example's binaries run with a clean
//! environment (killed when dropped).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use jumpstarter_controller::{
    ControllerConfig, RunningController,
    objects::{Client, ClientSpec, Exporter, ExporterSpec, ExporterStatusValue},
    start,
    store::Store,
};
use jumpstarter_core::{
    auth::{ObjectKind, Subject},
    config::encode_ca,
};
use tokio::process::{Child, Command};

pub(crate) struct Lab {
    ctl: Option<RunningController>,
    dir: tempfile::TempDir,
}

impl Lab {
    /// A scratch directory and a controller on loopback ports chosen by the OS.
    pub(crate) async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ctl = start(ControllerConfig {
            listen: "127.0.0.1:0".into(),
            router_listen: "127.0.0.1:0".into(),
            advertise_host: "localhost".into(),
            ..ControllerConfig::new(dir.path().join("data"))
        })
        .await
        .unwrap();
        Self {
            ctl: Some(ctl),
            dir,
        }
    }

    /// A scratch directory only.
    pub(crate) fn bare() -> Self {
        Self {
            ctl: None,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn ctl(&self) -> &RunningController {
        self.ctl.as_ref().expect("this lab has no controller")
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn token(&self, kind: ObjectKind, name: &str, uid: String) -> String {
        self.ctl()
            .state
            .auth
            .issuer
            .issue(&Subject::new(kind, "default", name, uid))
            .unwrap()
            .token
    }

    fn common_yaml(&self, kind: &str, name: &str, token: &str) -> String {
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: {kind}\nmetadata:\n  namespace: default\n  \
             name: {name}\nendpoint: \"localhost:{port}\"\ntoken: \"{token}\"\ntls:\n  ca: \"{ca}\"\n  \
             insecure: false\n",
            port = self.ctl().addr.port(),
            ca = encode_ca(&self.ctl().ca_pem),
        )
    }

    /// Creates the Exporter object labelled `board=BOARD` and writes its config with
    /// `export` (an `export:` mapping).
    pub(crate) async fn exporter(&self, name: &str, board: &str, export: &str) -> PathBuf {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e.metadata.labels = Some([("board".to_string(), board.to_string())].into());
        let e = self.ctl().state.store.create(&e).await.unwrap();
        let token = self.token(ObjectKind::Exporter, name, e.metadata.uid.unwrap());
        let yaml = self.common_yaml("ExporterConfig", name, &token) + export;
        self.write(&format!("{name}.exporter.yaml"), &yaml)
    }

    /// Creates the Client object (allowed every driver) and writes its config.
    pub(crate) async fn client(&self, name: &str) -> PathBuf {
        let mut c = Client::new(name, ClientSpec::default());
        c.metadata.namespace = Some("default".into());
        let c = self.ctl().state.store.create(&c).await.unwrap();
        let token = self.token(ObjectKind::Client, name, c.metadata.uid.unwrap());
        let yaml = self.common_yaml("ClientConfig", name, &token)
            + "drivers:\n  allow: []\n  unsafe: true\n";
        self.write(&format!("{name}.client.yaml"), &yaml)
    }

    /// A command with a clean environment and the example's binaries first on `PATH`;
    /// killed when its `Child` is dropped.
    pub(crate) fn cmd(&self, bin: &str) -> Command {
        let bin_dir = Path::new(bin).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new(bin);
        c.current_dir(self.dir.path())
            .env("PATH", path)
            .env("JMP_CLIENT_CONFIG_HOME", self.path("config"))
            .env("XDG_CONFIG_HOME", self.dir.path())
            .env("XDG_RUNTIME_DIR", self.dir.path())
            .env("TMPDIR", self.dir.path())
            .env_remove("JMP_LOG")
            .env_remove("JUMPSTARTER_HOST")
            .env_remove("JMP_LEASE")
            .env_remove("JMP_NAME")
            .env_remove("JMP_GRPC_INSECURE")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Starts `bin args...` in the background, its stderr appended to `log`.
    pub(crate) fn run(&self, bin: &str, args: &[&str], log: &str) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(log))
            .unwrap();
        self.cmd(bin)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    pub(crate) fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// Waits (bounded) until the exporter `name` reports `want`.
    pub(crate) async fn wait_status(&self, name: &str, want: ExporterStatusValue, log: &str) {
        for _ in 0..300 {
            let e: Option<Exporter> = self.ctl().state.store.get("default", name).await.unwrap();
            if e.and_then(|e| e.status).and_then(|s| s.exporter_status) == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "exporter {name} never reached {want:?}; log:\n{}",
            self.log(log)
        );
    }
}

/// Waits (bounded) for `child` to exit; its exit code, stdout and stderr.
pub(crate) async fn finish(child: Child) -> (i32, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the process did not finish in time")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
