//! Lease sharing (`spec.sharedWith`): who may do what with a lease, and the checks a list of
//! shared clients must pass.
//!
//! The rules, in one place:
//! - the owner (`spec.clientRef`) may do everything it always could;
//! - a client named in `spec.sharedWith` may read and list the lease, dial its exporter,
//!   change its times (extend it) and release it;
//! - only the owner transfers the lease or changes `spec.sharedWith`;
//! - any other client is told the lease does not exist (NOT_FOUND), as before sharing.
//!
//! Access policies are unchanged: they apply to the lease as its owner's.

use super::{Lease, selector::validate_dns1123_subdomain};

/// At most this many clients share one lease (upstream's pull request uses the same cap).
pub const MAX_SHARED_WITH: usize = 10;

/// How a client stands to a lease it may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAccess {
    /// The lease's owner (`spec.clientRef`).
    Owner,
    /// A client the owner shares the lease with (`spec.sharedWith`).
    Shared,
}

impl LeaseAccess {
    /// Whether this client may transfer the lease or change whom it is shared with.
    pub fn may_manage(self) -> bool {
        self == LeaseAccess::Owner
    }
}

impl Lease {
    /// How client `name` (of the lease's namespace) stands to this lease; `None`: it may not
    /// see it at all.
    pub fn access_of(&self, name: &str) -> Option<LeaseAccess> {
        if self.spec.client_ref.name == name {
            Some(LeaseAccess::Owner)
        } else if self.spec.shared_with.iter().any(|c| c == name) {
            Some(LeaseAccess::Shared)
        } else {
            None
        }
    }
}

/// A list of shared clients that cannot be stored; every message names the client at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// Not a valid client name.
    #[error("cannot share the lease with {name:?}: not a valid client name ({reason})")]
    InvalidName {
        /// The name as given.
        name: String,
        /// Why it is not valid.
        reason: String,
    },
    /// A client of another namespace.
    #[error(
        "cannot share the lease with {name:?}: a lease is shared only with clients of its own namespace {namespace:?}"
    )]
    OtherNamespace {
        /// The name as given.
        name: String,
        /// The lease's namespace.
        namespace: String,
    },
    /// The same client twice in one list.
    #[error("client {0:?} is named twice in the list of clients to share the lease with")]
    Duplicate(String),
    /// The owner itself.
    #[error("cannot share the lease with its owner {0:?}")]
    Owner(String),
    /// Too many clients.
    #[error("a lease is shared with at most {MAX_SHARED_WITH} clients, this would make {0}")]
    TooMany(usize),
    /// Removing a client the lease is not shared with.
    #[error("the lease is not shared with client {0:?}")]
    NotShared(String),
    /// The same client both added and removed in one change.
    #[error("client {0:?} is both added to and removed from the lease's shared clients")]
    AddedAndRemoved(String),
}

/// The short client names of `names` (each a short name or `namespaces/NS/clients/NAME` with
/// NS the lease's `namespace`), checked: valid, of this namespace, each once, not `owner`.
pub fn shared_names(
    names: &[String],
    namespace: &str,
    owner: &str,
) -> Result<Vec<String>, SharingError> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for given in names {
        let short = match given.split('/').collect::<Vec<_>>().as_slice() {
            [name] => *name,
            ["namespaces", ns, "clients", name] => {
                if *ns != namespace {
                    return Err(SharingError::OtherNamespace {
                        name: given.clone(),
                        namespace: namespace.to_string(),
                    });
                }
                *name
            }
            _ => {
                return Err(SharingError::InvalidName {
                    name: given.clone(),
                    reason: "give a client name, or namespaces/NAMESPACE/clients/NAME".into(),
                });
            }
        };
        validate_dns1123_subdomain(short).map_err(|reason| SharingError::InvalidName {
            name: given.clone(),
            reason,
        })?;
        if short == owner {
            return Err(SharingError::Owner(short.to_string()));
        }
        if out.iter().any(|c| c == short) {
            return Err(SharingError::Duplicate(short.to_string()));
        }
        out.push(short.to_string());
    }
    if out.len() > MAX_SHARED_WITH {
        return Err(SharingError::TooMany(out.len()));
    }
    Ok(out)
}

