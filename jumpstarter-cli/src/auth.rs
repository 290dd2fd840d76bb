//! `jmp auth status|rotate|refresh` (a client's token) and `jmp driver list|version`.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use jiff::Timestamp;
use jumpstarter_core::config::{ClientConfig, UserConfig};

use crate::{
    output::{Describe, format_utc, jwt_expiry, token_status},
    resources::{ClientSelect, api_error, connect},
};

/// `jmp auth`.
#[derive(Subcommand, Debug)]
pub enum AuthCommand {
    /// Refresh the access token using a stored refresh token.
    Refresh(AuthArgs),
    /// Rotate the internal token, replacing it with a freshly signed one.
    Rotate(AuthArgs),
    /// Display token status and expiry information.
    Status(StatusArgs),
}

/// Which client.
#[derive(Args, Debug)]
pub struct AuthArgs {
    #[command(flatten)]
    client: ClientSelect,
}

/// `jmp auth status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Show additional token details
    #[arg(short, long)]
    verbose: bool,
    #[command(flatten)]
    client: ClientSelect,
}

/// `jmp driver`.
#[derive(Subcommand, Debug)]
pub enum DriverCommand {
    /// List the driver types this exporter can run
    #[command(alias = "ls")]
    List,
    /// Get the current Jumpstarter version
    #[command(alias = "ver", alias = "v")]
    Version(crate::config_cmd::VersionArgs),
}

/// Runs `jmp driver ...`.
pub fn driver(cmd: DriverCommand, toolkit: &crate::Toolkit) -> Result<i32> {
    match cmd {
        DriverCommand::List => {
            for t in toolkit.registry().types() {
                println!("{t}");
            }
        }
        DriverCommand::Version(a) => return crate::config_cmd::version(a),
    }
    Ok(0)
}

fn load(select: &ClientSelect) -> Result<ClientConfig> {
    Ok(ClientConfig::resolve(
        select.client_config.as_deref(),
        select.client.as_deref(),
    )?)
}

/// Runs `jmp auth ...`.
pub async fn run(cmd: AuthCommand) -> Result<i32> {
    match cmd {
        AuthCommand::Status(a) => {
            let cfg = load(&a.client)?;
            print!("{}", status_view(&cfg, a.verbose, Timestamp::now()));
            Ok(0)
        }
        AuthCommand::Rotate(a) => {
            let cfg = load(&a.client)?;
            let path = cfg.path.clone().context(
                "this client config comes from JMP_* variables, not a file; rotate the token \
                 of a saved config with --client ALIAS",
            )?;
            let resp = connect(&a.client)
                .await?
                .rotate_token()
                .await
                .map_err(|e| api_error("cannot rotate the token", e))?;
            let mut new = cfg;
            new.token = Some(resp.token);
            new.save(&path)?;
            let expiry = resp
                .expiry
                .as_ref()
                .and_then(crate::output::timestamp)
                .map(format_utc)
                .unwrap_or_else(|| "unknown".into());
            println!(
                "Token rotated; saved to {} (expires {expiry})",
                path.display()
            );
            Ok(0)
        }
        AuthCommand::Refresh(a) => {
            let cfg = load(&a.client)?;
            let path = crate::login::refresh(cfg).await?;
            println!("Token refreshed; saved to {path}");
            Ok(0)
        }
    }
}

/// The `auth status` view.
fn status_view(cfg: &ClientConfig, verbose: bool, now: Timestamp) -> String {
    let token = cfg.token.as_deref().filter(|t| !t.is_empty());
    let expiry = token.and_then(jwt_expiry);
    let status = match (token, expiry) {
        (None, _) => "not set".to_string(),
        (Some(_), None) => "unknown expiry (not a JWT)".to_string(),
        (Some(_), Some(exp)) => token_status(exp, now),
    };
    let user = UserConfig::load_or_default(&UserConfig::default_path()).unwrap_or_default();
    let alias = cfg.alias().unwrap_or_else(|| "(from environment)".into());
    let mut d = Describe::new();
    let mut fields = vec![
        ("Client", alias.clone()),
        (
            "Current",
            crate::output::yes_no(user.config.current_client.as_deref() == Some(alias.as_str())),
        ),
        (
            "Expiry",
            expiry.map(format_utc).unwrap_or_else(|| "<none>".into()),
        ),
        ("Status", status),
        (
            "Refresh Token Stored",
            crate::output::yes_no(cfg.refresh_token.as_deref().is_some_and(|t| !t.is_empty())),
        ),
    ];
    if verbose && let Some(claims) = token.and_then(claims) {
        for key in ["sub", "iss", "aud"] {
            if let Some(v) = claims.get(key) {
                let text = v
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string());
                fields.push((
                    match key {
                        "sub" => "Subject",
                        "iss" => "Issuer",
                        _ => "Audience",
                    },
                    text,
                ));
            }
        }
    }
    d.fields(0, &fields);
    d.finish()
}

/// The unverified claims of a JWT (for display only).
fn claims(token: &str) -> Option<serde_json::Value> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    #[test]
    fn status_shows_expiry_and_claims() {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let token = format!(
            "{}.{}.sig",
            b64("{}"),
            b64(r#"{"exp":1819591256,"sub":"client:default:hello:u","iss":"https://x"}"#)
        );
        let cfg = ClientConfig {
            token: Some(token),
            path: Some("/c/clients/hello.yaml".into()),
            ..ClientConfig::default()
        };
        let now = Timestamp::from_second(1819591256 - 7200).unwrap();
        let v = status_view(&cfg, true, now);
        assert!(v.contains("Client:                hello\n"), "{v}");
        assert!(
            v.contains("Expiry:                2027-08-30 02:00:56 UTC\n"),
            "{v}"
        );
        assert!(
            v.contains("Status:                Valid (2h 0m remaining)\n"),
            "{v}"
        );
        assert!(
            v.contains("Subject:               client:default:hello:u\n"),
            "{v}"
        );
        let plain = status_view(&cfg, false, now);
        assert!(!plain.contains("Subject"), "{plain}");
        let none = status_view(&ClientConfig::default(), false, now);
        assert!(none.contains("Status:                not set"), "{none}");
    }
}
