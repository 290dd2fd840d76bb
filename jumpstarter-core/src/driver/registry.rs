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

/// The level names Python's `logging` knows (upstream's `Driver.log_level` is one of them,
/// or a number).
const PYTHON_LOG_LEVELS: &[&str] = &[
    "CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET",
];

/// `config` without `log_level`: every upstream driver takes it (a field of its `Driver` base
/// class, the level of the driver's Python logger), so a config may give it to any type. Our
/// drivers log through the exporter's own filter, so it is checked as upstream checks it (a
/// level name or a number) and then dropped; anything else is the error's message.
fn without_log_level(config: &serde_json::Value) -> Result<serde_json::Value, String> {
    let serde_json::Value::Object(map) = config else {
        return Ok(config.clone());
    };
    let Some(level) = map.get("log_level") else {
        return Ok(config.clone());
    };
    match level {
        serde_json::Value::String(s) if PYTHON_LOG_LEVELS.contains(&s.as_str()) => {}
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => {}
        other => {
            return Err(format!(
                "unknown level {other} (expected one of {} or a number)",
                PYTHON_LOG_LEVELS.join(", ")
            ));
        }
    }
    let mut map = map.clone();
    map.remove("log_level");
    Ok(serde_json::Value::Object(map))
}

/// Builds a driver from its config.
pub type Constructor = fn(&DriverArgs) -> Result<Arc<dyn Driver>, DriverError>;

/// How many edits (letters added, removed or changed) away a `type:` may be from a registered
/// one to be taken for a typo of it.
const MAX_TYPO: usize = 2;

/// The module of a `type:` (`jumpstarter_driver_power.driver` of
/// `jumpstarter_driver_power.driver.MockPower`).
fn module_of(type_name: &str) -> Option<&str> {
    type_name
        .rsplit_once('.')
        .map(|(m, _)| m)
        .filter(|m| !m.is_empty())
}

/// What a registry has near a `type:` it does not register ([`DriverRegistry::suggest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeSuggestion {
    /// A registered type a typo away.
    Close(String),
    /// No type is close, but these (class names) are registered in the same module.
    SameModule {
        /// The module (`jumpstarter_driver_power.driver`).
        module: String,
        /// Its registered classes (`MockPower`, `SyncMockPower`).
        types: Vec<String>,
    },
}

