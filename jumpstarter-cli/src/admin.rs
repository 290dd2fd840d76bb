//! `jmp admin`: create, list, delete and re-credential clients and exporters on a controller
//! through its `AdminService`, and write the config files they need.
//!
//! Upstream manages these objects through Kubernetes; ours talks to the controller with the
//! admin config the controller writes on start (`$JMP_ADMIN_CONFIG`, else
//! `CONFIG_DIR/admin.yaml`). Saved configs carry the controller's CA, so they work without
//! `--insecure-tls`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use jiff::Timestamp;
use jumpstarter_core::config::{
    ClientConfig, DriversConfig, ExporterConfig, ObjectMeta, SYSTEM_EXPORTER_DIR, TlsConfig,
    UserConfig, config_dir, encode_ca, write_private,
};
use jumpstarter_proto::admin_v1::{
    Client, CreateClientRequest, CreateExporterRequest, Credentials, Exporter, ListRequest,
    ObjectRef,
};
use serde::Serialize;

use crate::{
    output::{OutputMode, Table, format_age, labels_text, print_structured, yes_no},
    resources::{rpc_error, status_name},
    values::parse_key_values,
};

const OUTPUT_HELP: &str = "Output mode. Use \"-o name\" for shorter output (resource/name).";
const NOT_OFFERED: &str = "not offered: manage Kubernetes clusters with your own tools \
    (kind, minikube, k3s...); this controller runs without Kubernetes (`jumpstarter-controller`)";

pub(crate) use crate::admin_api::AdminApi;
pub use crate::admin_api::{AdminConnect, KubeFlags};

/// `jmp admin`.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Create Jumpstarter objects
    #[command(subcommand, alias = "c")]
    Create(AdminCreate),
    /// Delete Jumpstarter objects
    #[command(subcommand, alias = "del", alias = "d")]
    Delete(AdminDelete),
    /// Get Jumpstarter objects
    #[command(subcommand, alias = "g")]
    Get(AdminGet),
    /// Write a config for an existing client or exporter (with a freshly issued token)
    #[command(subcommand, alias = "i")]
    Import(AdminImport),
    /// Rotate credentials for Jumpstarter objects
    #[command(subcommand)]
    Rotate(AdminRotate),
    /// End an exporter's quarantine (ours): lease it again after its health check or hooks
    /// failed too often in a row
    #[command(subcommand)]
    ClearHealth(AdminClearHealth),
    /// Print a lease's gathered log (ours): the controller's events and the exporter's
    /// driver calls and driver lines, oldest first
    Logs(AdminLogsArgs),
    /// Create or update objects from upstream-format YAML/JSON files (ours, as kubectl
    /// apply): clients, exporters, access policies, exporter sets, virtual target classes
    Apply(crate::admin_pools::ApplyArgs),
    /// Show the details of an exporter set or virtual target class (ours)
    #[command(subcommand)]
    Describe(crate::admin_pools::AdminDescribe),
    /// Get the current Jumpstarter version
    #[command(alias = "ver", alias = "v")]
    Version(crate::config_cmd::VersionArgs),
}

/// `jmp admin logs --lease NAME`.
#[derive(Args, Debug)]
pub struct AdminLogsArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// The lease
    #[arg(long, value_name = "NAME")]
    lease: String,
    #[command(flatten)]
    kube: KubeFlags,
    /// Output: text (default) or json (one object a line)
    #[arg(short, long, value_parser = ["text", "json"])]
    output: Option<String>,
    /// The lease's console transcripts instead of its other entries
    #[arg(long)]
    console: bool,
}

async fn admin_logs(a: AdminLogsArgs) -> Result<i32> {
    let format = crate::lease_logs::LogFormat::from_flag(a.output.as_deref())?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let logs = api
        .rpc
        .get_lease_logs(ObjectRef {
            namespace: a.kube.namespace()?,
            name: a.lease.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("cannot get the logs of lease {:?}", a.lease), s))?
        .into_inner();
    if a.console {
        crate::lease_logs::print_console(&logs, format)?;
    } else {
        crate::lease_logs::print(&logs, format)?;
    }
    Ok(0)
}

/// `jmp admin create`.
#[derive(Subcommand, Debug)]
pub enum AdminCreate {
    /// Create a client object on the controller
    #[command(alias = "clients", alias = "c")]
    Client(CreateArgs<ClientOnly>),
    /// Create an exporter object on the controller
    #[command(alias = "exporters", alias = "e")]
    Exporter(CreateArgs<ExporterOnly>),
    /// Not offered: create Kubernetes clusters with your own tools
    #[command(alias = "clusters")]
    Cluster(Box<CreateClusterArgs>),
}

