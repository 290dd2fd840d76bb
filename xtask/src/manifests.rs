//! `cargo xtask manifests [--cluster]`: the kustomize manifests of `deploy/kubernetes` as a
//! cluster takes them.
//!
//! Offline (about a second once its venv exists; `cargo xtask ci` runs it): the base and
//! every overlay under `overlays/` rendered with `kubectl kustomize`, then checked by
//! `manifests_validate.py` with PyPI's `kubernetes-validate` (pinned, [`REQUIREMENTS`], in a
//! venv cached with the others): every object against the strict OpenAPI schemas (an unknown
//! field is an error, and so is a kind without a schema) of each Kubernetes minor release
//! from the oldest that docs/kubernetes.md supports to the newest the tool knows
//! ([`K8S_VERSIONS`]); custom resources (a sample of each of our kinds, [`SAMPLES`], and any
//! an overlay adds) against our CRDs' schemas made strict (the tool has no CRD support; the
//! CEL rules are left to the server); and rules the schemas cannot express (no metrics on a
//! NodePort, no cleartext `appProtocol` on a TLS port, named ports that exist).
//!
//! `--cluster` (and `cargo xtask kube-e2e`, on its real API server: [`against_cluster`]):
//! every target and the samples through `kubectl apply --dry-run=server --validate=strict`,
//! then the base and the overlays applied for real; then, with a token of the controller's
//! ServiceAccount (`kubectl create token`, no admin credentials), what the controller does
//! with the API ([`CONTROLLER_USES`]) checked with `kubectl auth can-i` (a missing permission
//! fails, named) and done for real once (create, get, list, watch, update, status update,
//! delete of a Client; a credential Secret with an owner reference; a coordination Lease; an
//! Event; the ConfigMap). What it applied beyond what `kube-up` installs (Deployments,
//! Services, ConfigMap) and the objects the checks made are deleted again, so the suites
//! after it see the cluster as before.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::{interop::tempfile_dir::Dir, kube};

/// PyPI's `kubernetes-validate` and its dependencies, pinned.
pub const REQUIREMENTS: &[&str] = &[
    "kubernetes-validate==1.37.0",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "attrs==26.1.0",
    "importlib_resources==7.1.0",
    "packaging==26.4",
    "PyYAML==6.0.4",
    "typing_extensions==4.16.0",
];

/// Every minor release from the oldest docs/kubernetes.md supports (1.29: CEL validation
/// rules GA) to the newest `kubernetes-validate` 1.37.0 has schemas for; 1.34 is the API
/// server `kube-e2e` runs.
pub const K8S_VERSIONS: &[&str] = &[
    "1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0",
];

const VALIDATE: &str = include_str!("manifests_validate.py");

/// One object of each of our kinds, as a user or upstream's tools would write them: checked
/// offline against the CRDs and by the server (dry run) in namespace `jumpstarter`.
pub const SAMPLES: &str = "\
apiVersion: jumpstarter.dev/v1alpha1
kind: Client
metadata:
  name: sample-client
spec:
  username: internal:sample
---
apiVersion: jumpstarter.dev/v1alpha1
kind: Exporter
metadata:
  name: sample-exporter
  labels:
    board: rpi4
spec:
  enabled: true
---
apiVersion: jumpstarter.dev/v1alpha1
kind: Lease
metadata:
  name: sample-lease
spec:
  clientRef:
    name: sample-client
  selector:
    matchLabels:
      board: rpi4
  duration: 30m
  tags:
    ci-job: '42'
---
apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterAccessPolicy
metadata:
  name: sample-policy
spec:
  exporterSelector:
    matchLabels:
      board: rpi4
  policies:
    - priority: 10
      maximumDuration: 2h
      from:
        - clientSelector:
            matchLabels:
              team: qa
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata:
  name: sample-class
spec:
  provisioner: qemu.jumpstarter.dev
  scheduling:
    resources:
      limits:
        cpu: 2
        memory: 4Gi
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: sample-pool
spec:
  virtualTargetClassName: sample-class
  maxReplicas: 3
  minAvailableReplicas: 1
  selector:
    matchLabels:
      pool: sample
  template:
    metadata:
      labels:
        pool: sample
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
";

