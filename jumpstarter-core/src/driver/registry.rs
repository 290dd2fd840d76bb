//! From config `type:` names to drivers: the registry and the tree builder.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use serde::de::DeserializeOwned;

use crate::{
    Driver, DriverError,
    config::{ConfigError, DriverInstance, ExporterConfig},
    driver::DriverNode,
};

/// The config type of the implicit root (and of nodes that only have children).
pub const COMPOSITE_TYPE: &str = "jumpstarter_driver_composite.driver.Composite";

/// The arguments a driver constructor gets: the node's `config` mapping.
pub struct DriverArgs {
    /// The `config:` mapping (`null` when absent).
    pub config: serde_json::Value,
}

impl DriverArgs {
    /// Decodes the config into the driver's own settings type.
    ///
    /// Use `#[serde(deny_unknown_fields)]` on it so typos are reported.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, DriverError> {
        let v = match &self.config {
            serde_json::Value::Null => serde_json::Value::Object(Default::default()),
            other => other.clone(),
        };
        serde_json::from_value(v).map_err(DriverError::invalid)
    }
}

/// Builds a driver from its config.
pub type Constructor = fn(&DriverArgs) -> Result<Arc<dyn Driver>, DriverError>;

/// Maps config `type:` names to driver constructors.
#[derive(Default, Clone)]
pub struct DriverRegistry {
    ctors: BTreeMap<String, Constructor>,
}

impl DriverRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a constructor under a config type name.
    pub fn register(&mut self, type_name: impl Into<String>, ctor: Constructor) -> &mut Self {
        self.ctors.insert(type_name.into(), ctor);
        self
    }

    /// The registered type names.
    pub fn types(&self) -> impl Iterator<Item = &str> {
        self.ctors.keys().map(String::as_str)
    }

    /// Builds the driver tree of an exporter config: an implicit Composite whose children
    /// are the `export` entries.
    pub fn build(&self, cfg: &ExporterConfig) -> Result<DriverNode, ConfigError> {
        self.build_with(cfg, &|_, _| None)
    }

    /// Like [`DriverRegistry::build`], but `foreign` is asked first for every node that
    /// names a `type:`, with the node's config field (`export.a.children.b`): a node it
    /// returns replaces that whole subtree (a driver hosted elsewhere, such as a Python
    /// driver served by a child process).
    pub fn build_with(
        &self,
        cfg: &ExporterConfig,
        foreign: &dyn Fn(&str, &DriverInstance) -> Option<DriverNode>,
    ) -> Result<DriverNode, ConfigError> {
        let path = cfg
            .path
            .clone()
            .unwrap_or_else(|| PathBuf::from("<config>"));
        let root_inst = DriverInstance {
            description: cfg.description.clone(),
            children: cfg.export.clone(),
            ..Default::default()
        };
        let mut refs = Vec::new();
        let mut root = self.build_node(&path, "export", &root_inst, &mut refs, foreign)?;
        for (at, target, line) in refs {
            let found = root
                .find(&target)
                .cloned()
                .ok_or_else(|| ConfigError::Invalid {
                    path: path.clone(),
                    line,
                    field: format!("{at}.ref"),
                    message: format!("no driver at {target:?}"),
                })?;
            let node = find_mut(&mut root, &at).ok_or_else(|| ConfigError::Invalid {
                path: path.clone(),
                line,
                field: at.clone(),
                message: "proxy node vanished".into(),
            })?;
            *node = found;
        }
        Ok(root)
    }

    fn build_node(
        &self,
        path: &std::path::Path,
        field: &str,
        inst: &DriverInstance,
        refs: &mut Vec<(String, String, u64)>,
        foreign: &dyn Fn(&str, &DriverInstance) -> Option<DriverNode>,
    ) -> Result<DriverNode, ConfigError> {
        if inst.driver_type.is_some()
            && let Some(node) = foreign(field, inst)
        {
            return Ok(node);
        }
        let invalid = |line: u64, field: String, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line,
            field,
            message,
        };
        let (type_name, line) = match &inst.driver_type {
            Some(t) => (t.value.as_str(), t.referenced.line()),
            None => (COMPOSITE_TYPE, 0),
        };
        let ctor = self.ctors.get(type_name).ok_or_else(|| {
            invalid(
                line,
                format!("{field}.type"),
                format!(
                    "unknown driver type {type_name:?} (known types: {})",
                    self.ctors.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let driver = ctor(&DriverArgs {
            config: inst.config.clone(),
        })
        .map_err(|e| invalid(line, format!("{field}.config"), e.to_string()))?;
        let mut node = DriverNode::new(driver);
        node.description = inst.description.clone();
        // The driver's fallbacks, the config's `methods_description`, then what the driver
        // itself describes (a Shell's per-method `description`, as upstream's
        // `__post_init__` fills it after the config).
        node.methods_description = node.driver.default_methods_description();
        node.methods_description
            .extend(inst.methods_description.clone());
        node.methods_description
            .extend(node.driver.methods_description());
        for (name, child) in &inst.children {
            let child_field = if field == "export" {
                format!("export.{name}")
            } else {
                format!("{field}.children.{name}")
            };
            let child_node = match &child.reference {
                Some(r) => {
                    // A placeholder, replaced by its target once the whole tree exists.
                    let dotted = node_path(&child_field);
                    refs.push((dotted, r.value.clone(), r.referenced.line()));
                    DriverNode::new(ctor_placeholder(self, path, &child_field)?)
                }
                None => self.build_node(path, &child_field, child, refs, foreign)?,
            };
            node.children.push((name.clone(), child_node));
        }
        Ok(node)
    }
}

fn ctor_placeholder(
    reg: &DriverRegistry,
    path: &std::path::Path,
    field: &str,
) -> Result<Arc<dyn Driver>, ConfigError> {
    let ctor = reg
        .ctors
        .get(COMPOSITE_TYPE)
        .ok_or_else(|| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: 0,
            field: field.to_string(),
            message: format!("{COMPOSITE_TYPE} is not registered"),
        })?;
    ctor(&DriverArgs {
        config: serde_json::Value::Null,
    })
    .map_err(|e| ConfigError::Invalid {
        path: path.to_path_buf(),
        line: 0,
        field: field.to_string(),
        message: e.to_string(),
    })
}

/// `export.a.children.b` -> `a.b`
fn node_path(field: &str) -> String {
    field
        .trim_start_matches("export")
        .trim_start_matches('.')
        .replace(".children.", ".")
}

fn find_mut<'a>(node: &'a mut DriverNode, path: &str) -> Option<&'a mut DriverNode> {
    let mut node = node;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        node = &mut node.children.iter_mut().find(|(n, _)| n == part)?.1;
    }
    Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_paths() {
        assert_eq!(node_path("export.a"), "a");
        assert_eq!(node_path("export.a.children.b"), "a.b");
    }
}
