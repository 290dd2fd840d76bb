//! Python drivers hosted beside the Rust ones (`docs/python-drivers.md`).
//!
//! An exporter config may name `type:`s no Rust driver provides (or types
//! `JMP_PYTHON_DRIVERS` sends to Python). Those subtrees go to ONE child process: a Python
//! interpreter running `bootstrap.py`, which builds them with upstream's own runtime and
//! serves them on a private Unix socket with upstream's `Session`. The exporter reads that
//! session's report and grafts the subtrees into its own tree with their uuids, labels and
//! client classes; their nodes forward every call to the child (`proxy.rs`; unary calls in
//! a lighter framing than gRPC, `fast.rs`). `host.rs` starts the child, restarts it when it
//! dies and never lets it outlive the exporter.

mod drivers;
mod fast;
#[cfg(test)]
mod fuzz_tests;
mod host;
mod plan;
mod proxy;

use std::{collections::BTreeMap, sync::Arc};

use jumpstarter_core::{
    CallContext, Driver, DriverError, DriverNode,
    config::{ConfigError, ExporterConfig},
    driver::{BoxDuplex, BoxFuture, DriverRegistry, TypeSuggestion, ValueStream},
    value::Value,
};

pub use drivers::PythonDrivers;
pub use host::StartError;

/// Why a driver tree could not be built or checked.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The config is invalid (the error names the file, line and field).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Python child could not serve the types sent to it.
    #[error(transparent)]
    Python(#[from] StartError),
    /// The Python child's report does not match the config.
    #[error("the Python child's drivers do not match the config: {0}")]
    Graft(String),
}

type Result<T, E = BuildError> = std::result::Result<T, E>;

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
    let fields = fields_of(&subtrees);
    let (drivers, grafted) = PythonDrivers::start(subtrees)
        .await
        .map_err(|e| start_failure(registry, cfg, &fields, e))?;
    let mut by_field: BTreeMap<String, DriverNode> = BTreeMap::new();
    for g in grafted {
        let mut node = g.node;
        for path in &g.rust_paths {
            hang_rust_child(registry, cfg, &g.field, &mut node, path)?;
        }
        by_field.insert(g.field, node);
    }
    let tree = registry.build_with(cfg, &|field, _| by_field.get(field).cloned())?;
    Ok((tree, drivers))
}

/// Checks `cfg` as [`build_tree`] would, without serving it: the Rust drivers build (and
/// are dropped at once); the types that go to Python are imported by the interpreter, which
/// builds nothing (their `config:` is checked when the exporter starts). Returns those
/// types, with their config fields.
pub async fn check_config(registry: &DriverRegistry, cfg: &ExporterConfig) -> Result<Vec<String>> {
    let subtrees = plan::plan(registry, cfg, &plan::Forced::from_env());
    let placeholders: BTreeMap<String, DriverNode> = subtrees
        .iter()
        .map(|s| (s.field.clone(), DriverNode::new(Arc::new(Unchecked))))
        .collect();
    drop(registry.build_with(cfg, &|field, _| placeholders.get(field).cloned())?);
    if subtrees.is_empty() {
        return Ok(Vec::new());
    }
    let fields = fields_of(&subtrees);
    PythonDrivers::check(subtrees)
        .await
        .map_err(|e| start_failure(registry, cfg, &fields, e))?;
    Ok(fields
        .into_iter()
        .map(|(field, type_name, _)| format!("{type_name} ({field})"))
        .collect())
}

/// Builds the Rust driver the Python child left out at `path` under the subtree at `field`
/// (a type Python cannot import, under a Python parent) and hangs it under its parent's node.
fn hang_rust_child(
    registry: &DriverRegistry,
    cfg: &ExporterConfig,
    field: &str,
    node: &mut DriverNode,
    path: &[String],
) -> Result<()> {
    let Some((name, parents)) = path.split_last() else {
        return Ok(());
    };
    let mut inst = instance_at(cfg, field)
        .ok_or_else(|| BuildError::Graft(format!("no config node at {field}")))?;
    let mut child_field = field.to_string();
    for n in path {
        inst = inst.children.get(n).ok_or_else(|| {
            BuildError::Graft(format!("no config node {n:?} under {child_field}"))
        })?;
        child_field = format!("{child_field}.children.{n}");
    }
    // Built alone, as the one entry of a config; its errors then name its real field.
    let mut alone = cfg.clone();
    alone.description = None;
    alone.export.clear();
    alone.export.insert(name.clone(), inst.clone());
    let built = registry.build(&alone).map_err(|e| match e {
        ConfigError::Invalid {
            path,
            line,
            field,
            message,
        } => ConfigError::Invalid {
            path,
            line,
            field: field.replacen(&format!("export.{name}"), &child_field, 1),
            message,
        },
        other => other,
    })?;
    let Some((_, child)) = built.children.into_iter().next() else {
        return Ok(());
    };
    let mut parent = node;
    for n in parents {
        parent = match parent.children.iter_mut().find(|(c, _)| c == n) {
            Some((_, c)) => c,
            None => {
                return Err(BuildError::Graft(format!(
                    "the Python child reported no driver at {field}.{n}"
                )));
            }
        };
    }
    parent.children.push((name.clone(), child));
    Ok(())
}