impl std::fmt::Display for TypeSuggestion {
    /// `did you mean "X"?`, or `the Rust drivers of module M are A and B`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TypeSuggestion::Close(t) => write!(f, "did you mean {t:?}?"),
            TypeSuggestion::SameModule { module, types } => {
                let list = match types.split_last() {
                    Some((last, [])) => last.clone(),
                    Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                    None => String::new(),
                };
                write!(f, "the Rust drivers of module {module} are {list}")
            }
        }
    }
}

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

    /// What the registry has near `type_name`, a type it does not register: a registered
    /// type a typo away (in its class or its module), or else the registered types of its
    /// module. `None` when the registry knows nothing of that module.
    pub fn suggest(&self, type_name: &str) -> Option<TypeSuggestion> {
        let close = self
            .types()
            .filter(|t| *t != type_name)
            .map(|t| (crate::config::edit_distance(type_name, t), t))
            .filter(|(d, _)| *d <= MAX_TYPO)
            .min();
        if let Some((_, t)) = close {
            return Some(TypeSuggestion::Close(t.to_string()));
        }
        let module = module_of(type_name)?;
        let types: Vec<String> = self
            .types()
            .filter(|t| module_of(t) == Some(module))
            .map(|t| t[module.len() + 1..].to_string())
            .collect();
        (!types.is_empty()).then(|| TypeSuggestion::SameModule {
            module: module.to_string(),
            types,
        })
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
                match self.suggest(type_name) {
                    Some(suggestion) => format!("unknown driver type {type_name:?}: {suggestion}"),
                    None => format!(
                        "unknown driver type {type_name:?} (known types: {})",
                        self.ctors.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                },
            )
        })?;
        let config = without_log_level(&inst.config)
            .map_err(|message| invalid(line, format!("{field}.config.log_level"), message))?;
        let driver = ctor(&DriverArgs { config })
            .map_err(|e| invalid(line, format!("{field}.config"), crate::error_chain(&e)))?;
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
        message: crate::error_chain(&e),
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
    fn log_level_is_checked_as_upstream_does_and_left_out_of_the_drivers_config() {
        use serde_json::json;
        for level in [json!("DEBUG"), json!("WARNING"), json!(10)] {
            assert_eq!(
                without_log_level(&json!({"methods": {}, "log_level": level})),
                Ok(json!({"methods": {}}))
            );
        }
        assert_eq!(without_log_level(&json!(null)), Ok(json!(null)));
        assert_eq!(
            without_log_level(&json!({"url": "loop://"})),
            Ok(json!({"url": "loop://"}))
        );
        // Python's logging knows level names in capitals only, and no fractions.
        for bad in [json!("debug"), json!("LOUD"), json!(1.5), json!([])] {
            let err = without_log_level(&json!({"log_level": bad})).unwrap_err();
            assert!(err.starts_with("unknown level"), "{err}");
        }
    }

    #[test]
    fn node_paths() {
        assert_eq!(node_path("export.a"), "a");
        assert_eq!(node_path("export.a.children.b"), "a.b");
    }

    /// A driver that answers nothing, for the tree these tests build.
    struct Nothing;

    impl Driver for Nothing {
        fn client_class(&self) -> String {
            String::new()
        }

        fn type_name(&self) -> &'static str {
            "Nothing"
        }

        fn call(
            self: Arc<Self>,
            _ctx: crate::CallContext,
            _method: String,
            _args: Vec<crate::value::Value>,
        ) -> crate::driver::BoxFuture<Result<crate::value::Value, DriverError>> {
            Box::pin(std::future::ready(Err(DriverError::Failed(
                "nothing".into(),
            ))))
        }

        fn streaming_call(
            self: Arc<Self>,
            _ctx: crate::CallContext,
            _method: String,
            _args: Vec<crate::value::Value>,
        ) -> crate::driver::BoxFuture<Result<crate::driver::ValueStream, DriverError>> {
            Box::pin(std::future::ready(Err(DriverError::Failed(
                "nothing".into(),
            ))))
        }

        fn open_stream(
            self: Arc<Self>,
            _ctx: crate::CallContext,
            _method: String,
        ) -> crate::driver::BoxFuture<Result<crate::driver::BoxDuplex, DriverError>> {
            Box::pin(std::future::ready(Err(DriverError::Failed(
                "nothing".into(),
            ))))
        }
    }

    fn registry() -> DriverRegistry {
        fn none(_: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
            Ok(Arc::new(Nothing))
        }
        let mut r = DriverRegistry::new();
        r.register(COMPOSITE_TYPE, none);
        for t in [
            "jumpstarter_driver_power.driver.MockPower",
            "jumpstarter_driver_power.driver.SyncMockPower",
            "jumpstarter_driver_network.driver.TcpNetwork",
            "jumpstarter_driver_network.driver.UdpNetwork",
            "jumpstarter_driver_shell.driver.Shell",
        ] {
            r.register(t, none);
        }
        r
    }

    #[test]
    fn a_typo_gets_the_close_type_in_its_module_or_another() {
        let r = registry();
        let close = |t: &str| match r.suggest(t) {
            Some(TypeSuggestion::Close(c)) => c,
            other => panic!("{t}: {other:?}"),
        };
        // A letter left out, changed, added; two; in the class or the module.
        assert_eq!(
            close("jumpstarter_driver_power.driver.MockPowr"),
            "jumpstarter_driver_power.driver.MockPower"
        );
        assert_eq!(
            close("jumpstarter_driver_power.driver.mockpower"),
            "jumpstarter_driver_power.driver.MockPower"
        );
        assert_eq!(
            close("jumpstarter_driver_powr.driver.MockPower"),
            "jumpstarter_driver_power.driver.MockPower"
        );
        assert_eq!(
            close("jumpstarter_driver_shell.drivers.Shell"),
            "jumpstarter_driver_shell.driver.Shell"
        );
        // Equally close to two: the first by name.
        assert_eq!(
            close("jumpstarter_driver_network.driver.TdpNetwork"),
            "jumpstarter_driver_network.driver.TcpNetwork"
        );
        assert_eq!(
            TypeSuggestion::Close("a.B".into()).to_string(),
            "did you mean \"a.B\"?"
        );
    }

    #[test]
    fn a_type_of_a_known_module_gets_the_modules_types() {
        let r = registry();
        let s = r.suggest("jumpstarter_driver_power.driver.Foo").unwrap();
        assert_eq!(
            s,
            TypeSuggestion::SameModule {
                module: "jumpstarter_driver_power.driver".into(),
                types: vec!["MockPower".into(), "SyncMockPower".into()],
            }
        );
        assert_eq!(
            s.to_string(),
            "the Rust drivers of module jumpstarter_driver_power.driver are MockPower and \
             SyncMockPower"
        );
        let one = r.suggest("jumpstarter_driver_shell.driver.Bash").unwrap();
        assert_eq!(
            one.to_string(),
            "the Rust drivers of module jumpstarter_driver_shell.driver are Shell"
        );
    }

    #[test]
    fn other_types_get_no_suggestion() {
        let r = registry();
        for t in [
            "acme_relays.driver.Relay",
            "jumpstarter_driver_power.Foo",
            "Relay",
            ".Relay",
            "",
        ] {
            assert_eq!(r.suggest(t), None, "{t:?}");
        }
        // A registered type is no typo of itself.
        assert_eq!(
            r.suggest("jumpstarter_driver_shell.driver.Shell"),
            Some(TypeSuggestion::SameModule {
                module: "jumpstarter_driver_shell.driver".into(),
                types: vec!["Shell".into()],
            })
        );
    }

    #[test]
    fn the_registry_says_did_you_mean_when_it_builds() {
        let cfg = ExporterConfig::parse(
            "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPowr\n",
            std::path::Path::new("x.yaml"),
        )
        .unwrap();
        let e = registry().build(&cfg).err().unwrap().to_string();
        assert_eq!(
            e,
            "<config>:3: export.power.type: unknown driver type \
             \"jumpstarter_driver_power.driver.MockPowr\": did you mean \
             \"jumpstarter_driver_power.driver.MockPower\"?"
        );
    }
}
