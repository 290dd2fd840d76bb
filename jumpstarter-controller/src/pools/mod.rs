//! Virtual target pools: the engine that scales each ExporterSet's replicas, and the
//! provisioners that run them.

pub mod decisions;
pub mod provisioner;