/// `jmp admin create cluster`: upstream's flags, accepted so that the command can explain
/// that it is not offered here (instead of failing on the first flag).
#[derive(Args, Debug)]
#[allow(
    dead_code,
    reason = "accepted for upstream compatibility; the command is not offered"
)]
pub struct CreateClusterArgs {
    /// Name of the cluster
    name: Option<String>,
    /// Create a local Kind cluster
    #[arg(long, value_name = "TEXT")]
    kind: Option<String>,
    /// Create a local Minikube cluster
    #[arg(long, value_name = "TEXT")]
    minikube: Option<String>,
    /// Create a k3s cluster on a remote host via SSH (e.g., --k3s user@host)
    #[arg(long, value_name = "TEXT")]
    k3s: Option<String>,
    /// Force recreate the cluster if it already exists
    #[arg(long)]
    force_recreate: bool,
    /// Extra arguments for the Kind cluster creation
    #[arg(long, value_name = "TEXT")]
    kind_extra_args: Option<String>,
    /// Extra arguments for the Minikube cluster creation
    #[arg(long, value_name = "TEXT")]
    minikube_extra_args: Option<String>,
    /// Path to custom CA certificate bundle file to inject into the cluster
    #[arg(long, value_name = "FILE")]
    extra_certs: Option<PathBuf>,
    /// Skip installing Jumpstarter after creating the cluster
    #[arg(long)]
    skip_install: bool,
    /// Path or URL to the operator installer YAML
    #[arg(long, value_name = "TEXT")]
    operator_installer: Option<String>,
    /// Namespace to install Jumpstarter components in
    #[arg(short = 'n', long, value_name = "TEXT")]
    namespace: Option<String>,
    /// IP address of your host machine
    #[arg(short = 'i', long, value_name = "TEXT")]
    ip: Option<String>,
    /// Base domain of the Jumpstarter service
    #[arg(short = 'b', long, value_name = "TEXT")]
    basedomain: Option<String>,
    /// The gRPC endpoint to use for the Jumpstarter API
    #[arg(short = 'g', long, value_name = "TEXT")]
    grpc_endpoint: Option<String>,
    /// The gRPC endpoint to use for the router
    #[arg(short = 'r', long, value_name = "TEXT")]
    router_endpoint: Option<String>,
    /// The version of the service to install
    #[arg(short = 'v', long, value_name = "TEXT")]
    version: Option<String>,
    /// path to the kubeconfig file
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Kubernetes context to use
    #[arg(long, value_name = "TEXT")]
    context: Option<String>,
    /// Disable interactive prompts (for use in scripts).
    #[arg(long)]
    nointeractive: bool,
    #[arg(short, long, value_parser = ["json", "yaml", "name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// `jmp admin delete cluster`: upstream's flags, accepted to explain it is not offered.
#[derive(Args, Debug)]
#[allow(
    dead_code,
    reason = "accepted for upstream compatibility; the command is not offered"
)]
pub struct DeleteClusterArgs {
    /// Name of the cluster
    name: Option<String>,
    /// Delete a local Kind cluster
    #[arg(long, value_name = "TEXT")]
    kind: Option<String>,
    /// Delete a local Minikube cluster
    #[arg(long, value_name = "TEXT")]
    minikube: Option<String>,
    /// Skip confirmation prompt and force deletion
    #[arg(long)]
    force: bool,
    #[arg(short, long, value_parser = ["name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// `jmp admin get cluster|clusters`: upstream's flags, accepted to explain it is not offered.
#[derive(Args, Debug)]
#[allow(
    dead_code,
    reason = "accepted for upstream compatibility; the command is not offered"
)]
pub struct GetClusterArgs {
    /// Name of the cluster
    name: Option<String>,
    /// Filter clusters by type
    #[arg(long = "type", value_parser = ["kind", "minikube", "remote", "all"])]
    cluster_type: Option<String>,
    /// Path or name of kubectl executable
    #[arg(long, value_name = "TEXT")]
    kubectl: Option<String>,
    /// Path or name of minikube executable
    #[arg(long, value_name = "TEXT")]
    minikube: Option<String>,
    #[arg(short, long, value_parser = ["json", "yaml", "name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// `jmp admin create client|exporter`: the flags both take, in upstream's order, with the
/// flags of one kind only (`K`) after `--save`.
#[derive(Args, Debug)]
pub struct CreateArgs<K: CreateKind> {
    #[command(flatten)]
    connect: AdminConnect,
    #[arg(help = K::NAME_HELP)]
    name: String,
    #[arg(short, long, help = K::SAVE_HELP)]
    save: bool,
    #[command(flatten)]
    only: K,
    #[arg(long, value_name = "FILE", help = K::OUT_HELP)]
    out: Option<PathBuf>,
    #[command(flatten)]
    kube: KubeFlags,
    /// Labels to set on resource, can be set multiple times
    #[arg(short, long, value_name = "TEXT", required = K::LABEL_REQUIRED)]
    label: Vec<String>,
    /// Disable TLS certificate verification for connections
    #[arg(short = 'k', long)]
    insecure_tls: bool,
    /// OIDC username
    #[arg(long, value_name = "TEXT")]
    oidc_username: Option<String>,
    /// Disable interactive prompts (for use in scripts); nothing here prompts.
    #[arg(long)]
    nointeractive: bool,
    #[arg(short, long, value_parser = ["json", "yaml", "name", "path"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// The flags only `jmp admin create client` takes.
#[derive(Args, Debug)]
pub struct ClientOnly {
    /// A comma-separated list of driver client packages to load.
    #[arg(short, long, value_name = "TEXT")]
    allow: Option<String>,
    /// Should all driver client packages be allowed to load (UNSAFE!).
    #[arg(long = "unsafe")]
    allow_unsafe: bool,
}

/// `jmp admin create exporter` has no flags of its own.
#[derive(Args, Debug)]
pub struct ExporterOnly {}

/// What `jmp admin create client` and `create exporter` differ in: help texts, whether a
/// label is required, the create RPC and the config file written.
pub(crate) trait CreateKind: Args + std::fmt::Debug {
    /// Which object.
    const KIND: Kind;
    /// Help of the `NAME` argument.
    const NAME_HELP: &'static str;
    /// Help of `--save`.
    const SAVE_HELP: &'static str;
    /// Help of `--out`.
    const OUT_HELP: &'static str;
    /// Whether `--label` must be given.
    const LABEL_REQUIRED: bool;

    /// Creates the object on the controller: its credentials and how it is shown.
    async fn create_object(
        api: &mut AdminApi,
        meta: NewObject,
    ) -> Result<(Credentials, ObjectView)>;

    /// The config file for the new object.
    fn config(&self, cred: &Credentials, insecure: bool) -> NewConfig;
}

/// The fields of a new client or exporter.
pub(crate) struct NewObject {
    namespace: String,
    name: String,
    labels: std::collections::HashMap<String, String>,
    username: String,
}

impl NewObject {
    /// The error a failed create RPC for this object is reported as.
    fn failed(&self, kind: Kind) -> impl FnOnce(tonic::Status) -> anyhow::Error + use<> {
        let what = format!("cannot create {} {:?}", kind.word(), self.name);
        move |s| rpc_error(&what, s)
    }
}

impl CreateKind for ClientOnly {
    const KIND: Kind = Kind::Client;
    const NAME_HELP: &'static str = "Name of the client";
    const SAVE_HELP: &'static str = "Save the config file for the created client";
    const OUT_HELP: &'static str = "Specify an output file for the client config";
    const LABEL_REQUIRED: bool = false;

    async fn create_object(
        api: &mut AdminApi,
        meta: NewObject,
    ) -> Result<(Credentials, ObjectView)> {
        let failed = meta.failed(Self::KIND);
        let resp = api
            .rpc
            .create_client(CreateClientRequest {
                client: Some(Client {
                    namespace: meta.namespace,
                    name: meta.name,
                    labels: meta.labels,
                    username: meta.username,
                    ..Default::default()
                }),
            })
            .await
            .map_err(failed)?
            .into_inner();
        let (cred, client) = answer_parts(
            Self::KIND.word(),
            resp.credentials,
            resp.client,
            |namespace, name| Client {
                namespace,
                name,
                ..Default::default()
            },
        )?;
        Ok((cred, client_view(&client)))
    }

