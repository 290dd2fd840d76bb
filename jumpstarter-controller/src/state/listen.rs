//! The exporters' Listen queues: one per lease an exporter listens on, through which the
//! controller hands it router connections.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use jumpstarter_core::sync::LockExt;
use jumpstarter_proto::v1::ListenResponse;
use tokio::sync::mpsc;
use tonic::Status;

/// Capacity of an exporter's Listen queue (as upstream).
pub const LISTEN_QUEUE: usize = 8;

type ListenKey = (String, String);

/// The Listen queues, keyed by (namespace, lease).
pub struct ListenQueues {
    queues: Mutex<HashMap<ListenKey, (u64, mpsc::Sender<ListenResponse>)>>,
    next_id: AtomicU64,
}

impl Default for ListenQueues {
    fn default() -> Self {
        Self {
            queues: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }
}

impl ListenQueues {
    /// Registers the Listen queue of a lease, replacing (and so ending) an earlier one.
    pub fn listen(&self, namespace: &str, lease: &str) -> (u64, mpsc::Receiver<ListenResponse>) {
        let (tx, rx) = mpsc::channel(LISTEN_QUEUE);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.queues
            .lock_or_recover()
            .insert((namespace.to_string(), lease.to_string()), (id, tx));
        (id, rx)
    }

    /// Removes a Listen queue if it is still the one registered as `id`.
    pub fn unlisten(&self, namespace: &str, lease: &str, id: u64) {
        let mut l = self.queues.lock_or_recover();
        let key = (namespace.to_string(), lease.to_string());
        if l.get(&key).is_some_and(|(i, _)| *i == id) {
            l.remove(&key);
        }
    }

    /// Hands a router connection to the exporter listening on a lease.
    pub fn notify(&self, namespace: &str, lease: &str, msg: ListenResponse) -> Result<(), Status> {
        let l = self.queues.lock_or_recover();
        let Some((_, tx)) = l.get(&(namespace.to_string(), lease.to_string())) else {
            return Err(Status::unavailable(format!(
                "exporter is not listening on lease {lease}"
            )));
        };
        tx.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                Status::resource_exhausted(format!("listen queue of lease {lease} is full"))
            }
            mpsc::error::TrySendError::Closed(_) => {
                Status::unavailable(format!("exporter is not listening on lease {lease}"))
            }
        })
    }
}
