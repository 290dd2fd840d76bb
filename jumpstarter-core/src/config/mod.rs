//! Config files, in upstream's format: exporter configs ([`ExporterConfig`]), client and user
//! configs ([`ClientConfig`], [`UserConfig`]) and our admin config ([`AdminConfig`]).

mod client;
mod exporter;
pub mod keys;

pub use client::{
    AdminConfig, ClientConfig, DriversConfig, LeasesConfig, ShellConfig, UserConfig,
    UserConfigBody, decode_ca, encode_ca, write_private,
};
pub(crate) use exporter::edit_distance;
pub use exporter::{
    API_VERSION, ConfigError, ConsoleTranscripts, DriverInstance, EMPTY_EXPORT, ExporterConfig,
    FailureDetection, HealthCheck, Hook, Hooks, ObjectMeta, SYSTEM_EXPORTER_DIR, TlsConfig,
    config_dir, exporter_config_path,
};
