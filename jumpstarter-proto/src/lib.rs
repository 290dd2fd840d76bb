//! Protobuf messages and tonic gRPC stubs for the Jumpstarter **0.9.0** wire
//! protocol (`jumpstarter-protocol==0.9.0` on PyPI).
//!
//! The `.proto` files under `proto/` are our own, written from the upstream
//! descriptor dump, and are compiled at build time with `protox` (no `protoc`
//! needed) and `tonic-prost-build`. Clients and servers are generated for every
//! service:
//!
//! - [`v1::controller_service_client::ControllerServiceClient`] /
//!   [`v1::controller_service_server::ControllerServiceServer`]
//! - [`v1::exporter_service_client::ExporterServiceClient`] /
//!   [`v1::exporter_service_server::ExporterServiceServer`]
//! - [`v1::router_service_client::RouterServiceClient`] /
//!   [`v1::router_service_server::RouterServiceServer`]
//! - [`client_v1::client_service_client::ClientServiceClient`] /
//!   [`client_v1::client_service_server::ClientServiceServer`]
//! - [`v1::telemetry_service_client::TelemetryServiceClient`] /
//!   [`v1::telemetry_service_server::TelemetryServiceServer`] (upstream main's
//!   `jumpstarter/v1/telemetry.proto`, after 0.9.0)
//!
//! # Allowed differences from upstream
//!
//! Our descriptors are structurally identical to upstream's (checked by
//! `xtask/interop/conformance.py`), except for options that cannot change the
//! wire format or the gRPC method paths:
//!
//! - the buf-managed file options (`java_package`, `java_outer_classname`,
//!   `java_multiple_files`, `objc_class_prefix`, `csharp_namespace`,
//!   `php_namespace`, `php_metadata_namespace`, `ruby_package`);
//! - the `google/api/{annotations,client,field_behavior,resource}.proto`
//!   imports and the options they provide: `google.api.http`,
//!   `google.api.method_signature` (methods), `google.api.field_behavior`,
//!   `google.api.resource_reference` (fields) and `google.api.resource`
//!   (messages).
//!
//! The standard `deprecated = true` option on `Exporter.online` is kept. Upstream main's
//! additions after 0.9.0 that we carry (fields, `ControllerService.GetServiceEndpoints` and
//! its messages, `telemetry.proto`) are listed in the check and keep upstream main's names
//! and numbers; 0.9.0 peers skip the fields and never call the methods.

/// Generated code, one module per protobuf package (nesting mirrors the package
/// names so that prost's `super::`-relative paths resolve).
pub mod jumpstarter {
    /// Our own administration API (`jumpstarter.admin.v1`, not part of upstream).
    pub mod admin {
        /// Version 1.
        #[allow(missing_docs, clippy::all)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/jumpstarter.admin.v1.rs"));
        }
    }

    /// Our own extensions of the client API (`jumpstarter.ext.v1`, not part of upstream).
    pub mod ext {
        /// Version 1.
        #[allow(missing_docs, clippy::all)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/jumpstarter.ext.v1.rs"));
        }
    }

    /// Package `jumpstarter.v1`: controller, exporter and router services.
    pub mod v1 {
        #![allow(missing_docs)]
        include!(concat!(env!("OUT_DIR"), "/jumpstarter.v1.rs"));
    }

    /// Package `jumpstarter.client`.
    pub mod client {
        /// Package `jumpstarter.client.v1`: the client-facing resource API.
        pub mod v1 {
            #![allow(missing_docs)]
            include!(concat!(env!("OUT_DIR"), "/jumpstarter.client.v1.rs"));
        }
    }
}

pub use jumpstarter::client::v1 as client_v1;
pub use jumpstarter::v1;

/// Encoded `google.protobuf.FileDescriptorSet` of the Jumpstarter proto files
/// (`jumpstarter/v1/{common,kubernetes,jumpstarter,router,telemetry}.proto`,
/// `jumpstarter/client/v1/client.proto`) plus the well-known
/// `google/protobuf/*.proto` files they import, with source info.
///
/// Suitable for gRPC server reflection and for descriptor conformance checks.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/jumpstarter_descriptor.bin"));