    fn config(&self, cred: &Credentials, insecure: bool) -> NewConfig {
        NewConfig::Client(Box::new(client_config(
            cred,
            insecure,
            self.allow.as_deref(),
            self.allow_unsafe,
        )))
    }
}

impl CreateKind for ExporterOnly {
    const KIND: Kind = Kind::Exporter;
    const NAME_HELP: &'static str = "Name of the exporter";
    const SAVE_HELP: &'static str = "Save the config file for the created exporter";
    const OUT_HELP: &'static str = "Specify an output file for the exporter config";
    const LABEL_REQUIRED: bool = true;

    async fn create_object(
        api: &mut AdminApi,
        meta: NewObject,
    ) -> Result<(Credentials, ObjectView)> {
        let failed = meta.failed(Self::KIND);
        let resp = api
            .rpc
            .create_exporter(CreateExporterRequest {
                exporter: Some(Exporter {
                    namespace: meta.namespace,
                    name: meta.name,
                    labels: meta.labels,
                    username: meta.username,
                    enabled: true,
                    ..Default::default()
                }),
            })
            .await
            .map_err(failed)?
            .into_inner();
        let (cred, exporter) = answer_parts(
            Self::KIND.word(),
            resp.credentials,
            resp.exporter,
            |namespace, name| Exporter {
                namespace,
                name,
                ..Default::default()
            },
        )?;
        Ok((cred, exporter_view(&exporter)))
    }

    fn config(&self, cred: &Credentials, insecure: bool) -> NewConfig {
        NewConfig::Exporter(Box::new(exporter_config(cred, insecure)))
    }
}

/// `jmp admin delete`.
#[derive(Subcommand, Debug)]
pub enum AdminDelete {
    /// Delete a client object on the controller
    #[command(alias = "clients", alias = "c")]
    Client(DeleteArgs),
    /// Delete an exporter object on the controller
    #[command(alias = "exporters", alias = "e")]
    Exporter(DeleteArgs),
    /// Not offered: delete Kubernetes clusters with your own tools
    #[command(alias = "clusters")]
    Cluster(DeleteClusterArgs),
    /// Delete an exporter set (a pool of exporters scaled on demand); its replicas go too
    #[command(
        name = "exporterset",
        alias = "exportersets",
        alias = "es",
        alias = "exporterset.virtualtarget.jumpstarter.dev"
    )]
    ExporterSet(crate::admin_pools::PoolNameArgs),
    /// Delete a virtual target class (refused while an exporter set names it)
    #[command(
        name = "virtualtargetclass",
        alias = "virtualtargetclasses",
        alias = "vtc",
        alias = "virtualtargetclass.virtualtarget.jumpstarter.dev"
    )]
    VirtualTargetClass(crate::admin_pools::PoolNameArgs),
}

/// `jmp admin delete client|exporter`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of the object
    name: String,
    /// Delete the local config file too.
    #[arg(short, long)]
    delete: bool,
    #[command(flatten)]
    kube: KubeFlags,
    #[arg(short, long, value_parser = ["name"], help = OUTPUT_HELP)]
    output: Option<String>,
    /// Disable interactive prompts (for use in scripts); nothing here prompts.
    #[arg(long)]
    nointeractive: bool,
}

/// `jmp admin get`.
#[derive(Subcommand, Debug)]
pub enum AdminGet {
    /// Get the client objects
    #[command(alias = "clients", alias = "c")]
    Client(GetArgs),
    /// Get the exporter objects
    #[command(alias = "exporters", alias = "e")]
    Exporter(GetArgs),
    /// Get the lease objects (the leases holding exporters)
    #[command(alias = "leases", alias = "l")]
    Lease(GetArgs),
    /// Not offered: list Kubernetes clusters with your own tools
    #[command(alias = "clusters")]
    Cluster(GetClusterArgs),
    /// Get the exporter sets (pools of exporters scaled on demand): replicas, ready,
    /// available and leased counts, and their bounds
    #[command(
        name = "exporterset",
        alias = "exportersets",
        alias = "es",
        alias = "exportersets.virtualtarget.jumpstarter.dev"
    )]
    ExporterSet(crate::admin_pools::PoolGetArgs),
    /// Get the virtual target classes (how exporter sets make their replicas)
    #[command(
        name = "virtualtargetclass",
        alias = "virtualtargetclasses",
        alias = "vtc",
        alias = "virtualtargetclasses.virtualtarget.jumpstarter.dev"
    )]
    VirtualTargetClass(crate::admin_pools::PoolGetArgs),
}

/// `jmp admin get client|exporter|lease [NAME]`.
#[derive(Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of one object (default: all)
    name: Option<String>,
    #[command(flatten)]
    kube: KubeFlags,
    /// Label selector to filter on
    #[arg(short = 'l', long = "selector", value_name = "TEXT")]
    selector: Option<String>,
    #[arg(short, long, value_parser = ["json", "yaml", "name"], help = OUTPUT_HELP)]
    output: Option<String>,
    /// Display the devices hosted by the exporter(s)
    #[arg(short = 'd', long)]
    devices: bool,
}

/// `jmp admin import`.
#[derive(Subcommand, Debug)]
pub enum AdminImport {
    /// Write a client config for an existing client, with a new token
    #[command(alias = "clients", alias = "c")]
    Client(ImportClientArgs),
    /// Write an exporter config for an existing exporter, with a new token
    #[command(alias = "exporters", alias = "e")]
    Exporter(ImportExporterArgs),
}

/// `jmp admin import client NAME`.
#[derive(Args, Debug)]
pub struct ImportClientArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of the client
    name: String,
    /// Specify an output file for the client config.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// A comma-separated list of driver client packages to load.
    #[arg(short, long, value_name = "TEXT")]
    allow: Option<String>,
    /// Should all driver client packages be allowed to load (UNSAFE!).
    #[arg(long = "unsafe")]
    allow_unsafe: bool,
    #[command(flatten)]
    kube: KubeFlags,
    /// Disable TLS certificate verification for connections
    #[arg(short = 'k', long)]
    insecure_tls: bool,
    #[arg(short, long, value_parser = ["path"], help = "Output mode. Use \"-o path\" for shorter output (file/path).")]
    output: Option<String>,
    /// Disable interactive prompts (for use in scripts); nothing here prompts.
    #[arg(long)]
    nointeractive: bool,
}