/// `current` with the (already checked, see [`shared_names`]) `add` and `remove` applied:
/// adding a client already there changes nothing; removing one not there is refused, so
/// that a misspelt name is noticed.
pub fn apply_share_changes(
    current: &[String],
    add: &[String],
    remove: &[String],
) -> Result<Vec<String>, SharingError> {
    if let Some(both) = add.iter().find(|a| remove.contains(a)) {
        return Err(SharingError::AddedAndRemoved(both.clone()));
    }
    if let Some(missing) = remove.iter().find(|r| !current.contains(r)) {
        return Err(SharingError::NotShared(missing.clone()));
    }
    let mut out: Vec<String> = current
        .iter()
        .filter(|c| !remove.contains(c))
        .cloned()
        .collect();
    for a in add {
        if !out.contains(a) {
            out.push(a.clone());
        }
    }
    if out.len() > MAX_SHARED_WITH {
        return Err(SharingError::TooMany(out.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::LeaseSpec;
    use k8s_openapi::api::core::v1::LocalObjectReference;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn owner_shared_and_others() {
        let lease = Lease::new(
            "l",
            LeaseSpec {
                client_ref: LocalObjectReference {
                    name: "alice".into(),
                },
                shared_with: names(&["bob"]),
                ..Default::default()
            },
        );
        assert_eq!(lease.access_of("alice"), Some(LeaseAccess::Owner));
        assert_eq!(lease.access_of("bob"), Some(LeaseAccess::Shared));
        assert_eq!(lease.access_of("carol"), None);
        assert!(LeaseAccess::Owner.may_manage());
        assert!(!LeaseAccess::Shared.may_manage());
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(
            shared_names(
                &names(&["bob", "namespaces/lab/clients/carol"]),
                "lab",
                "alice"
            ),
            Ok(names(&["bob", "carol"]))
        );
        assert!(matches!(
            shared_names(&names(&["Bob_1"]), "lab", "alice"),
            Err(SharingError::InvalidName { .. })
        ));
        assert!(matches!(
            shared_names(&names(&["a/b"]), "lab", "alice"),
            Err(SharingError::InvalidName { .. })
        ));
        assert!(matches!(
            shared_names(&names(&[""]), "lab", "alice"),
            Err(SharingError::InvalidName { .. })
        ));
        assert_eq!(
            shared_names(&names(&["namespaces/other/clients/bob"]), "lab", "alice"),
            Err(SharingError::OtherNamespace {
                name: "namespaces/other/clients/bob".into(),
                namespace: "lab".into()
            })
        );
        assert_eq!(
            shared_names(&names(&["bob", "bob"]), "lab", "alice"),
            Err(SharingError::Duplicate("bob".into()))
        );
        assert_eq!(
            shared_names(
                &names(&["bob", "namespaces/lab/clients/bob"]),
                "lab",
                "alice"
            ),
            Err(SharingError::Duplicate("bob".into()))
        );
        assert_eq!(
            shared_names(&names(&["alice"]), "lab", "alice"),
            Err(SharingError::Owner("alice".into()))
        );
        let many: Vec<String> = (0..=MAX_SHARED_WITH).map(|i| format!("c{i}")).collect();
        assert_eq!(
            shared_names(&many, "lab", "alice"),
            Err(SharingError::TooMany(MAX_SHARED_WITH + 1))
        );
    }

    #[test]
    fn changes_add_and_remove() {
        let cur = names(&["bob", "carol"]);
        assert_eq!(
            apply_share_changes(&cur, &names(&["dave", "bob"]), &names(&["carol"])),
            Ok(names(&["bob", "dave"]))
        );
        assert_eq!(
            apply_share_changes(&cur, &[], &names(&["erin"])),
            Err(SharingError::NotShared("erin".into()))
        );
        assert_eq!(
            apply_share_changes(&cur, &names(&["erin"]), &names(&["erin"])),
            Err(SharingError::AddedAndRemoved("erin".into()))
        );
        let full: Vec<String> = (0..MAX_SHARED_WITH).map(|i| format!("c{i}")).collect();
        assert_eq!(
            apply_share_changes(&full, &names(&["one-more"]), &[]),
            Err(SharingError::TooMany(MAX_SHARED_WITH + 1))
        );
    }
}
