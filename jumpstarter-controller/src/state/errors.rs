//! How store errors reach callers.

use tonic::Status;

use crate::store::StoreError;

/// Maps a store error to the status upstream's Kubernetes errors become.
pub fn store_status(e: StoreError) -> Status {
    match &e {
        StoreError::NotFound { .. } => Status::not_found(e.to_string()),
        StoreError::AlreadyExists { .. } => Status::already_exists(e.to_string()),
        StoreError::Conflict { .. } => Status::aborted(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}