/// `jmp admin import exporter NAME`.
#[derive(Args, Debug)]
pub struct ImportExporterArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of the exporter
    name: String,
    /// Specify an output file for the exporter config.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    kube: KubeFlags,
    /// Disable TLS certificate verification for connections
    #[arg(short = 'k', long)]
    insecure_tls: bool,
    #[arg(short, long, value_parser = ["path"], help = "Output mode. Use \"-o path\" for shorter output (file/path).")]
    output: Option<String>,
    /// Disable interactive prompts (for use in scripts); nothing here prompts.
    #[arg(long)]
    nointeractive: bool,
}

/// `jmp admin rotate`.
#[derive(Subcommand, Debug)]
pub enum AdminRotate {
    /// Rotate the token of a client (the old one stays valid until it expires)
    #[command(alias = "clients", alias = "c")]
    Client(RotateClientArgs),
}

/// `jmp admin rotate client NAME`.
#[derive(Args, Debug)]
pub struct RotateClientArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of the client
    name: String,
    /// Save the updated config file for the client.
    #[arg(short, long)]
    save: bool,
    /// Specify an output file for the client config.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    kube: KubeFlags,
    #[arg(short, long, value_parser = ["name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// `jmp admin clear-health`.
#[derive(Subcommand, Debug)]
pub enum AdminClearHealth {
    /// Clear the quarantine of an exporter
    #[command(alias = "exporters", alias = "e")]
    Exporter(ClearHealthArgs),
}

/// `jmp admin clear-health exporter NAME`.
#[derive(Args, Debug)]
pub struct ClearHealthArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of the exporter
    name: String,
    #[command(flatten)]
    kube: KubeFlags,
    #[arg(short, long, value_parser = ["name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// Runs `jmp admin ...`.
pub async fn run(cmd: AdminCommand) -> Result<i32> {
    match cmd {
        AdminCommand::Create(AdminCreate::Client(a)) => create(a).await,
        AdminCommand::Create(AdminCreate::Exporter(a)) => create(a).await,
        AdminCommand::Create(AdminCreate::Cluster(_))
        | AdminCommand::Delete(AdminDelete::Cluster(_))
        | AdminCommand::Get(AdminGet::Cluster(_)) => bail!("{NOT_OFFERED}"),
        AdminCommand::Delete(AdminDelete::Client(a)) => delete(a, Kind::Client).await,
        AdminCommand::Delete(AdminDelete::Exporter(a)) => delete(a, Kind::Exporter).await,
        AdminCommand::Get(AdminGet::Client(a)) => get_clients(a).await,
        AdminCommand::Get(AdminGet::Exporter(a)) => get_exporters(a).await,
        AdminCommand::Get(AdminGet::Lease(a)) => get_leases(a).await,
        AdminCommand::Import(AdminImport::Client(a)) => import_client(a).await,
        AdminCommand::Import(AdminImport::Exporter(a)) => import_exporter(a).await,
        AdminCommand::Rotate(AdminRotate::Client(a)) => rotate_client(a).await,
        AdminCommand::ClearHealth(AdminClearHealth::Exporter(a)) => clear_health(a).await,
        AdminCommand::Logs(a) => admin_logs(a).await,
        AdminCommand::Apply(a) => crate::admin_pools::apply(a).await,
        AdminCommand::Describe(a) => crate::admin_pools::describe(a).await,
        AdminCommand::Get(AdminGet::ExporterSet(a)) => {
            crate::admin_pools::get_exporter_sets(a).await
        }
        AdminCommand::Get(AdminGet::VirtualTargetClass(a)) => {
            crate::admin_pools::get_classes(a).await
        }
        AdminCommand::Delete(AdminDelete::ExporterSet(a)) => {
            crate::admin_pools::delete(a, true).await
        }
        AdminCommand::Delete(AdminDelete::VirtualTargetClass(a)) => {
            crate::admin_pools::delete(a, false).await
        }
        AdminCommand::Version(a) => crate::config_cmd::version(a),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Client,
    Exporter,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Exporter => "exporter",
        }
    }
}

fn check_name(name: &str, what: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 253
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        bail!(
            "invalid {what} name {name:?}: use lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit"
        );
    }
    Ok(())
}

/// Where `--save` puts an exporter config: the user directory if a config of that name is
/// already there (it would shadow `/etc`), else `/etc/jumpstarter/exporters` when writable
/// (created if `/etc/jumpstarter` is writable), else the user directory.
pub fn exporter_save_path(name: &str) -> PathBuf {
    exporter_save_path_in(name, Path::new(SYSTEM_EXPORTER_DIR), &config_dir())
}

fn exporter_save_path_in(name: &str, system_dir: &Path, user_base: &Path) -> PathBuf {
    let file = format!("{name}.yaml");
    let user = user_base.join("exporters").join(&file);
    if user.exists() {
        return user;
    }
    if dir_writable(system_dir)
        || (!system_dir.exists()
            && system_dir.parent().is_some_and(dir_writable)
            && std::fs::create_dir(system_dir).is_ok())
    {
        return system_dir.join(&file);
    }
    user
}

/// Whether we can create files in `dir` (tried, since permissions alone do not tell for
/// root or read-only mounts).
fn dir_writable(dir: &Path) -> bool {
    dir.is_dir() && tempfile::NamedTempFile::new_in(dir).is_ok()
}

/// Creates the parent directory of `path` and checks it is writable, before anything is
/// created on the controller, so a bad `--out` changes nothing.
fn prepare_output(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create directory {}", dir.display()))?;
    if !dir_writable(dir) {
        bail!("cannot write to {}", dir.display());
    }
    if path.is_dir() {
        bail!("{} is a directory; give a file name", path.display());
    }
    Ok(())
}

fn exporter_config(cred: &Credentials, insecure: bool) -> ExporterConfig {
    let mut cfg = blank_exporter_config();
    cfg.metadata = ObjectMeta {
        namespace: Some(cred.namespace.clone()),
        name: cred.name.clone(),
    };
    cfg.endpoint = Some(cred.endpoint.clone());
    cfg.token = Some(cred.token.clone());
    cfg.tls = TlsConfig {
        ca: encode_ca(&cred.ca_pem),
        insecure,
    };
    cfg
}