/// The config node at `field` (`export.a.children.b`).
fn instance_at<'a>(
    cfg: &'a ExporterConfig,
    field: &str,
) -> Option<&'a jumpstarter_core::config::DriverInstance> {
    let rest = field.strip_prefix("export.")?;
    let mut parts = rest.split(".children.");
    let mut inst = cfg.export.get(parts.next()?)?;
    for p in parts {
        inst = inst.children.get(p)?;
    }
    Some(inst)
}

/// Each subtree's config field, type and line.
fn fields_of(subtrees: &[plan::Subtree]) -> Vec<(String, String, u64)> {
    subtrees
        .iter()
        .map(|s| (s.field.clone(), s.type_name.clone(), s.line))
        .collect()
}

/// Why the Python drivers cannot start, said as for any unknown type first (a typo reads as
/// one), with where it is, then why Python cannot serve it either.
fn start_failure(
    registry: &DriverRegistry,
    cfg: &ExporterConfig,
    fields: &[(String, String, u64)],
    e: host::StartError,
) -> BuildError {
    let failed = match &e {
        host::StartError::Import { field, .. } | host::StartError::Build { field, .. } => {
            fields.iter().find(|(f, _, _)| f == field)
        }
        // Not one type's failure (no interpreter, no runtime): a typo of a Rust driver's
        // type, or a type of a module the Rust drivers serve, is named first.
        _ => fields
            .iter()
            .find(|(_, t, _)| registry.suggest(t).is_some())
            .or(fields.first()),
    };
    let Some((field, type_name, line)) =
        failed.filter(|(_, t, _)| !registry.types().any(|r| r == t))
    else {
        return e.into();
    };
    ConfigError::Invalid {
        path: cfg
            .path
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("<config>")),
        line: *line,
        field: format!("{field}.type"),
        // A type Python imported but whose constructor failed is known: Python's error
        // says why (a config value, most often).
        message: match (&e, registry.suggest(type_name)) {
            (host::StartError::Build { .. }, _) => e.to_string(),
            // A typo of a Rust driver's type: Python's reason (what to install) is beside the
            // point.
            (_, Some(close @ TypeSuggestion::Close(_))) => {
                format!("unknown driver type {type_name:?}: {close}")
            }
            // A module the Rust drivers serve: its Rust types, not a package to install.
            (_, Some(module @ TypeSuggestion::SameModule { .. })) => format!(
                "unknown driver type {type_name:?}: {module}; Python could not serve it either \
                 (docs/python-drivers.md)"
            ),
            (_, None) => format!(
                "unknown driver type {type_name:?}: no Rust driver provides it, and \
                 Python cannot serve it (docs/python-drivers.md): {e}"
            ),
        },
    }
    .into()
}

/// What stands for a Python subtree while a config is only checked.
struct Unchecked;

impl Driver for Unchecked {
    fn client_class(&self) -> String {
        String::new()
    }

    fn type_name(&self) -> &'static str {
        "PythonDriver"
    }

    fn call(
        self: Arc<Self>,
        _ctx: CallContext,
        _method: String,
        _args: Vec<Value>,
    ) -> BoxFuture<Result<Value, DriverError>> {
        Box::pin(std::future::ready(Err(unchecked())))
    }

    fn streaming_call(
        self: Arc<Self>,
        _ctx: CallContext,
        _method: String,
        _args: Vec<Value>,
    ) -> BoxFuture<Result<ValueStream, DriverError>> {
        Box::pin(std::future::ready(Err(unchecked())))
    }

    fn open_stream(
        self: Arc<Self>,
        _ctx: CallContext,
        _method: String,
    ) -> BoxFuture<Result<BoxDuplex, DriverError>> {
        Box::pin(std::future::ready(Err(unchecked())))
    }
}

fn unchecked() -> DriverError {
    DriverError::Failed("a Python driver is not served while its config is only checked".into())
}
