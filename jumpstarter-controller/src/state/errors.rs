//! How store errors reach callers.

use tonic::Status;

use crate::store::StoreError;

/// Maps a store error to the status upstream's Kubernetes errors become.
pub fn store_status(e: StoreError) -> Status {
    match &e {
        StoreError::NotFound { .. } => Status::not_found(jumpstarter_core::error_chain(&e)),
        StoreError::AlreadyExists { .. } => {
            Status::already_exists(jumpstarter_core::error_chain(&e))
        }
        StoreError::Conflict { .. } => Status::aborted(jumpstarter_core::error_chain(&e)),
        _ => Status::internal(jumpstarter_core::error_chain(&e)),
    }
}
