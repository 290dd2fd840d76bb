//! The metadata keys a client sends with controller RPCs, and the bearer token every
//! controller and router RPC carries.

use tonic::{Status, metadata::MetadataMap};

/// Metadata key of the object kind ("Client" / "Exporter").
pub const KIND_KEY: &str = "jumpstarter-kind";
/// Metadata key of the object namespace.
pub const NAMESPACE_KEY: &str = "jumpstarter-namespace";
/// Metadata key of the object name.
pub const NAME_KEY: &str = "jumpstarter-name";
/// Metadata key of the instance id our exporters send with every controller RPC (one per
/// process), so that the controller tells a second process of one exporter identity from a
/// reconnection of the first.
pub const EXPORTER_INSTANCE_HEADER: &str = "x-jumpstarter-exporter-instance";

/// The bearer token of `authorization`: exactly one, `Bearer <token>` (scheme
/// case-insensitive); missing → `UNAUTHENTICATED "missing authorization header"`, several →
/// `INVALID_ARGUMENT "multiple authorization headers"`, other → `INVALID_ARGUMENT "malformed
/// authorization header"`. The router uses this alone: it needs no other metadata.
pub fn bearer_token(md: &MetadataMap) -> Result<String, Status> {
    let mut values = md.get_all("authorization").iter();
    let Some(value) = values.next() else {
        return Err(Status::unauthenticated("missing authorization header"));
    };
    if values.next().is_some() {
        return Err(Status::invalid_argument("multiple authorization headers"));
    }
    let malformed = || Status::invalid_argument("malformed authorization header");
    let value = value.to_str().map_err(|_| malformed())?;
    match (value.get(..7), value.get(7..)) {
        (Some(scheme), Some(token)) if scheme.eq_ignore_ascii_case("Bearer ") => {
            Ok(token.to_owned())
        }
        _ => Err(malformed()),
    }
}
