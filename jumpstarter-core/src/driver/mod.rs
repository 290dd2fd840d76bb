//! Drivers: the [`Driver`] trait and how it is called ([`model`](self#reexports)), the driver
//! tree of an exporter ([`DriverNode`]), the registry from config `type:` names to drivers
//! ([`DriverRegistry`]) and the [`value`] codec of call arguments and results.
//!
//! A driver is a value implementing [`Driver`]. Nobody writes that trait by hand: put
//! `#[driver(client = "...")]` on an `impl` block and mark the callable methods, see
//! [`macro@crate::driver`] and the crate's `examples/custom_driver`.

mod error;
pub mod fanout;
mod log;
mod model;
mod registry;
mod transcript;
mod tree;
pub mod value;

pub use error::{DriverError, SharedError};
pub use fanout::{ConsoleFanout, ConsoleStatus, ConsoleStream};
pub use log::{LogObserver, LogSink};
pub use model::{BoxDuplex, BoxFuture, CallContext, Driver, Duplex, ValueStream, encode_stream};
pub use registry::{COMPOSITE_TYPE, Constructor, DriverArgs, DriverRegistry, TypeSuggestion};
pub use transcript::{ConsoleRecorder, Direction, Transcripts};
pub use tree::{CLIENT_LABEL, DriverNode, NAME_LABEL};
