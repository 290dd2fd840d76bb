//! The driver tree of an exporter and the reports it sends (`DriverInstanceReport`).

use std::{collections::BTreeMap, sync::Arc};

use jumpstarter_proto::v1::DriverInstanceReport;
use uuid::Uuid;

use crate::Driver;

/// Label carrying the client class of a driver.
pub const CLIENT_LABEL: &str = "jumpstarter.dev/client";
/// Label carrying a child's name under its parent.
pub const NAME_LABEL: &str = "jumpstarter.dev/name";

/// One node of the tree: a driver plus what the exporter reports about it.
#[derive(Clone)]
pub struct DriverNode {
    /// The driver's uuid (fresh per process, as upstream).
    pub uuid: Uuid,
    /// The driver.
    pub driver: Arc<dyn Driver>,
    /// Extra labels to report.
    pub labels: BTreeMap<String, String>,
    /// Description (the `j` help text of this node).
    pub description: Option<String>,
    /// Help text per CLI command name.
    pub methods_description: BTreeMap<String, String>,
    /// Named children, in report order.
    pub children: Vec<(String, DriverNode)>,
}

impl DriverNode {
    /// A node for `driver` with a fresh uuid and the driver's own method descriptions;
    /// built-in children of the driver are added.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        let children = driver
            .children()
            .into_iter()
            .map(|(name, d)| (name, DriverNode::new(d)))
            .collect();
        let mut methods_description = driver.default_methods_description();
        methods_description.extend(driver.methods_description());
        Self {
            uuid: Uuid::new_v4(),
            driver,
            labels: BTreeMap::new(),
            description: None,
            methods_description,
            children,
        }
    }

    /// Adds a named child.
    pub fn with_child(mut self, name: impl Into<String>, child: DriverNode) -> Self {
        self.children.push((name.into(), child));
        self
    }

    /// Depth-first, pre-order reports of this node and its descendants.
    pub fn reports(&self) -> Vec<DriverInstanceReport> {
        let mut out = Vec::new();
        self.collect_reports(None, None, &mut out);
        out
    }

    fn collect_reports(
        &self,
        parent: Option<Uuid>,
        name: Option<&str>,
        out: &mut Vec<DriverInstanceReport>,
    ) {
        let mut labels: std::collections::HashMap<String, String> =
            self.driver.labels().into_iter().collect();
        labels.extend(self.labels.clone());
        labels.insert(CLIENT_LABEL.into(), self.driver.client_class());
        if let Some(n) = name {
            labels.insert(NAME_LABEL.into(), n.to_string());
        }
        out.push(DriverInstanceReport {
            uuid: self.uuid.to_string(),
            parent_uuid: parent.map(|p| p.to_string()),
            labels,
            description: self.description.clone(),
            methods_description: self.methods_description.clone().into_iter().collect(),
        });
        for (child_name, child) in &self.children {
            child.collect_reports(Some(self.uuid), Some(child_name), out);
        }
    }

    /// Every driver in the tree by uuid (a proxy shares its target's uuid and driver).
    pub fn index(&self) -> BTreeMap<Uuid, (String, Arc<dyn Driver>)> {
        let mut out = BTreeMap::new();
        self.collect_index(&mut out);
        out
    }

    fn collect_index(&self, out: &mut BTreeMap<Uuid, (String, Arc<dyn Driver>)>) {
        out.insert(
            self.uuid,
            (self.driver.type_name().to_string(), self.driver.clone()),
        );
        for (_, c) in &self.children {
            c.collect_index(out);
        }
    }

    /// Finds a node by dotted path from this node (`storage.disk`).
    pub fn find(&self, path: &str) -> Option<&DriverNode> {
        let mut node = self;
        for part in path.split('.').filter(|p| !p.is_empty()) {
            node = &node.children.iter().find(|(n, _)| n == part)?.1;
        }
        Some(node)
    }
}
