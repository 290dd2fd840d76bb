//! Scheduling and leases: the scheduler as a pure function ([`scheduler`]), the reconcile
//! loop that runs it and writes what changed ([`reconcile`]), a client's change to its lease
//! ([`update`]), garbage collection of ended leases ([`gc`]), the guard against queue slots
//! held by nobody ([`pending_guard`]), and the copies of objects the loop keeps between
//! passes ([`exporter_view`], [`object_view`]).

pub mod exporter_view;
pub mod gc;
pub mod object_view;
pub mod passes;
pub mod pending_guard;
pub mod reconcile;
pub mod scheduler;
pub mod update;