/// An exporter config with no drivers yet (what upstream's `--save` writes).
fn blank_exporter_config() -> ExporterConfig {
    ExporterConfig {
        api_version: jumpstarter_core::config::API_VERSION.into(),
        kind: "ExporterConfig".into(),
        metadata: ObjectMeta::default(),
        endpoint: None,
        tls: TlsConfig::default(),
        token: None,
        grpc_options: BTreeMap::new(),
        description: None,
        export: Default::default(),
        hooks: Default::default(),
        failure_detection: Default::default(),
        health_check: None,
        direct_listener: None,
        direct_advertise: None,
        motd: None,
        exit_on_lease_end: false,
        console_transcripts: None,
        path: None,
    }
}

fn client_config(
    cred: &Credentials,
    insecure: bool,
    allow: Option<&str>,
    allow_unsafe: bool,
) -> ClientConfig {
    ClientConfig {
        metadata: ObjectMeta {
            namespace: Some(cred.namespace.clone()),
            name: cred.name.clone(),
        },
        endpoint: Some(cred.endpoint.clone()),
        tls: TlsConfig {
            ca: encode_ca(&cred.ca_pem),
            insecure,
        },
        token: Some(cred.token.clone()),
        drivers: DriversConfig {
            allow: allow
                .map(|a| {
                    a.split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            allow_unsafe,
        },
        ..ClientConfig::default()
    }
}

/// Saves a client config; when it goes into the clients directory and no usable client is
/// current yet, it becomes the current one (as upstream).
fn save_client(cfg: &ClientConfig, path: &Path) -> Result<bool> {
    cfg.save(path)?;
    let in_clients_dir = path.parent() == Some(ClientConfig::dir().as_path());
    if !in_clients_dir {
        return Ok(false);
    }
    let user_path = UserConfig::default_path();
    let mut user = UserConfig::load_or_default(&user_path)?;
    let current_ok = user
        .config
        .current_client
        .as_deref()
        .and_then(|a| ClientConfig::path_for(a).ok())
        .is_some_and(|p| p.exists());
    if current_ok {
        return Ok(false);
    }
    user.config.current_client = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    user.save(&user_path)?;
    Ok(true)
}

/// An admin object as `-o json|yaml` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct ObjectView {
    kind: &'static str,
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    online: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    created: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config_path: Option<String>,
    /// Clients: when the token the controller last issued expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    token_expires_at: Option<Timestamp>,
    /// Clients: the `TokenExpiring` condition's reason and message.
    #[serde(skip_serializing_if = "Option::is_none")]
    token_expiring: Option<TokenExpiringView>,
    /// Only with `jmp admin get exporter --devices`.
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<Vec<DeviceView>>,
}

/// One device of an exporter, as `jmp admin get exporter --devices` shows it.
#[derive(Serialize, Debug)]
struct DeviceView {
    uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_uuid: Option<String>,
    labels: BTreeMap<String, String>,
}

fn device_view(d: &jumpstarter_proto::admin_v1::Device) -> DeviceView {
    DeviceView {
        uuid: d.uuid.clone(),
        parent_uuid: Some(d.parent_uuid.clone()).filter(|p| !p.is_empty()),
        labels: d.labels.clone().into_iter().collect(),
    }
}

fn created(t: &Option<prost_types::Timestamp>) -> Option<Timestamp> {
    t.as_ref().and_then(crate::output::timestamp)
}

/// A client's `TokenExpiring` condition, as `jmp admin get clients -o json|yaml` shows it.
#[derive(Serialize, Debug)]
struct TokenExpiringView {
    reason: String,
    message: String,
}

fn client_view(c: &Client) -> ObjectView {
    ObjectView {
        token_expires_at: created(&c.token_expires_at),
        token_expiring: (!c.token_expiring_reason.is_empty()).then(|| TokenExpiringView {
            reason: c.token_expiring_reason.clone(),
            message: c.token_expiring_message.clone(),
        }),
        kind: "Client",
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        labels: c.labels.clone().into_iter().collect(),
        username: Some(c.username.clone()).filter(|u| !u.is_empty()),
        enabled: None,
        online: None,
        status: None,
        lease: None,
        created: created(&c.created),
        endpoint: None,
        config_path: None,
        devices: None,
    }
}

fn exporter_view(e: &Exporter) -> ObjectView {
    ObjectView {
        token_expires_at: None,
        token_expiring: None,
        kind: "Exporter",
        namespace: e.namespace.clone(),
        name: e.name.clone(),
        labels: e.labels.clone().into_iter().collect(),
        username: Some(e.username.clone()).filter(|u| !u.is_empty()),
        enabled: Some(e.enabled),
        online: Some(e.online),
        status: Some(if e.unhealthy {
            "UNHEALTHY".into()
        } else {
            status_name(e.status)
        }),
        lease: Some(e.lease.clone()).filter(|l| !l.is_empty()),
        created: created(&e.created),
        endpoint: None,
        config_path: None,
        devices: None,
    }
}

/// Prints the result of a create/import/rotate in the chosen mode; `config_yaml` is shown
/// in plain mode when the config was not saved (it is the only copy of the token).
fn report_object(
    mode: OutputMode,
    mut view: ObjectView,
    saved: Option<&Path>,
    config_yaml: &str,
) -> Result<()> {
    let kind = view.kind.to_lowercase();
    match mode {
        OutputMode::Json | OutputMode::Yaml => {
            view.config_path = saved.map(|p| p.display().to_string());
            print_structured(mode, &view)?;
        }
        OutputMode::Name => println!("{kind}.jumpstarter.dev/{}", view.name),
        OutputMode::Path => match saved {
            Some(p) => println!("{}", p.display()),
            None => bail!("-o path needs --save or --out"),
        },
        OutputMode::Plain => {
            if saved.is_none() {
                print!("{config_yaml}");
            }
        }
    }
    Ok(())
}

fn note(mode: OutputMode, text: &str) {
    // Progress notes go to stderr whenever stdout carries machine-readable output.
    if mode == OutputMode::Plain {
        println!("{text}");
    } else {
        eprintln!("{text}");
    }
}

/// The config file a create produces from the new object's credentials.
pub(crate) enum NewConfig {
    Exporter(Box<ExporterConfig>),
    Client(Box<ClientConfig>),
}

/// The credentials and the object of a create RPC's answer; an answer without the object
/// (older controllers) gets one named by the credentials, made by `named(namespace, name)`.
fn answer_parts<T>(
    word: &str,
    credentials: Option<Credentials>,
    object: Option<T>,
    named: impl FnOnce(String, String) -> T,
) -> Result<(Credentials, T)> {
    let cred = credentials
        .with_context(|| format!("the controller returned no credentials for the new {word}"))?;
    let object = object.unwrap_or_else(|| named(cred.namespace.clone(), cred.name.clone()));
    Ok((cred, object))
}

/// `jmp admin create client|exporter`: creates the object, prints or saves its config (the
/// only copy of its token), and deletes the object again when the config cannot be saved.
async fn create<K: CreateKind>(a: CreateArgs<K>) -> Result<i32> {
    let kind = K::KIND;
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    let word = kind.word();
    check_name(&a.name, word)?;
    let labels = parse_key_values(&a.label, "label")?;
    if kind == Kind::Exporter && labels.is_empty() {
        bail!("an exporter needs at least one label: --label key=value");
    }
    let target = match (&a.out, a.save) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(match kind {
            Kind::Exporter => exporter_save_path(&a.name),
            Kind::Client => ClientConfig::path_for(&a.name)?,
        }),
        (None, false) => None,
    };
    if let Some(p) = &target {
        prepare_output(p)?;
    }
    let mut api = AdminApi::connect(&a.connect, a.insecure_tls).await?;
    let meta = NewObject {
        namespace: a.kube.namespace()?,
        name: a.name.clone(),
        labels: labels.into_iter().collect(),
        username: a.oidc_username.clone().unwrap_or_default(),
    };
    let (cred, view) = K::create_object(&mut api, meta).await?;
    note(
        mode,
        &format!(
            "Created {word} \"{}\" in namespace \"{}\"",
            view.name, view.namespace
        ),
    );
    let cfg = a.only.config(&cred, a.insecure_tls);
    let yaml = match &cfg {
        NewConfig::Exporter(c) => c.to_yaml()?,
        NewConfig::Client(c) => {
            serde_saphyr::to_string(c).context("cannot encode the client config")?
        }
    };
    if let Some(p) = &target {
        let saved = match &cfg {
            NewConfig::Exporter(_) => write_private(p, yaml.as_bytes())
                .map(|()| false)
                .map_err(anyhow::Error::from),
            NewConfig::Client(c) => save_client(c, p),
        };
        match saved {
            Ok(current) => {
                note(
                    mode,
                    &format!("{} configuration saved to {}", view.kind, p.display()),
                );
                if current {
                    note(mode, &format!("Current client set to \"{}\"", a.name));
                }
            }
            Err(e) => {
                // Undo, so a failed save leaves nothing behind.
                let r = ObjectRef {
                    namespace: view.namespace.clone(),
                    name: view.name.clone(),
                };
                let _ = delete_object(&mut api, kind, r).await;
                return Err(e).context(format!("the {word} was not kept"));
            }
        }
    }
    report_object(mode, view, target.as_deref(), &yaml)?;
    Ok(0)
}

