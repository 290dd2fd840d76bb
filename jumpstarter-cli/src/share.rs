//! `jmp share add|remove|list`: whom a lease is shared with. The clients a lease is shared
//! with may use it as its owner does (`jmp shell --lease`, extend, release); only the owner
//! changes the list. `jmp share add L C` is `jmp update lease L --share-add C`.

use anyhow::Result;
use clap::{Args, Subcommand};
use jumpstarter_core::client::LeaseUpdate;
use jumpstarter_proto::client_v1::Lease;
use serde::Serialize;

use crate::{
    output::{OutputMode, Table, print_structured, short_name},
    resources::{ClientSelect, api_error, connect},
};

/// `jmp share`.
#[derive(Subcommand, Debug)]
pub enum ShareCommand {
    /// Share a lease with more clients of its namespace (the lease's owner only)
    Add(ShareChangeArgs),
    /// Stop sharing a lease with clients (the lease's owner only)
    #[command(alias = "rm")]
    Remove(ShareChangeArgs),
    /// List the clients a lease is shared with
    #[command(alias = "ls")]
    List(ShareListArgs),
}

/// `jmp share add|remove LEASE CLIENT...`.
#[derive(Args, Debug)]
pub struct ShareChangeArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// The lease
    #[arg(add = crate::completion::lease_names())]
    lease: String,
    /// Client names of the lease's namespace (also comma-separated)
    #[arg(required = true, value_name = "CLIENT", value_delimiter = ',')]
    clients: Vec<String>,
}

/// `jmp share list LEASE`.
#[derive(Args, Debug)]
pub struct ShareListArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// The lease
    #[arg(add = crate::completion::lease_names())]
    lease: String,
    #[arg(short, long, value_parser = ["json", "yaml", "name"],
          help = "Output mode: json, yaml, or name (the clients it is shared with, one a line)")]
    output: Option<String>,
}

/// Whom a lease is shared with, as `jmp share list -o json` shows it.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct ShareView {
    lease: String,
    owner: String,
    shared_with: Vec<String>,
}

impl ShareView {
    fn from_proto(l: &Lease) -> Self {
        Self {
            lease: short_name(&l.name).to_string(),
            owner: l
                .client
                .as_deref()
                .map(short_name)
                .unwrap_or_default()
                .to_string(),
            shared_with: l.shared_with.clone(),
        }
    }

    /// One line for humans.
    fn sentence(&self) -> String {
        if self.shared_with.is_empty() {
            format!(
                "Lease {} (owner {}) is not shared with other clients",
                self.lease, self.owner
            )
        } else {
            format!(
                "Lease {} (owner {}) is shared with: {}",
                self.lease,
                self.owner,
                self.shared_with.join(", ")
            )
        }
    }

    fn table(&self) -> Table {
        let mut t = Table::new(["CLIENT", "ACCESS"]);
        t.row([self.owner.clone(), "owner".to_string()]);
        for c in &self.shared_with {
            t.row([c.clone(), "shared".to_string()]);
        }
        t
    }
}

/// Runs `jmp share ...`.
pub async fn run(cmd: ShareCommand) -> Result<i32> {
    match cmd {
        ShareCommand::Add(args) => change(args, true).await,
        ShareCommand::Remove(args) => change(args, false).await,
        ShareCommand::List(args) => list(args).await,
    }
}

async fn change(args: ShareChangeArgs, add: bool) -> Result<i32> {
    let mut update = LeaseUpdate::default();
    if add {
        update.share_add = args.clients.clone();
    } else {
        update.share_remove = args.clients.clone();
    }
    let api = connect(&args.client).await?;
    let updated = api.update_lease(&args.lease, &update).await.map_err(|e| {
        let verb = if add { "share" } else { "stop sharing" };
        api_error(&format!("cannot {verb} lease {:?}", args.lease), e)
    })?;
    println!("{}", ShareView::from_proto(&updated).sentence());
    Ok(0)
}

async fn list(args: ShareListArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(args.output.as_deref())?;
    let api = connect(&args.client).await?;
    let lease = api
        .get_lease(&args.lease)
        .await
        .map_err(|e| api_error(&format!("cannot read lease {:?}", args.lease), e))?;
    let view = ShareView::from_proto(&lease);
    match mode {
        OutputMode::Json | OutputMode::Yaml => print_structured(mode, &view)?,
        OutputMode::Name => {
            for c in &view.shared_with {
                println!("{c}");
            }
        }
        _ => print!("{}", view.table().render(0)),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(shared: &[&str]) -> Lease {
        Lease {
            name: "namespaces/lab/leases/l1".into(),
            client: Some("namespaces/lab/clients/alice".into()),
            shared_with: shared.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_view_names_owner_and_shared_clients() {
        let v = ShareView::from_proto(&lease(&["bob", "carol"]));
        assert_eq!(
            v.sentence(),
            "Lease l1 (owner alice) is shared with: bob, carol"
        );
        let table = v.table().render(0);
        assert!(
            table.contains("alice") && table.contains("owner"),
            "{table}"
        );
        assert!(
            table.contains("carol") && table.contains("shared"),
            "{table}"
        );
        assert_eq!(
            ShareView::from_proto(&lease(&[])).sentence(),
            "Lease l1 (owner alice) is not shared with other clients"
        );
    }
}
