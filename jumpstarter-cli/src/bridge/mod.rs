//! Python drivers hosted beside the Rust ones (`docs/python-drivers.md`).
//!
//! An exporter config may name `type:`s no Rust driver provides (or types
//! `JMP_PYTHON_DRIVERS` sends to Python). Those subtrees go to ONE child process: a Python
//! interpreter running `bootstrap.py`, which builds them with upstream's own runtime and
//! serves them on a private Unix socket with upstream's `Session`. The exporter reads that
//! session's report and grafts the subtrees into its own tree with their uuids, labels and
//! client classes; their nodes forward every call to the child (`proxy.rs`). `host.rs` starts
//! the child, restarts it when it dies and never lets it outlive the exporter.

mod drivers;
mod host;
mod plan;
mod proxy;

use std::collections::BTreeMap;

use anyhow::Result;
use jumpstarter_core::{
    DriverNode,
    config::{ConfigError, ExporterConfig},
    driver::DriverRegistry,
};

pub use drivers::PythonDrivers;

/// Builds the driver tree of `cfg`: Rust drivers from `registry`, the rest hosted by a
/// Python child (started here; keep the returned [`PythonDrivers`] for as long as the tree
/// is served: dropping it stops the child).
pub async fn build_tree(
    registry: &DriverRegistry,
    cfg: &ExporterConfig,
) -> Result<(DriverNode, PythonDrivers)> {
    let subtrees = plan::plan(registry, cfg, &plan::Forced::from_env());
    if subtrees.is_empty() {
        return Ok((registry.build(cfg)?, PythonDrivers::none()));
    }
    let fields: Vec<(String, String, u64)> = subtrees
        .iter()
        .map(|s| (s.field.clone(), s.type_name.clone(), s.line))
        .collect();
    let (drivers, nodes) = match PythonDrivers::start(subtrees).await {
        Ok(started) => started,
        Err(e) => {
            // Said as for any unknown type first (a typo reads as one), with where it is,
            // then why Python cannot serve it either.
            let failed = match &e {
                host::StartError::Import { field, .. } => {
                    fields.iter().find(|(f, _, _)| f == field)
                }
                _ => fields.first(),
            };
            let Some((field, type_name, line)) =
                failed.filter(|(_, t, _)| !registry.types().any(|r| r == t))
            else {
                return Err(e.into());
            };
            return Err(ConfigError::Invalid {
                path: cfg
                    .path
                    .clone()
                    .unwrap_or_else(|| std::path::PathBuf::from("<config>")),
                line: *line,
                field: format!("{field}.type"),
                message: format!(
                    "unknown driver type {type_name:?}: no Rust driver provides it, and \
                     Python cannot serve it (docs/python-drivers.md): {e}"
                ),
            }
            .into());
        }
    };
    let by_field: BTreeMap<String, DriverNode> = nodes.into_iter().collect();
    let tree = registry.build_with(cfg, &|field, _| by_field.get(field).cloned())?;
    Ok((tree, drivers))
}
