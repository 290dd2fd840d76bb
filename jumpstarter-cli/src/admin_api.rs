//! What every `jmp admin` command shares: the flags that name the controller and namespace,
//! and the connection to the controller's AdminService.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use jumpstarter_core::client::channel::{
    AuthChannel, ControllerAuth, TlsSettings, connect_authenticated,
};
use jumpstarter_core::config::AdminConfig;
use jumpstarter_proto::admin_v1::admin_service_client::AdminServiceClient;

/// Options every admin command shares.
#[derive(Args, Debug, Clone, Default)]
pub struct AdminConnect {
    /// Admin config to use (default: $JMP_ADMIN_CONFIG, else CONFIG_DIR/admin.yaml, written
    /// by the controller on start)
    #[arg(long, value_name = "PATH", global = true)]
    pub admin_config: Option<PathBuf>,
}

/// Kubernetes flags upstream has. `-n` is honoured; `--kubeconfig` and `--context` parse (so
/// upstream's command lines are recognised) but are refused with an error naming them: `jmp admin`
/// reaches the controller through its admin config, and silently talking to another controller
/// than the cluster the flag names would be worse than stopping.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeFlags {
    /// Namespace to use (default: default)
    #[arg(short = 'n', long, value_name = "TEXT")]
    namespace: Option<String>,
    /// Not supported (refused): jmp admin reaches the controller through --admin-config
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Not supported (refused): jmp admin reaches the controller through --admin-config
    #[arg(long, value_name = "TEXT")]
    context: Option<String>,
}

impl KubeFlags {
    /// The namespace to use; refuses `--kubeconfig`/`--context`, which this `jmp admin` cannot
    /// honour.
    pub(crate) fn namespace(&self) -> Result<String> {
        let refused = match (&self.kubeconfig, &self.context) {
            (Some(_), _) => Some("--kubeconfig"),
            (None, Some(_)) => Some("--context"),
            (None, None) => None,
        };
        if let Some(flag) = refused {
            bail!(
                "{flag} is not supported: this jmp admin does not talk to Kubernetes; it reaches \
                 the controller named in its admin config (--admin-config FILE, by default the one \
                 `jumpstarter-controller` wrote for this user), whichever store that controller \
                 uses. Remove {flag}."
            );
        }
        Ok(self.namespace.clone().unwrap_or_default())
    }
}

/// A connection to the AdminService.
pub(crate) struct AdminApi {
    pub(crate) rpc: AdminServiceClient<AuthChannel>,
}

impl AdminApi {
    pub(crate) async fn connect(opts: &AdminConnect, insecure: bool) -> Result<Self> {
        let path = opts
            .admin_config
            .clone()
            .unwrap_or_else(AdminConfig::default_path);
        if !path.exists() {
            bail!(
                "no admin config at {}: start the controller (it writes one), or pass \
                 --admin-config PATH / set JMP_ADMIN_CONFIG",
                path.display()
            );
        }
        let cfg = AdminConfig::load(&path)?;
        let mut tls = TlsSettings::from_config(&cfg.tls, Some(&path))?;
        tls.insecure |= insecure;
        let channel =
            connect_authenticated(&cfg.endpoint, &tls, &ControllerAuth::bearer(&cfg.token)).await?;
        Ok(Self {
            rpc: AdminServiceClient::new(channel),
        })
    }
}
