//! What a console's transcript is made of: the [`ConsoleRecorder`] a console feeds and the
//! [`Transcripts`] of a session that hands recorders out (kept apart from the fan-out, which
//! feeds them, and from the call context, which hands them to drivers).

use std::sync::Arc;

/// Which way bytes went, for a [`ConsoleRecorder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The board's output, as the clients read it.
    BoardToClient,
    /// What the writer sent to the board.
    ClientToBoard,
}

/// Sees every byte of a console both ways (a transcript). Called with the fan-out's state
/// locked, on the reading task or in the writer's write: it must return at once (buffer,
/// and drop what does not fit).
pub trait ConsoleRecorder: Send + Sync + 'static {
    /// Records `bytes` that went `direction`.
    fn record(&self, direction: Direction, bytes: &[u8]);
}

/// Where a session's console transcripts go (the exporter keeps one per console per lease):
/// given to a session with `Session::set_transcripts`, asked by drivers through
/// [`CallContext::console_recorder`](super::CallContext::console_recorder).
pub trait Transcripts: Send + Sync + 'static {
    /// The recorder of the console of driver `uuid` (of type `type_name`) for this session,
    /// or `None` when it cannot be kept (the reason is logged by the implementation).
    fn recorder(
        &self,
        uuid: Option<uuid::Uuid>,
        type_name: &str,
    ) -> Option<Arc<dyn ConsoleRecorder>>;
}