/// Our admin API (`jumpstarter.admin.v1`).
pub use jumpstarter::admin::v1 as admin_v1;

/// Our extensions of the client API (`jumpstarter.ext.v1`): `ClientExtensionService`.
pub use jumpstarter::ext::v1 as ext_v1;

/// The encoded `FileDescriptorSet` of our admin API and our client API extensions
/// (`jumpstarter.admin.v1`, `jumpstarter.ext.v1`), for reflection.
pub const ADMIN_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/admin_descriptor.bin"));

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use prost::Message as _;
    use prost_types::FileDescriptorSet;

    use super::FILE_DESCRIPTOR_SET;

    fn fds() -> FileDescriptorSet {
        FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap()
    }

    #[test]
    fn descriptor_set_contains_all_files() {
        let fds = fds();
        let names: Vec<&str> = fds.file.iter().map(|f| f.name()).collect();
        for expected in [
            "jumpstarter/v1/common.proto",
            "jumpstarter/v1/kubernetes.proto",
            "jumpstarter/v1/jumpstarter.proto",
            "jumpstarter/v1/router.proto",
            "jumpstarter/client/v1/client.proto",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} missing from {names:?}"
            );
        }
    }

    #[test]
    fn unregister_reason_is_field_2() {
        let fds = fds();
        let file = fds
            .file
            .iter()
            .find(|f| f.name() == "jumpstarter/v1/jumpstarter.proto")
            .unwrap();
        assert_eq!(file.package(), "jumpstarter.v1");
        let msg = file
            .message_type
            .iter()
            .find(|m| m.name() == "UnregisterRequest")
            .unwrap();
        assert_eq!(msg.field.len(), 1);
        assert_eq!(msg.field[0].name(), "reason");
        assert_eq!(msg.field[0].number(), 2);
    }

    #[test]
    fn telemetry_has_upstream_mains_names_and_numbers() {
        let fds = fds();
        let file = fds
            .file
            .iter()
            .find(|f| f.name() == "jumpstarter/v1/telemetry.proto")
            .unwrap();
        assert_eq!(file.package(), "jumpstarter.v1");
        assert_eq!(file.service[0].name(), "TelemetryService");
        assert_eq!(file.service[0].method[0].name(), "PushLogs");
        let entry = file
            .message_type
            .iter()
            .find(|m| m.name() == "LogEntry")
            .unwrap();
        let numbers: Vec<(&str, i32)> =
            entry.field.iter().map(|f| (f.name(), f.number())).collect();
        assert_eq!(
            numbers,
            [
                ("timestamp", 1),
                ("severity", 2),
                ("message", 3),
                ("component", 4),
                ("exporter", 5),
                ("lease", 6),
                ("client", 7),
                ("operation", 8),
                ("result", 9),
                ("driver_type", 10),
                ("extra_fields", 11),
                ("namespace", 12),
            ]
        );
        let jumpstarter = fds
            .file
            .iter()
            .find(|f| f.name() == "jumpstarter/v1/jumpstarter.proto")
            .unwrap();
        let method = jumpstarter.service[0]
            .method
            .iter()
            .find(|m| m.name() == "GetServiceEndpoints")
            .unwrap();
        assert_eq!(
            method.output_type(),
            ".jumpstarter.v1.GetServiceEndpointsResponse"
        );
    }

    #[test]
    fn generated_types_roundtrip() {
        use crate::v1::{FrameType, StreamRequest, UnregisterRequest};

        let req = UnregisterRequest {
            reason: "bye".into(),
        };
        // field 2, wire type 2 (length-delimited) => tag byte 0x12
        assert_eq!(req.encode_to_vec(), b"\x12\x03bye");

        let frame = StreamRequest {
            payload: b"x".to_vec().into(),
            frame_type: FrameType::Goaway as i32,
        };
        let decoded = StreamRequest::decode(frame.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.frame_type(), FrameType::Goaway);
    }
}
