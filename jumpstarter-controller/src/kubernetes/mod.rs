//! What a controller on a Kubernetes cluster does beyond storing objects: the CRDs
//! ([`crd`]), the controller's ConfigMap ([`cluster_config`]) and key Secret ([`key_secret`]),
//! leader election ([`leader`]), Events about exporters ([`events`]) and owner references
//! ([`owner_refs`]). The store backend itself is [`crate::store::KubeStore`].

pub mod cluster_config;
pub mod crd;
pub mod events;
pub mod key_secret;
pub mod leader;
pub mod owner_refs;
pub mod standby;
