//! The controller manager's garbage collector: dependents go with their last owner, or are orphaned or deleted
//! first as the owner's deletion asked (`propagationPolicy`). The store reads what is to be done in one pass
//! ([`Store::garbage`]); this acts on it.

use serde_json::Value;

use crate::route::{RESOURCES, Resource};
use crate::store::{FOREGROUND, Named, ORPHAN, Store};

/// An object's resource, namespace (`None` for a cluster-scoped one) and name.
fn located((group, plural, namespace, name): &Named) -> Option<(&'static Resource, Option<&str>, String)> {
    let r = RESOURCES.iter().find(|r| r.group == *group && r.plural == *plural)?;
    Some((r, Some(namespace.as_str()).filter(|n| !n.is_empty()), name.clone()))
}

/// The garbage collector, as the controller manager's: an object whose every owner (by `ownerReferences` UID) is
/// gone is deleted, a pod gracefully (its kubelet ends it first), as a Node's Lease goes with the Node; an owner
/// deleted with `propagationPolicy: Orphan` is taken out of its dependents' owner references, one deleted with
/// `Foreground` waits until the dependents that block it (`blockOwnerDeletion`) are gone; then the collector's
/// finalizer comes off it, and it goes.
pub fn collect(store: &Store) {
    let garbage = store.garbage();
    for orphan in &garbage.orphans {
        let Some((r, namespace, name)) = located(orphan) else { continue };
        match store.delete(r, namespace, &name, None, (None, None)) {
            Ok(_) => tracing::debug!(plural = r.plural, ?namespace, %name, "garbage collected: its owners are gone"),
            Err(e) => {
                tracing::debug!(plural = r.plural, ?namespace, %name, error = %e.message, "cannot collect garbage")
            }
        }
    }
    for (owner, uid, dependents) in &garbage.orphaning {
        for dependent in dependents {
            drop_from(store, dependent, "ownerReferences", |o| o["uid"] == uid.as_str());
        }
        drop_from(store, owner, "finalizers", |f| f == ORPHAN);
    }
    for (owner, uid, dependents) in &garbage.foreground {
        for d in dependents {
            if d.owned_elsewhere {
                drop_from(store, &d.named, "ownerReferences", |o| o["uid"] == uid.as_str());
            } else if let Some((r, namespace, name)) = located(&d.named) {
                let _ = store.delete(r, namespace, &name, None, (None, None));
            }
        }
        if !dependents.iter().any(|d| d.blocks && !d.owned_elsewhere) {
            drop_from(store, owner, "finalizers", |f| f == FOREGROUND);
        }
    }
}

/// Takes what `drop` picks out of the list `field` of an object's metadata (an owner reference, a finalizer): the
/// update that takes an object's last finalizer off also ends its deletion.
fn drop_from(store: &Store, object: &Named, field: &str, drop: impl Fn(&Value) -> bool) {
    let Some((r, namespace, name)) = located(object) else { return };
    let without = |old: &Value| {
        let mut new = old.clone();
        if let Some(list) = new["metadata"][field].as_array_mut() {
            list.retain(|v| !drop(v));
        }
        Ok(new)
    };
    let _ = store.update(r, namespace, &name, without, false);
}
