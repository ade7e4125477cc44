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
    let drop_finalizer = |owner: &Named, finalizer: &str| {
        let Some((r, namespace, name)) = located(owner) else { return };
        let _ = store.update(
            r,
            namespace,
            &name,
            |old| {
                let mut new = old.clone();
                if let Some(list) = new["metadata"]["finalizers"].as_array_mut() {
                    list.retain(|f| f != finalizer);
                }
                Ok(new)
            },
            false,
        );
    };
    // Takes `uid` out of an object's owner references.
    let disown = |dependent: &Named, uid: &str| {
        let Some((r, namespace, name)) = located(dependent) else { return };
        let orphaned = |old: &Value| {
            let mut new = old.clone();
            if let Some(refs) = new["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|o| o["uid"] != uid);
            }
            Ok(new)
        };
        let _ = store.update(r, namespace, &name, orphaned, false);
    };
    for (owner, uid, dependents) in &garbage.orphaning {
        for dependent in dependents {
            disown(dependent, uid);
        }
        drop_finalizer(owner, ORPHAN);
    }
    for (owner, uid, dependents) in &garbage.foreground {
        for d in dependents {
            if d.owned_elsewhere {
                disown(&d.named, uid);
            } else if let Some((r, namespace, name)) = located(&d.named) {
                let _ = store.delete(r, namespace, &name, None, (None, None));
            }
        }
        if !dependents.iter().any(|d| d.blocks && !d.owned_elsewhere) {
            drop_finalizer(owner, FOREGROUND);
        }
    }
}