/// What jumpstarter-controller does with the API, read from its code: every kind it keeps is
/// read, listed, watched, created, updated (PUT) and deleted through `store/kubernetes.rs`,
/// and its status updated; owner references with `blockOwnerDeletion` on Clients and
/// Exporters (`kubernetes/owner_refs.rs`, credential Secrets); Secrets read, created and
/// updated by name (`store/credentials.rs`, `kubernetes/key_secret.rs`); the ConfigMap read
/// (`kubernetes/cluster_config.rs`); the leader Lease read, created and renewed
/// (`kubernetes/leader.rs`); Events created (`kubernetes/events.rs`).
pub const CONTROLLER_USES: &[(&str, &[&str])] = &[
    (
        "clients.jumpstarter.dev",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    (
        "exporters.jumpstarter.dev",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    (
        "leases.jumpstarter.dev",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    (
        "exporteraccesspolicies.jumpstarter.dev",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    (
        "exportersets.virtualtarget.jumpstarter.dev",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    (
        "virtualtargetclasses.virtualtarget.jumpstarter.dev",
        &["get", "list", "watch", "create", "update", "delete"],
    ),
    ("clients.jumpstarter.dev/status", &["update"]),
    ("exporters.jumpstarter.dev/status", &["update"]),
    ("leases.jumpstarter.dev/status", &["update"]),
    ("exporteraccesspolicies.jumpstarter.dev/status", &["update"]),
    (
        "exportersets.virtualtarget.jumpstarter.dev/status",
        &["update"],
    ),
    ("clients.jumpstarter.dev/finalizers", &["update"]),
    ("exporters.jumpstarter.dev/finalizers", &["update"]),
    (
        "exportersets.virtualtarget.jumpstarter.dev/finalizers",
        &["update"],
    ),
    ("secrets", &["get", "create", "update", "delete"]),
    // The replica Pods of the qemu.jumpstarter.dev pool provisioner.
    ("pods", &["get", "list", "watch", "create", "delete"]),
    ("configmaps", &["get"]),
    ("leases.coordination.k8s.io", &["get", "create", "update"]),
    ("events", &["create"]),
];

/// The kinds the controller lists and watches in every namespace at once (its object views
/// and the reconcile pass use `Api::all`).
const CLUSTER_WIDE: &[&str] = &[
    "clients.jumpstarter.dev",
    "exporters.jumpstarter.dev",
    "leases.jumpstarter.dev",
    "exporteraccesspolicies.jumpstarter.dev",
    "exportersets.virtualtarget.jumpstarter.dev",
    "virtualtargetclasses.virtualtarget.jumpstarter.dev",
];

/// Where the controller's ServiceAccount lives and what the RBAC check names its objects.
const SERVICE_ACCOUNT: &str = "jumpstarter-controller";
const CHECK_NAME: &str = "manifests-check";

/// `cargo xtask manifests [--cluster]`.
pub fn run(args: &[String]) -> Result<()> {
    let cluster = match args {
        [] => false,
        [a] if a == "--cluster" => true,
        _ => bail!("usage: cargo xtask manifests [--cluster]"),
    };
    if cluster {
        kube::running()?;
    }
    offline()?;
    if cluster {
        against_cluster()?;
    }
    Ok(())
}

/// The venv with `kubernetes-validate` (created once).
pub fn venv() -> Result<PathBuf> {
    crate::interop::venv_with("manifests-venv", REQUIREMENTS)
}

fn deploy_dir() -> PathBuf {
    crate::workspace_root().join("deploy/kubernetes")
}

/// The kustomize targets: `base`, then every `overlays/NAME` that has a kustomization, by
/// name.
fn targets() -> Result<Vec<(String, PathBuf)>> {
    let root = deploy_dir();
    let mut out = vec![("base".to_owned(), root.join("base"))];
    let overlays = root.join("overlays");
    let mut names = Vec::new();
    for entry in
        std::fs::read_dir(&overlays).with_context(|| format!("reading {}", overlays.display()))?
    {
        let path = entry?.path();
        if path.join("kustomization.yaml").is_file() {
            let name = path
                .file_name()
                .context("an overlay without a name")?
                .to_string_lossy()
                .into_owned();
            names.push((format!("overlays/{name}"), path));
        }
    }
    names.sort();
    out.extend(names);
    Ok(out)
}

/// The rendered targets and the samples, as files.
struct Rendered {
    /// (target, file), `base` first.
    targets: Vec<(String, PathBuf)>,
    samples: PathBuf,
}

/// `kubectl ARGS` with no cluster configuration (kustomize needs none); returns stdout.
fn kubectl_local(args: &[&str]) -> Result<String> {
    let out = Command::new("timeout")
        .arg("60")
        .arg("kubectl")
        .args(args)
        .env("KUBECONFIG", "/dev/null")
        .stdin(Stdio::null())
        .output()
        .context(
            "running kubectl (it must be on PATH; `kubectl kustomize` renders the manifests)",
        )?;
    ensure!(
        out.status.success(),
        "kubectl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Renders every target into `dir` (`base.yaml`, `overlays-NAME.yaml`) and writes the
/// samples beside them.
fn render(dir: &Path) -> Result<Rendered> {
    let mut rendered = Vec::new();
    for (name, path) in targets()? {
        let text = kubectl_local(&["kustomize", &path.display().to_string()])
            .with_context(|| format!("rendering deploy/kubernetes/{name}"))?;
        let file = dir.join(format!("{}.yaml", name.replace('/', "-")));
        std::fs::write(&file, text)?;
        rendered.push((name, file));
    }
    let samples = dir.join("samples.yaml");
    std::fs::write(&samples, SAMPLES)?;
    Ok(Rendered {
        targets: rendered,
        samples,
    })
}

/// The offline part: every target and the samples validated strictly, for every version.
pub fn offline() -> Result<()> {
    let started = Instant::now();
    let venv = venv()?;
    let work = Dir::new("jumpstarter-manifests")?;
    let r = render(work.path())?;
    println!(
        "== manifests: {} and the samples of our kinds, strict schemas of Kubernetes {}",
        r.targets
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        K8S_VERSIONS.join(", ")
    );
    let files: Vec<String> = r
        .targets
        .iter()
        .map(|(_, f)| f)
        .chain([&r.samples])
        .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let out = Command::new("timeout")
        .arg("300")
        .arg(venv.join("bin/python"))
        .arg("-c")
        .arg(VALIDATE)
        .arg(K8S_VERSIONS.join(","))
        .args(&files)
        .current_dir(work.path())
        .stdin(Stdio::null())
        .output()
        .context("running the validator in the venv")?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    ensure!(
        out.status.success(),
        "the manifests of deploy/kubernetes do not validate ({}; errors above)",
        out.status
    );
    println!(
        "== manifests: valid ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The objects [`against_cluster`] created that `kube-up` does not install; deleted when
/// dropped.
#[derive(Default)]
struct Created {
    /// `kubectl` names (`deployment.apps/NAME`), in namespace `jumpstarter`.
    names: Vec<String>,
}

impl Created {
    /// What `kube-up` installs from the same files: kept.
    const KEPT: &[&str] = &[
        "namespace/",
        "customresourcedefinition.apiextensions.k8s.io/",
        "serviceaccount/",
        "clusterrole.rbac.authorization.k8s.io/",
        "clusterrolebinding.rbac.authorization.k8s.io/",
    ];

    fn add(&mut self, kubectl_names: &str) {
        for n in kubectl_names.lines().map(str::trim) {
            if !n.is_empty()
                && !Self::KEPT.iter().any(|k| n.starts_with(k))
                && !self.names.iter().any(|m| m == n)
            {
                self.names.push(n.to_owned());
            }
        }
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.names.is_empty() {
            return;
        }
        let mut args = vec![
            "delete",
            "-n",
            kube::NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
            "--request-timeout=30s",
        ];
        args.extend(self.names.iter().map(String::as_str));
        if let Err(e) = kube::kubectl(&args) {
            eprintln!("manifests: cleaning up: {e:#}");
        }
    }
}

/// The part against the running `kube-up` API server: dry run, apply, the controller's RBAC
/// as its ServiceAccount.
pub fn against_cluster() -> Result<()> {
    let started = Instant::now();
    let work = Dir::new("jumpstarter-manifests")?;
    let r = render(work.path())?;
    for (name, file) in &r.targets {
        kube::kubectl(&[
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "--request-timeout=30s",
            "-f",
            &file.display().to_string(),
        ])
        .with_context(|| format!("kubectl apply --dry-run=server -k deploy/kubernetes/{name}"))?;
    }
    kube::kubectl(&[
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "--request-timeout=30s",
        "-n",
        kube::NAMESPACE,
        "-f",
        &r.samples.display().to_string(),
    ])
    .context("kubectl apply --dry-run=server of the samples of our kinds")?;
    println!(
        "   server-side dry run (strict field validation): {}, samples: ok",
        r.targets
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut created = Created::default();
    for (name, file) in &r.targets {
        let out = kube::kubectl(&[
            "apply",
            "--validate=strict",
            "--request-timeout=30s",
            "-o",
            "name",
            "-f",
            &file.display().to_string(),
        ]);
        // Recorded before the error is looked at: a partial apply is cleaned up too.
        if let Ok(names) = &out {
            created.add(names);
        }
        let names = out.with_context(|| format!("kubectl apply -k deploy/kubernetes/{name}"))?;
        println!("   applied {name}: {} objects", names.lines().count());
    }
    rbac_as_controller(work.path())?;
    drop(created);
    println!(
        "== manifests against the API server: ok ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `kubectl` authenticated as the controller's ServiceAccount only (its own kubeconfig, no
/// admin credentials anywhere).
struct AsController {
    kubeconfig: PathBuf,
}

impl AsController {
    fn output(&self, args: &[&str], input: Option<&str>) -> Result<Output> {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg("--request-timeout=30s")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl")?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// Runs `kubectl ARGS` (with `input` on stdin); `what` names the permission it needs.
    fn run(&self, what: &str, args: &[&str], input: Option<&str>) -> Result<String> {
        let out = self.output(args, input)?;
        ensure!(
            out.status.success(),
            "the controller's ServiceAccount cannot {what}: kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl auth can-i VERB RESOURCE ...`: yes or no.
    fn can_i(&self, args: &[&str]) -> Result<bool> {
        let out = self.output(&[&["auth", "can-i"], args].concat(), None)?;
        match String::from_utf8_lossy(&out.stdout).trim() {
            "yes" => Ok(true),
            "no" => Ok(false),
            other => bail!(
                "kubectl auth can-i {}: {other:?} {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }
}

/// The rules of `kubectl auth can-i --list`: (resource, verbs) of every line that names a
/// resource and no resource names (a rule limited to names grants nothing in general).
fn parse_can_i_list(text: &str) -> Vec<(String, Vec<String>)> {
    let mut rules = Vec::new();
    for line in text.lines().skip(1) {
        if line.starts_with(char::is_whitespace) {
            continue; // a non-resource URL
        }
        let Some((resource, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let groups: Vec<&str> = rest
            .split(']')
            .filter_map(|g| g.split_once('[').map(|(_, inner)| inner.trim()))
            .collect();
        if let [_urls, names, verbs] = groups[..]
            && names.is_empty()
        {
            rules.push((
                resource.to_owned(),
                verbs.split_whitespace().map(str::to_owned).collect(),
            ));
        }
    }
    rules
}

/// Whether `rules` let `verb` on `resource` (`NAME.GROUP[/SUB]`, wildcards as RBAC has them).
fn allows(rules: &[(String, Vec<String>)], resource: &str, verb: &str) -> bool {
    rules.iter().any(|(r, verbs)| {
        (r == resource || r == "*.*" || r == "*") && verbs.iter().any(|v| v == verb || v == "*")
    })
}

/// What the controller does, with a token of its ServiceAccount: `can-i` for every
/// permission of [`CONTROLLER_USES`] (in its namespace and another) and [`CLUSTER_WIDE`],
/// then each kind of call once for real.
fn rbac_as_controller(work: &Path) -> Result<()> {
    let token = kube::kubectl(&[
        "create",
        "token",
        SERVICE_ACCOUNT,
        "-n",
        kube::NAMESPACE,
        "--duration=10m",
        "--request-timeout=30s",
    ])
    .context("kubectl create token for the controller's ServiceAccount")?;
    let token = token.trim();
    ensure!(!token.is_empty(), "kubectl create token printed nothing");
    let kubeconfig = work.join("controller-token.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    \
             user: sa\n    namespace: {}\ncurrent-context: c\nusers:\n- name: sa\n  user:\n    \
             token: {token}\n",
            kube::issuer()?,
            kube::state_dir().join("ca.crt").display(),
            kube::NAMESPACE
        ),
    )?;
    let sa = AsController { kubeconfig };
    let who = sa.run(
        "say who it is",
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
        None,
    )?;
    let expected = format!(
        "system:serviceaccount:{}:{SERVICE_ACCOUNT}",
        kube::NAMESPACE
    );
    ensure!(
        who.trim() == expected,
        "the token authenticates as {who:?}, not {expected}"
    );

    let mut missing = Vec::new();
    let mut unused = Vec::new();
    for ns in [kube::NAMESPACE, "default"] {
        let list = sa.run(
            "list its permissions",
            &["auth", "can-i", "--list", "-n", ns],
            None,
        )?;
        let rules = parse_can_i_list(&list);
        for (resource, verbs) in CONTROLLER_USES {
            for verb in *verbs {
                if !allows(&rules, resource, verb) {
                    missing.push(format!("{verb} {resource} (namespace {ns})"));
                }
            }
        }
        if ns == kube::NAMESPACE {
            for (resource, verbs) in &rules {
                let used = CONTROLLER_USES.iter().find(|(r, _)| r == resource);
                let ours = used.is_some()
                    || resource.ends_with(".jumpstarter.dev")
                    || resource.contains(".jumpstarter.dev/");
                if !ours {
                    continue;
                }
                for v in verbs {
                    if !used.is_some_and(|(_, u)| u.contains(&v.as_str())) {
                        unused.push(format!("{v} {resource}"));
                    }
                }
            }
        }
    }
    for resource in CLUSTER_WIDE {
        for verb in ["list", "watch"] {
            if !sa.can_i(&[verb, resource, "--all-namespaces"])? {
                missing.push(format!("{verb} {resource} (all namespaces)"));
            }
        }
    }
    ensure!(
        missing.is_empty(),
        "the controller's ServiceAccount ({expected}) lacks what the controller does: {}",
        missing.join(", ")
    );
    println!(
        "   as {expected}: can-i, all {} permissions the controller uses: yes",
        CONTROLLER_USES.iter().map(|(_, v)| v.len()).sum::<usize>() + 2 * CLUSTER_WIDE.len()
    );
    if !unused.is_empty() {
        println!(
            "   granted, not used by the controller's code: {}",
            unused.join(", ")
        );
    }

    let cleanup = CheckObjects;
    calls_as_controller(&sa)?;
    drop(cleanup);
    println!(
        "   as {expected}: create, get, list (all namespaces), watch, update, status update and \
         delete of a Client; create, get and update of a Secret owned by it, of a \
         coordination Lease; create of an Event; get of the ConfigMap: ok"
    );
    Ok(())
}

/// The objects the calls make, deleted (as the admin) when dropped.
struct CheckObjects;

impl Drop for CheckObjects {
    fn drop(&mut self) {
        let secret = format!("secret/{CHECK_NAME}-client");
        let lease = format!("leases.coordination.k8s.io/{CHECK_NAME}");
        let event = format!("event/{CHECK_NAME}.1");
        let client = format!("clients.jumpstarter.dev/{CHECK_NAME}");
        if let Err(e) = kube::kubectl(&[
            "delete",
            "-n",
            kube::NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
            "--request-timeout=30s",
            &secret,
            &lease,
            &event,
            &client,
        ]) {
            eprintln!("manifests: cleaning up: {e:#}");
        }
    }
}

fn json_of(text: &str) -> Result<Value> {
    serde_json::from_str(text).context("kubectl printed no JSON")
}

/// Each kind of call the controller makes, once, as its ServiceAccount.
fn calls_as_controller(sa: &AsController) -> Result<()> {
    let ns = kube::NAMESPACE;
    let client = json!({
        "apiVersion": "jumpstarter.dev/v1alpha1",
        "kind": "Client",
        "metadata": {"name": CHECK_NAME, "namespace": ns},
        "spec": {"username": format!("internal:{CHECK_NAME}")},
    });
    let created = json_of(&sa.run(
        "create clients.jumpstarter.dev",
        &["create", "-o", "json", "-f", "-"],
        Some(&client.to_string()),
    )?)?;
    let uid = created["metadata"]["uid"]
        .as_str()
        .context("the created Client has no uid")?
        .to_owned();
    let mut got = json_of(&sa.run(
        "get clients.jumpstarter.dev",
        &["get", "clients.jumpstarter.dev", CHECK_NAME, "-o", "json"],
        None,
    )?)?;
    sa.run(
        "list clients.jumpstarter.dev in all namespaces",
        &[
            "get",
            "clients.jumpstarter.dev",
            "--all-namespaces",
            "-o",
            "name",
        ],
        None,
    )?;
    sa.run(
        "watch clients.jumpstarter.dev in all namespaces",
        &[
            "get",
            "--raw",
            "/apis/jumpstarter.dev/v1alpha1/clients?watch=1&timeoutSeconds=1",
        ],
        None,
    )?;
    got["metadata"]["labels"] = json!({"jumpstarter.dev/manifests-check": "updated"});
    let mut updated = json_of(&sa.run(
        "update clients.jumpstarter.dev",
        &["replace", "-o", "json", "-f", "-"],
        Some(&got.to_string()),
    )?)?;
    updated["status"] = json!({"endpoint": "manifests-check.invalid:8082"});
    sa.run(
        "update clients.jumpstarter.dev/status",
        &["replace", "--subresource=status", "-o", "name", "-f", "-"],
        Some(&updated.to_string()),
    )?;

    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("{CHECK_NAME}-client"),
            "namespace": ns,
            "ownerReferences": [{
                "apiVersion": "jumpstarter.dev/v1alpha1",
                "kind": "Client",
                "name": CHECK_NAME,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "type": "Opaque",
        "stringData": {"token": "first"},
    });
    sa.run(
        "create secrets (with an owner reference)",
        &["create", "-o", "name", "-f", "-"],
        Some(&secret.to_string()),
    )?;
    let mut s = json_of(&sa.run(
        "get secrets",
        &[
            "get",
            "secret",
            &format!("{CHECK_NAME}-client"),
            "-o",
            "json",
        ],
        None,
    )?)?;
    s["data"] = json!({"token": "c2Vjb25k"});
    sa.run(
        "update secrets",
        &["replace", "-o", "name", "-f", "-"],
        Some(&s.to_string()),
    )?;

    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": CHECK_NAME, "namespace": ns},
        "spec": {"holderIdentity": "first", "leaseDurationSeconds": 15},
    });
    sa.run(
        "create leases.coordination.k8s.io",
        &["create", "-o", "name", "-f", "-"],
        Some(&lease.to_string()),
    )?;
    let mut l = json_of(&sa.run(
        "get leases.coordination.k8s.io",
        &[
            "get",
            "leases.coordination.k8s.io",
            CHECK_NAME,
            "-o",
            "json",
        ],
        None,
    )?)?;
    l["spec"]["holderIdentity"] = json!("second");
    sa.run(
        "update leases.coordination.k8s.io",
        &["replace", "-o", "name", "-f", "-"],
        Some(&l.to_string()),
    )?;

    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": format!("{CHECK_NAME}.1"), "namespace": ns},
        "involvedObject": {
            "apiVersion": "jumpstarter.dev/v1alpha1",
            "kind": "Client",
            "name": CHECK_NAME,
            "namespace": ns,
            "uid": uid,
        },
        "reason": "ManifestsCheck",
        "message": "the controller's ServiceAccount can post events",
        "type": "Normal",
        "source": {"component": "jumpstarter-controller"},
    });
    sa.run(
        "create events",
        &["create", "-o", "name", "-f", "-"],
        Some(&event.to_string()),
    )?;
    sa.run(
        "get configmaps",
        &["get", "configmap", "jumpstarter-controller", "-o", "name"],
        None,
    )?;
    sa.run(
        "delete clients.jumpstarter.dev",
        &[
            "delete",
            "clients.jumpstarter.dev",
            CHECK_NAME,
            "--wait=false",
        ],
        None,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn can_i_list_is_read_as_rules() {
        let text = "\
Resources                                       Non-Resource URLs   Resource Names   Verbs
clients.jumpstarter.dev/status                  []                  []               [update]
secrets                                         []                  []               [get create update delete]
configmaps                                      []                  [only-this]      [get]
                                                [/api/*]            []               [get]
*.*                                             []                  []               [*]
";
        let rules = parse_can_i_list(text);
        assert_eq!(rules.len(), 3, "{rules:?}");
        assert!(allows(&rules[..2], "secrets", "delete"));
        assert!(!allows(&rules[..2], "secrets", "list"));
        assert!(!allows(&rules[..2], "configmaps", "get"));
        assert!(allows(&rules, "configmaps", "list"));
        assert!(allows(
            &rules[..1],
            "clients.jumpstarter.dev/status",
            "update"
        ));
    }

    #[test]
    fn every_target_is_found() -> Result<()> {
        let t = targets()?;
        assert_eq!(t[0].0, "base");
        assert!(t.iter().any(|(n, _)| n == "overlays/kind"), "{t:?}");
        Ok(())
    }
}