/// Deletes a client or an exporter on the controller.
async fn delete_object(api: &mut AdminApi, kind: Kind, r: ObjectRef) -> Result<(), tonic::Status> {
    match kind {
        Kind::Client => api.rpc.delete_client(r).await.map(drop),
        Kind::Exporter => api.rpc.delete_exporter(r).await.map(drop),
    }
}

/// `jmp admin clear-health exporter NAME`: the exporter is leased again.
async fn clear_health(a: ClearHealthArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    check_name(&a.name, "exporter")?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let r = ObjectRef {
        namespace: a.kube.namespace()?,
        name: a.name.clone(),
    };
    let what = format!("cannot clear the health of exporter {:?}", a.name);
    let before = api
        .rpc
        .get_exporter(r.clone())
        .await
        .map_err(|s| rpc_error(&what, s))?
        .into_inner();
    api.rpc
        .clear_exporter_health(r)
        .await
        .map_err(|s| rpc_error(&what, s))?;
    match mode {
        OutputMode::Name => println!("exporter.jumpstarter.dev/{}", a.name),
        _ if before.unhealthy => println!("Cleared the health of exporter \"{}\"", a.name),
        _ => println!("Exporter \"{}\" was not unhealthy", a.name),
    }
    Ok(0)
}

async fn delete(a: DeleteArgs, kind: Kind) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    check_name(&a.name, kind.word())?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let r = ObjectRef {
        namespace: a.kube.namespace()?,
        name: a.name.clone(),
    };
    let what = format!("cannot delete {} {:?}", kind.word(), a.name);
    delete_object(&mut api, kind, r)
        .await
        .map_err(|s| rpc_error(&what, s))?;
    match mode {
        OutputMode::Name => println!("{}.jumpstarter.dev/{}", kind.word(), a.name),
        _ => println!("Deleted {} \"{}\"", kind.word(), a.name),
    }
    if a.delete {
        for path in local_config_paths(kind, &a.name) {
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot delete {}", path.display()))?;
            note(mode, &format!("Deleted config file {}", path.display()));
            if kind == Kind::Client {
                let user_path = UserConfig::default_path();
                let mut user = UserConfig::load_or_default(&user_path)?;
                if user.config.current_client.as_deref() == Some(a.name.as_str()) {
                    user.config.current_client = None;
                    user.save(&user_path)?;
                }
            }
        }
    }
    Ok(0)
}

fn local_config_paths(kind: Kind, name: &str) -> Vec<PathBuf> {
    let file = format!("{name}.yaml");
    let candidates = match kind {
        Kind::Client => vec![ClientConfig::dir().join(&file)],
        Kind::Exporter => vec![
            config_dir().join("exporters").join(&file),
            Path::new(SYSTEM_EXPORTER_DIR).join(&file),
        ],
    };
    candidates.into_iter().filter(|p| p.exists()).collect()
}

fn list_request(a: &GetArgs) -> Result<ListRequest> {
    Ok(ListRequest {
        namespace: a.kube.namespace()?,
        selector: a.selector.clone().unwrap_or_default(),
    })
}

/// Prints `views` in `mode`. With `one` (a NAME was asked for), JSON/YAML is
/// the object itself, as `kubectl get KIND NAME -o yaml` prints it; without,
/// a list under `items`.
fn print_objects(mode: OutputMode, views: Vec<ObjectView>, table: Table, one: bool) -> Result<()> {
    match (mode, views.as_slice()) {
        (OutputMode::Json | OutputMode::Yaml, [view]) if one => print_structured(mode, view),
        _ => print_listing(mode, views, table),
    }
}

