//! Which config subtrees go to Python, in the shape upstream's runtime reads.

use jumpstarter_core::{
    config::{DriverInstance, ExporterConfig},
    driver::DriverRegistry,
};

/// Env var naming the Python interpreter for Python drivers (default `python3` on `PATH`).
pub const PYTHON_ENV: &str = "JMP_PYTHON";

/// Env var listing config `type:`s (comma-separated; `*` for all) to serve with their Python
/// implementation even where a Rust driver registers the same type name.
pub const FORCE_ENV: &str = "JMP_PYTHON_DRIVERS";

/// A subtree of the config that the Python child builds.
#[derive(Debug, Clone)]
pub struct Subtree {
    /// Its key under the child's root.
    pub key: String,
    /// Its config field (`export.a.children.b`), as the registry names nodes.
    pub field: String,
    /// Its `type:`.
    pub type_name: String,
    /// The line of its `type:` (0 when unknown).
    pub line: u64,
    /// The instance in upstream's config shape (`type`, `config`, `children`...).
    pub instance: serde_json::Value,
    /// The types of its descendants that a Rust driver provides (not forced to Python): the
    /// child leaves those it cannot import to us.
    pub rust_types: Vec<String>,
}

/// Which `type:`s go to Python although a Rust driver exists ([`FORCE_ENV`]).
#[derive(Debug, Clone, Default)]
pub struct Forced(Vec<String>);

impl Forced {
    /// From [`FORCE_ENV`].
    pub fn from_env() -> Self {
        Self::parse(&std::env::var(FORCE_ENV).unwrap_or_default())
    }

    /// From a comma-separated list.
    pub fn parse(list: &str) -> Self {
        Self(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
        )
    }

    fn contains(&self, type_name: &str) -> bool {
        self.0.iter().any(|t| t == "*" || t == type_name)
    }
}

/// The subtrees of `cfg` the Python child must build: every node whose `type:` the registry
/// does not know (or [`Forced`]), with everything under it.
pub fn plan(registry: &DriverRegistry, cfg: &ExporterConfig, forced: &Forced) -> Vec<Subtree> {
    let known: std::collections::BTreeSet<&str> = registry.types().collect();
    let mut out = Vec::new();
    for (name, inst) in &cfg.export {
        walk(&known, forced, &format!("export.{name}"), inst, &mut out);
    }
    out
}

fn walk(
    known: &std::collections::BTreeSet<&str>,
    forced: &Forced,
    field: &str,
    inst: &DriverInstance,
    out: &mut Vec<Subtree>,
) {
    if let Some(t) = &inst.driver_type
        && (!known.contains(t.value.as_str()) || forced.contains(&t.value))
    {
        let mut rust_types = Vec::new();
        for child in inst.children.values() {
            rust_types_in(known, forced, child, &mut rust_types);
        }
        rust_types.sort();
        rust_types.dedup();
        out.push(Subtree {
            key: out.len().to_string(),
            field: field.to_string(),
            type_name: t.value.clone(),
            line: t.referenced.line(),
            instance: upstream_instance(inst),
            rust_types,
        });
        return;
    }
    for (name, child) in &inst.children {
        walk(
            known,
            forced,
            &format!("{field}.children.{name}"),
            child,
            out,
        );
    }
}

/// The types in `inst` and below that a Rust driver provides and that are not forced.
fn rust_types_in(
    known: &std::collections::BTreeSet<&str>,
    forced: &Forced,
    inst: &DriverInstance,
    out: &mut Vec<String>,
) {
    if let Some(t) = &inst.driver_type
        && known.contains(t.value.as_str())
        && !forced.contains(&t.value)
    {
        out.push(t.value.clone());
    }
    for child in inst.children.values() {
        rust_types_in(known, forced, child, out);
    }
}

/// A config node in the shape upstream's `ExporterConfigV1Alpha1DriverInstance` reads.
fn upstream_instance(inst: &DriverInstance) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    if let Some(t) = &inst.driver_type {
        m.insert("type".into(), t.value.clone().into());
    }
    if let Some(r) = &inst.reference {
        m.insert("ref".into(), r.value.clone().into());
    }
    if let Some(d) = &inst.description {
        m.insert("description".into(), d.clone().into());
    }
    if !inst.methods_description.is_empty() {
        m.insert(
            "methods_description".into(),
            serde_json::to_value(&inst.methods_description).unwrap_or_default(),
        );
    }
    if !inst.config.is_null() {
        m.insert("config".into(), inst.config.clone());
    }
    if !inst.children.is_empty() {
        let children: serde_json::Map<String, serde_json::Value> = inst
            .children
            .iter()
            .map(|(k, v)| (k.clone(), upstream_instance(v)))
            .collect();
        m.insert("children".into(), children.into());
    }
    serde_json::Value::Object(m)
}

/// The upstream package that usually provides a driver type's module
/// (`jumpstarter_driver_shell.driver.Shell` → `jumpstarter-driver-shell`).
pub fn package_of(type_name: &str) -> String {
    let top = type_name.split('.').next().unwrap_or(type_name);
    top.replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_types() {
        let f = Forced::parse(" a.B , c.D,,");
        assert!(f.contains("a.B") && f.contains("c.D") && !f.contains("a"));
        assert!(Forced::parse("*").contains("anything"));
        assert!(!Forced::parse("").contains("x"));
    }

    #[test]
    fn unknown_and_forced_types_go_to_python_with_their_subtrees() {
        let cfg = ExporterConfig::parse(
            "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  bench:
    children:
      lamp:
        type: lab.Lamp
        description: a lamp
        config: {w: 1}
        children:
          bulb:
            type: jumpstarter_driver_power.driver.MockPower
  sh:
    type: jumpstarter_driver_shell.driver.Shell
",
            std::path::Path::new("x.yaml"),
        )
        .unwrap();
        let reg = jumpstarter_drivers::stock_registry();
        let p = plan(&reg, &cfg, &Forced::default());
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].field, "export.bench.children.lamp");
        assert_eq!(p[0].type_name, "lab.Lamp");
        assert_eq!(
            p[0].rust_types,
            ["jumpstarter_driver_power.driver.MockPower"]
        );
        assert_eq!(
            p[0].instance,
            serde_json::json!({
                "type": "lab.Lamp",
                "description": "a lamp",
                "config": {"w": 1},
                "children": {"bulb": {"type": "jumpstarter_driver_power.driver.MockPower"}},
            })
        );
        let p = plan(
            &reg,
            &cfg,
            &Forced::parse("jumpstarter_driver_shell.driver.Shell"),
        );
        let fields: Vec<&str> = p.iter().map(|s| s.field.as_str()).collect();
        assert_eq!(fields, ["export.bench.children.lamp", "export.sh"]);
        // Forced types are Python's under a Python parent too.
        let p = plan(&reg, &cfg, &Forced::parse("*"));
        assert!(p.iter().all(|s| s.rust_types.is_empty()), "{p:?}");
        assert_eq!(p[1].key, "1");
        // Nothing unknown: no Python at all.
        let cfg = ExporterConfig::parse(
            "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
            std::path::Path::new("x.yaml"),
        )
        .unwrap();
        assert!(plan(&reg, &cfg, &Forced::default()).is_empty());
    }

    #[test]
    fn packages() {
        assert_eq!(
            package_of("jumpstarter_driver_shell.driver.Shell"),
            "jumpstarter-driver-shell"
        );
        assert_eq!(package_of("my_lab"), "my-lab");
    }
}
