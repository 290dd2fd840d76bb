//! Virtual target pools: the engine that scales each ExporterSet's replicas, and the
//! provisioners that run them.

pub mod decisions;
pub mod engine;
#[cfg(feature = "kubernetes")]
pub mod kube;
pub mod local;
pub mod provisioner;