fn print_listing(mode: OutputMode, views: Vec<ObjectView>, table: Table) -> Result<()> {
    match mode {
        OutputMode::Json | OutputMode::Yaml => {
            #[derive(Serialize)]
            struct Items {
                items: Vec<ObjectView>,
            }
            print_structured(mode, &Items { items: views })
        }
        OutputMode::Name => {
            for v in &views {
                println!("{}.jumpstarter.dev/{}", v.kind.to_lowercase(), v.name);
            }
            Ok(())
        }
        _ => {
            print!("{}", table.render(0));
            Ok(())
        }
    }
}

fn age(t: Option<Timestamp>, now: Timestamp) -> String {
    t.map(|t| format_age(now.as_second() - t.as_second()))
        .unwrap_or_default()
}

/// The TOKEN EXPIRES column: the date, and how soon when the `TokenExpiring` condition says
/// so (`expired`, `in 5d`); empty when the controller recorded none.
fn token_expiry_text(v: &ObjectView, now: Timestamp) -> String {
    let Some(at) = v.token_expires_at else {
        return String::new();
    };
    let date = at.strftime("%Y-%m-%d").to_string();
    let expiring = v
        .token_expiring
        .as_ref()
        .is_some_and(|t| t.reason != "Valid");
    let left = at.as_second() - now.as_second();
    match () {
        _ if left <= 0 => format!("{date} (expired)"),
        _ if expiring => format!("{date} (in {})", format_age(left)),
        _ => date,
    }
}

async fn get_clients(a: GetArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let clients = match &a.name {
        Some(name) => vec![
            api.rpc
                .get_client(ObjectRef {
                    namespace: a.kube.namespace()?,
                    name: name.clone(),
                })
                .await
                .map_err(|s| rpc_error(&format!("cannot get client {name:?}"), s))?
                .into_inner(),
        ],
        None => {
            api.rpc
                .list_clients(list_request(&a)?)
                .await
                .map_err(|s| rpc_error("cannot list clients", s))?
                .into_inner()
                .clients
        }
    };
    let now = Timestamp::now();
    let mut t = Table::new(["NAMESPACE", "NAME", "LABELS", "TOKEN EXPIRES", "AGE"]);
    let views: Vec<ObjectView> = clients.iter().map(client_view).collect();
    for v in &views {
        t.row([
            v.namespace.clone(),
            v.name.clone(),
            labels_text(&v.labels),
            token_expiry_text(v, now),
            age(v.created, now),
        ]);
    }
    print_objects(mode, views, t, a.name.is_some())?;
    Ok(0)
}

async fn list_exporters(api: &mut AdminApi, a: &GetArgs) -> Result<Vec<Exporter>> {
    Ok(match &a.name {
        Some(name) if !name.is_empty() => vec![
            api.rpc
                .get_exporter(ObjectRef {
                    namespace: a.kube.namespace()?,
                    name: name.clone(),
                })
                .await
                .map_err(|s| rpc_error(&format!("cannot get exporter {name:?}"), s))?
                .into_inner(),
        ],
        _ => {
            api.rpc
                .list_exporters(list_request(a)?)
                .await
                .map_err(|s| rpc_error("cannot list exporters", s))?
                .into_inner()
                .exporters
        }
    })
}

async fn get_exporters(a: GetArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let exporters = list_exporters(&mut api, &a).await?;
    let named = a.name.as_ref().is_some_and(|n| !n.is_empty());
    let now = Timestamp::now();
    let mut t = Table::new([
        "NAMESPACE",
        "NAME",
        "ENABLED",
        "ONLINE",
        "STATUS",
        "LEASE",
        "LABELS",
        "AGE",
    ]);
    let mut views: Vec<ObjectView> = exporters.iter().map(exporter_view).collect();
    if a.devices {
        for (v, e) in views.iter_mut().zip(&exporters) {
            v.devices = Some(e.devices.iter().map(device_view).collect());
        }
        print_objects(mode, views, devices_table(&exporters), named)?;
        return Ok(0);
    }
    for v in &views {
        t.row([
            v.namespace.clone(),
            v.name.clone(),
            yes_no(v.enabled.unwrap_or(true)),
            yes_no(v.online.unwrap_or(false)),
            v.status.clone().unwrap_or_default(),
            v.lease.clone().unwrap_or_default(),
            labels_text(&v.labels),
            age(v.created, now),
        ]);
    }
    print_objects(mode, views, t, named)?;
    Ok(0)
}

/// One row per device: the exporter, the device's name and client class (its
/// `jumpstarter.dev/name` and `jumpstarter.dev/client` labels) and its uuid.
fn devices_table(exporters: &[Exporter]) -> Table {
    let mut t = Table::new(["NAMESPACE", "EXPORTER", "DEVICE", "CLIENT", "UUID"]);
    for e in exporters {
        if e.devices.is_empty() {
            t.row([
                e.namespace.clone(),
                e.name.clone(),
                "<not registered>".into(),
                String::new(),
                String::new(),
            ]);
        }
        for d in &e.devices {
            let label = |k: &str| d.labels.get(k).cloned().unwrap_or_default();
            t.row([
                e.namespace.clone(),
                e.name.clone(),
                label("jumpstarter.dev/name"),
                label("jumpstarter.dev/client"),
                d.uuid.clone(),
            ]);
        }
    }
    t
}

/// Leases as the admin API shows them: the lease holding each exporter.
async fn get_leases(a: GetArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let lease_name = a.name.clone();
    let listing = GetArgs {
        name: None,
        connect: a.connect.clone(),
        kube: a.kube.clone(),
        selector: a.selector.clone(),
        output: None,
        devices: false,
    };
    let exporters = list_exporters(&mut api, &listing).await?;
    #[derive(Serialize)]
    struct LeaseItem {
        namespace: String,
        name: String,
        exporter: String,
    }
    let items: Vec<LeaseItem> = exporters
        .iter()
        .filter(|e| !e.lease.is_empty())
        .filter(|e| lease_name.as_ref().is_none_or(|n| *n == e.lease))
        .map(|e| LeaseItem {
            namespace: e.namespace.clone(),
            name: e.lease.clone(),
            exporter: e.name.clone(),
        })
        .collect();
    if let Some(n) = &lease_name
        && items.is_empty()
    {
        bail!("lease {n:?} not found among the leases holding exporters");
    }
    match mode {
        OutputMode::Json | OutputMode::Yaml => {
            #[derive(Serialize)]
            struct Items {
                items: Vec<LeaseItem>,
            }
            match (&lease_name, items.as_slice()) {
                (Some(_), [one]) => print_structured(mode, one)?,
                _ => print_structured(mode, &Items { items })?,
            }
        }
        OutputMode::Name => {
            for i in &items {
                println!("lease.jumpstarter.dev/{}", i.name);
            }
        }
        _ => {
            let mut t = Table::new(["NAMESPACE", "NAME", "EXPORTER"]);
            for i in &items {
                t.row([i.namespace.clone(), i.name.clone(), i.exporter.clone()]);
            }
            print!("{}", t.render(0));
        }
    }
    Ok(0)
}

