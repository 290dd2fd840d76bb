//! `Composite`: a driver with no methods of its own, only children.

use std::sync::Arc;

use jumpstarter_core::{Driver, DriverError, driver, driver::DriverArgs};

/// Upstream client class of composite drivers.
pub const COMPOSITE_CLIENT: &str = "jumpstarter_driver_composite.client.CompositeClient";

/// Groups child drivers under one name (the root of every exporter is one).
#[derive(Debug, Default)]
pub struct Composite;

#[driver(client = "jumpstarter_driver_composite.client.CompositeClient")]
impl Composite {}

impl Composite {
    /// Constructor for the registry (takes no config).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoConfig {}
        let _: NoConfig = args.parse()?;
        Ok(Arc::new(Composite))
    }
}