async fn import_client(a: ImportClientArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    check_name(&a.name, "client")?;
    let path = match &a.out {
        Some(p) => p.clone(),
        None => ClientConfig::path_for(&a.name)?,
    };
    prepare_output(&path)?;
    let mut api = AdminApi::connect(&a.connect, a.insecure_tls).await?;
    let cred = api
        .rpc
        .rotate_client(ObjectRef {
            namespace: a.kube.namespace()?,
            name: a.name.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("cannot import client {:?}", a.name), s))?
        .into_inner();
    let cfg = client_config(&cred, a.insecure_tls, a.allow.as_deref(), a.allow_unsafe);
    save_client(&cfg, &path)?;
    match mode {
        OutputMode::Path => println!("{}", path.display()),
        _ => println!(
            "Client configuration saved to {} (with a newly issued token)",
            path.display()
        ),
    }
    Ok(0)
}

async fn import_exporter(a: ImportExporterArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    check_name(&a.name, "exporter")?;
    let path = match &a.out {
        Some(p) => p.clone(),
        None => exporter_save_path(&a.name),
    };
    prepare_output(&path)?;
    let mut api = AdminApi::connect(&a.connect, a.insecure_tls).await?;
    let cred = api
        .rpc
        .rotate_exporter(ObjectRef {
            namespace: a.kube.namespace()?,
            name: a.name.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("cannot import exporter {:?}", a.name), s))?
        .into_inner();
    // Keep the drivers of an existing config; only the credentials change.
    let cfg = match ExporterConfig::load(&path) {
        Ok(mut old) => {
            let fresh = exporter_config(&cred, a.insecure_tls);
            old.metadata = fresh.metadata;
            old.endpoint = fresh.endpoint;
            old.token = fresh.token;
            old.tls = fresh.tls;
            old
        }
        Err(_) => exporter_config(&cred, a.insecure_tls),
    };
    write_private(&path, cfg.to_yaml()?.as_bytes())?;
    match mode {
        OutputMode::Path => println!("{}", path.display()),
        _ => println!(
            "Exporter configuration saved to {} (with a newly issued token)",
            path.display()
        ),
    }
    Ok(0)
}

async fn rotate_client(a: RotateClientArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    check_name(&a.name, "client")?;
    let target = match (&a.out, a.save) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(ClientConfig::path_for(&a.name)?),
        (None, false) => None,
    };
    if let Some(p) = &target {
        prepare_output(p)?;
    }
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let cred = api
        .rpc
        .rotate_client(ObjectRef {
            namespace: a.kube.namespace()?,
            name: a.name.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("cannot rotate client {:?}", a.name), s))?
        .into_inner();
    // Keep the settings of an existing config; only the credentials change.
    let existing = target
        .as_deref()
        .filter(|p| p.exists())
        .map(ClientConfig::load)
        .transpose()?;
    let cfg = match existing {
        Some(mut old) => {
            old.token = Some(cred.token.clone());
            old.endpoint = Some(cred.endpoint.clone());
            if !cred.ca_pem.is_empty() {
                old.tls.ca = encode_ca(&cred.ca_pem);
            }
            old.path = None;
            old
        }
        None => client_config(&cred, false, None, false),
    };
    let yaml = serde_saphyr::to_string(&cfg).context("cannot encode the client config")?;
    match &target {
        Some(p) => {
            save_client(&cfg, p)?;
            match mode {
                OutputMode::Name => println!("client.jumpstarter.dev/{}", a.name),
                // Upstream's two lines, then where the config is.
                _ => println!(
                    "Token rotated for client '{}'\nClient configuration updated with new token ({})",
                    a.name,
                    p.display()
                ),
            }
        }
        None => match mode {
            OutputMode::Name => println!("client.jumpstarter.dev/{}", a.name),
            _ => {
                eprintln!(
                    "Token rotated for client '{}' (the old token stays valid until it \
                     expires); its new config:",
                    a.name
                );
                print!("{yaml}");
            }
        },
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exporter_save_path_prefers_a_writable_system_dir() {
        let root = tempfile::tempdir().unwrap();
        let user = root.path().join("user");
        let etc = root.path().join("etc/jumpstarter");
        // /etc/jumpstarter missing: the user directory.
        let sys = etc.join("exporters");
        assert_eq!(
            exporter_save_path_in("x", &sys, &user),
            user.join("exporters/x.yaml")
        );
        assert!(!sys.exists());
        // /etc/jumpstarter present and writable: exporters/ is created there.
        std::fs::create_dir_all(&etc).unwrap();
        assert_eq!(exporter_save_path_in("x", &sys, &user), sys.join("x.yaml"));
        assert!(sys.is_dir());
        // A user config of that name wins (it would shadow the system one).
        std::fs::create_dir_all(user.join("exporters")).unwrap();
        std::fs::write(user.join("exporters/x.yaml"), "").unwrap();
        assert_eq!(
            exporter_save_path_in("x", &sys, &user),
            user.join("exporters/x.yaml")
        );
    }

    #[test]
    fn names_are_checked_before_calling_the_controller() {
        assert!(check_name("example-distributed", "exporter").is_ok());
        for bad in ["", "Foo", "a/b", "-a", "a_b", "a..", "../x"] {
            assert!(check_name(bad, "exporter").is_err(), "{bad}");
        }
    }

    #[test]
    fn configs_carry_the_ca() {
        let cred = Credentials {
            endpoint: "127.0.0.1:1".into(),
            ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            token: "t".into(),
            expiry: None,
            namespace: "default".into(),
            name: "x".into(),
        };
        let e = exporter_config(&cred, true);
        assert!(e.tls.insecure && !e.tls.ca.is_empty());
        let yaml = e.to_yaml().unwrap();
        let back = ExporterConfig::parse(&yaml, Path::new("x.yaml")).unwrap();
        assert_eq!(back.token.as_deref(), Some("t"));
        let c = client_config(&cred, false, Some("a.b, c"), true);
        assert_eq!(c.drivers.allow, vec!["a.b", "c"]);
        assert!(c.ca_pem().unwrap().is_some());
    }
}
