//! The objects, one process-wide resourceVersion counter, and the bounded history watches replay.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::route::Resource;
use crate::select::Selector;

/// The longest grace period honoured, in seconds (a year), so no deadline overflows.
const MAX_GRACE: i64 = 365 * 24 * 3600;

/// How many changes a watch can be resumed from.
pub const HISTORY: usize = 10_000;

/// An API error as the apiserver returns it: a `Status` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status code.
    pub code: u16,
    /// The machine-readable reason (`NotFound`, `AlreadyExists`, `Conflict`, ...).
    pub reason: &'static str,
    /// The message.
    pub message: String,
    /// The object's name and kind, when one is concerned.
    pub details: Option<(String, String)>,
    /// Causes (reason, message) for `details.causes`.
    pub causes: Vec<(String, String)>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// The error with `code` and `reason`.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code, reason, message: message.into(), details: None, causes: Vec::new() }
    }

    fn about(mut self, r: &Resource, name: &str) -> ApiError {
        self.details = Some((name.to_owned(), r.plural.to_owned()));
        self
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some((name, kind)) = &self.details {
            s["details"] = json!({"name": name, "kind": kind});
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> =
                self.causes.iter().map(|(reason, message)| json!({"reason": reason, "message": message})).collect();
            s["details"]["causes"] = json!(causes);
        }
        s
    }
}

/// The resource as the apiserver's messages name it: `pods`, `leases.coordination.k8s.io`.
fn qualified(r: &Resource) -> String {
    if r.group.is_empty() { r.plural.to_owned() } else { format!("{}.{}", r.plural, r.group) }
}

fn not_found(r: &Resource, name: &str) -> ApiError {
    ApiError::new(404, "NotFound", format!("{} \"{name}\" not found", qualified(r))).about(r, name)
}

/// The 409 of a write against a stale resourceVersion.
pub(crate) fn conflict(r: &Resource, name: &str) -> ApiError {
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            qualified(r)
        ),
    )
    .about(r, name)
}

/// A UID precondition (a delete's, or a patch's `metadata.uid`) that is not the stored object's is a 409.
fn check_uid(r: &Resource, name: &str, uid: Option<&str>, stored: &Value) -> Result<(), ApiError> {
    let have = stored["metadata"]["uid"].as_str().unwrap_or("");
    match uid {
        Some(uid) if uid != have => Err(ApiError::new(
            409,
            "Conflict",
            format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
        )
        .about(r, name)),
        _ => Ok(()),
    }
}

/// An object's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    group: &'static str,
    plural: &'static str,
    namespace: String,
    name: String,
}

impl Key {
    /// The key of `name` in `namespace` (empty for cluster-scoped).
    pub fn new(r: &Resource, namespace: Option<&str>, name: &str) -> Key {
        Key { group: r.group, plural: r.plural, namespace: namespace.unwrap_or("").to_owned(), name: name.to_owned() }
    }

    /// Whether this is an object of `r` in `namespace` (any, if `None`).
    fn is_of(&self, r: &Resource, namespace: Option<&str>) -> bool {
        self.group == r.group && self.plural == r.plural && namespace.is_none_or(|ns| self.namespace == ns)
    }
}

/// A deletion's `propagationPolicy`: what becomes of the objects the deleted one owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Deleted at once; the garbage collector deletes its dependents after it (the default).
    Background,
    /// Held until the garbage collector has deleted the dependents that block their owner's deletion.
    Foreground,
    /// Held until the garbage collector has taken it out of its dependents' owner references.
    Orphan,
}

/// The garbage collector's finalizers.
pub const ORPHAN: &str = "orphan";
/// See [`ORPHAN`].
pub const FOREGROUND: &str = "foregroundDeletion";

impl Propagation {
    /// From a `DeleteOptions`' `propagationPolicy` (or its deprecated `orphanDependents`); an unknown policy is a
    /// 422 as the apiserver's validation has it.
    pub fn of(options: &Value) -> Result<Propagation, ApiError> {
        match (options["propagationPolicy"].as_str(), options["orphanDependents"].as_bool()) {
            (Some(_), Some(_)) => Err(ApiError::new(
                422,
                "Invalid",
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"null\": orphanDependents and deletionPropagation cannot be both set",
            )),
            (None | Some(""), None | Some(false)) | (Some("Background"), None) => Ok(Propagation::Background),
            (Some("Foreground"), None) => Ok(Propagation::Foreground),
            (Some("Orphan"), None) | (None, Some(true)) => Ok(Propagation::Orphan),
            (Some(other), None) => Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                ),
            )),
        }
    }

    fn finalizer(self) -> Option<&'static str> {
        match self {
            Propagation::Background => None,
            Propagation::Foreground => Some(FOREGROUND),
            Propagation::Orphan => Some(ORPHAN),
        }
    }
}

/// An object by `(group, plural, namespace, name)`, the namespace empty for a cluster-scoped one.
pub type Named = (&'static str, &'static str, String, String);

/// What the garbage collector has to do, read in one pass over the store.
#[derive(Debug, Default)]
pub struct Garbage {
    /// Objects whose every owner is gone, not being deleted yet.
    pub orphans: Vec<Named>,
    /// Owners being deleted with the `orphan` finalizer, by UID, with their dependents.
    pub orphaning: Vec<(Named, String, Vec<Named>)>,
    /// Owners being deleted with the `foregroundDeletion` finalizer, by UID, with their dependents.
    pub foreground: Vec<(Named, String, Vec<Dependent>)>,
}

/// A dependent of an owner being deleted in the foreground.
#[derive(Debug)]
pub struct Dependent {
    /// The object.
    pub named: Named,
    /// Whether it holds up the owner's deletion (`blockOwnerDeletion`).
    pub blocks: bool,
    /// Whether another owner of it is there and not being deleted: it is not deleted, only no longer owned by the
    /// one being deleted, as the collector keeps an object with an owner left.
    pub owned_elsewhere: bool,
}

/// One change, as a watch sends it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion the change made.
    pub rv: u64,
    /// The object's identity.
    pub key: Key,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The object after the change (the last state for `DELETED`).
    pub object: Value,
    /// The object before the change (a modification or a deletion), as it was stored.
    pub old: Option<Value>,
}

#[derive(Debug, Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Change>>,
    /// Watches must start at or after this resourceVersion.
    oldest: u64,
    uid: u64,
}

/// The object store.
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Arc<Change>>,
}

impl Default for Store {
    fn default() -> Store {
        Store { inner: Mutex::new(Inner::default()), changes: broadcast::channel(HISTORY).0 }
    }
}

/// The time in the apiserver's format, at second precision.
pub fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn rv_of(v: &Value) -> Option<&str> {
    v["metadata"]["resourceVersion"].as_str().filter(|s| !s.is_empty())
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    fn record(&self, inner: &mut Inner, key: Key, kind: &'static str, object: Value, old: Option<Value>) {
        let change = Arc::new(Change { rv: inner.rv, key, kind, object, old });
        inner.history.push_back(change.clone());
        while inner.history.len() > HISTORY {
            if let Some(c) = inner.history.pop_front() {
                inner.oldest = c.rv;
            }
        }
        let _ = self.changes.send(change);
    }

    /// One object.
    pub fn get(&self, r: &Resource, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.lock().objects.get(&Key::new(r, namespace, name)).cloned().ok_or_else(|| not_found(r, name))
    }

    /// The objects of `r` in `namespace` (all namespaces if `None`) that match, with the list's resourceVersion.
    pub fn list(&self, r: &Resource, namespace: Option<&str>, selector: &Selector) -> (Vec<Value>, u64) {
        self.scan(r, namespace, |v| selector.matches(v).then(|| v.clone()))
    }

    /// The objects of `r` in `namespace` that match `selector` as they were at resourceVersion `rv`, as etcd reads
    /// at a revision: the current ones with the history after `rv` undone. `Err(oldest)` when `rv` is older than
    /// the history reaches (compacted away).
    pub fn list_at(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        selector: &Selector,
        rv: u64,
    ) -> Result<Vec<Value>, u64> {
        let inner = self.lock();
        if rv < inner.oldest {
            return Err(inner.oldest);
        }
        let mut at: BTreeMap<&Key, &Value> = inner.objects.iter().filter(|(k, _)| k.is_of(r, namespace)).collect();
        for c in inner.history.iter().rev().take_while(|c| c.rv > rv).filter(|c| concerns(c, r, namespace)) {
            match (c.kind, &c.old) {
                ("ADDED", _) => {
                    at.remove(&c.key);
                }
                ("MODIFIED", Some(old)) => {
                    at.insert(&c.key, old);
                }
                ("DELETED", old) => {
                    at.insert(&c.key, old.as_ref().unwrap_or(&c.object));
                }
                _ => {}
            }
        }
        Ok(at.into_values().filter(|v| selector.matches(v)).cloned().collect())
    }

    /// What the garbage collector has to do, in one read of the whole store, so that an owner made with its
    /// dependent is seen with it.
    pub fn garbage(&self) -> Garbage {
        let inner = self.lock();
        let named = |k: &Key| (k.group, k.plural, k.namespace.clone(), k.name.clone());
        // Every UID, and whether its object is being deleted.
        let uids: HashMap<&str, bool> =
            inner.objects.values().filter_map(|o| Some((o["metadata"]["uid"].as_str()?, deleting(o)))).collect();
        let mut garbage = Garbage::default();
        for (k, o) in &inner.objects {
            let refs = owner_refs(o);
            let gone = |owner: &Value| owner["uid"].as_str().is_none_or(|u| !uids.contains_key(u));
            if !refs.is_empty() && refs.iter().all(gone) && !deleting(o) {
                garbage.orphans.push(named(k));
            }
            if !deleting(o) {
                continue;
            }
            let fins = finalizers(o);
            let Some(uid) = o["metadata"]["uid"].as_str() else { continue };
            let dependents = || {
                inner.objects.iter().filter_map(|(dk, d)| {
                    let refs = owner_refs(d);
                    let owned = refs.iter().find(|r| r["uid"] == uid)?;
                    let live = |r: &Value| r["uid"].as_str().is_some_and(|u| u != uid && uids.get(u) == Some(&false));
                    let owned_elsewhere = refs.iter().any(live);
                    Some(Dependent { named: named(dk), blocks: owned["blockOwnerDeletion"] == true, owned_elsewhere })
                })
            };
            if fins.contains(&ORPHAN) {
                garbage.orphaning.push((named(k), uid.to_owned(), dependents().map(|d| d.named).collect()));
            } else if fins.contains(&FOREGROUND) {
                garbage.foreground.push((named(k), uid.to_owned(), dependents().collect()));
            }
        }
        garbage
    }

    /// What `f` makes of each object of `r` in `namespace` (all namespaces if `None`), read in place, with the
    /// resourceVersion: nothing is copied that `f` does not copy, so a caller after one fact of a hundred pods
    /// (the authorizer's graph, a bench polling for Running) does not copy a hundred pods.
    pub fn scan<T>(&self, r: &Resource, namespace: Option<&str>, f: impl FnMut(&Value) -> Option<T>) -> (Vec<T>, u64) {
        let inner = self.lock();
        let items = inner.objects.iter().filter(|(k, _)| k.is_of(r, namespace)).map(|(_, v)| v).filter_map(f).collect();
        (items, inner.rv)
    }

    /// Creates `object`: 409 AlreadyExists for a name in use; the server sets uid, creationTimestamp,
    /// resourceVersion and generation.
    pub fn create(&self, r: &Resource, namespace: Option<&str>, mut object: Value) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        // A generated name is made before admission (`State::create`), so that validation sees it.
        let Some(name) = object["metadata"]["name"].as_str().filter(|n| !n.is_empty()).map(str::to_owned) else {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("{} \"\" is invalid: metadata.name: Required value", r.kind),
            ));
        };
        if let Some(ns) = namespace {
            match object["metadata"]["namespace"].as_str() {
                Some(other) if !other.is_empty() && other != ns => {
                    return Err(ApiError::new(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => object["metadata"]["namespace"] = json!(ns),
            }
        }
        if rv_of(&object).is_some() {
            return Err(ApiError::new(400, "BadRequest", "resourceVersion should not be set on objects to be created"));
        }
        let key = Key::new(r, namespace, &name);
        if inner.objects.contains_key(&key) {
            return Err(ApiError::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", qualified(r)))
                .about(r, &name));
        }
        inner.rv += 1;
        inner.uid += 1;
        let m = &mut object["metadata"];
        m["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", inner.uid));
        m["creationTimestamp"] = json!(now());
        m["resourceVersion"] = json!(inner.rv.to_string());
        m["generation"] = json!(1);
        if let Value::Object(o) = m {
            o.remove("deletionTimestamp");
            o.remove("deletionGracePeriodSeconds");
        }
        object["apiVersion"] = json!(r.api_version());
        object["kind"] = json!(r.kind);
        inner.objects.insert(key.clone(), object.clone());
        self.record(&mut inner, key, "ADDED", object.clone(), None);
        Ok(object)
    }

    /// Replaces an object (PUT) or, with `status`, only its status. A resourceVersion in `object` that is not the
    /// stored one is a 409 Conflict; `guard` sees the stored object and the proposed one first.
    pub fn replace(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        name: &str,
        object: Value,
        status: bool,
        guard: &dyn Fn(&Value, &Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        self.update(
            r,
            namespace,
            name,
            |old| {
                guard(old, &object)?;
                if let Some(rv) = rv_of(&object)
                    && Some(rv) != rv_of(old)
                {
                    return Err(conflict(r, name));
                }
                if object["metadata"]["name"].as_str().is_some_and(|n| n != name) {
                    return Err(ApiError::new(
                        400,
                        "BadRequest",
                        "the name of the object does not match the name on the URL",
                    ));
                }
                Ok(object)
            },
            status,
        )
    }

    /// Applies `f` to the stored object; the result is stored with the server-owned fields kept: identity,
    /// creation time, the deletion marks and (unless it is a status write) the status. A status write takes
    /// the proposed object but keeps the stored spec (and, for pods, the owner references and a `qosClass` the
    /// write leaves out), as the registry's status strategies do. An update that leaves an object being deleted
    /// with no finalizers and no grace period pending deletes it.
    pub fn update(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        name: &str,
        f: impl FnOnce(&Value) -> Result<Value, ApiError>,
        status: bool,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = Key::new(r, namespace, name);
        let old = inner.objects.get(&key).cloned().ok_or_else(|| not_found(r, name))?;
        let proposed = f(&old)?;
        check_uid(r, name, proposed["metadata"]["uid"].as_str(), &old)?;
        let mut new = proposed;
        if status {
            set_or_remove(&mut new, "spec", old.get("spec"));
            if r.kind == "Pod" {
                set_or_remove(&mut new["metadata"], "ownerReferences", old["metadata"].get("ownerReferences"));
                if new["status"]["qosClass"].is_null() && !old["status"]["qosClass"].is_null() {
                    new["status"]["qosClass"] = old["status"]["qosClass"].clone();
                }
            }
        } else if r.has_status() {
            set_or_remove(&mut new, "status", old.get("status"));
        }
        for field in
            ["uid", "creationTimestamp", "namespace", "name", "deletionTimestamp", "deletionGracePeriodSeconds"]
        {
            set_or_remove(&mut new["metadata"], field, old["metadata"].get(field));
        }
        if deleting(&old) {
            let added: Vec<&str> = finalizers(&new).into_iter().filter(|f| !finalizers(&old).contains(f)).collect();
            if !added.is_empty() {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "{} \"{name}\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}",
                        r.kind
                    ),
                ));
            }
        }
        new["apiVersion"] = json!(r.api_version());
        new["kind"] = json!(r.kind);
        let spec_changed = !status && new.get("spec") != old.get("spec");
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1) + i64::from(spec_changed);
        new["metadata"]["generation"] = json!(generation);
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if new == old {
            // A write that changes nothing makes no new resourceVersion, as the real apiserver's.
            return Ok(old);
        }
        inner.rv += 1;
        new["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        // `shouldDeleteDuringUpdate`: the update took the last finalizer off an object being deleted, with no
        // grace period left to run.
        // A namespace waits for the namespace controller, which removes it once it is empty.
        if deleting(&old)
            && !finalizers(&old).is_empty()
            && finalizers(&new).is_empty()
            && pending_grace(&new) == 0
            && r.kind != "Namespace"
        {
            inner.objects.remove(&key);
            self.record(&mut inner, key, "DELETED", new.clone(), Some(old));
            return Ok(new);
        }
        inner.objects.insert(key.clone(), new.clone());
        self.record(&mut inner, key, "MODIFIED", new.clone(), Some(old));
        Ok(new)
    }

    /// Deletes an object, as the registry's `BeforeDelete` and the pod strategy decide. A pod bound to a node and
    /// not terminal is deleted gracefully (its grace from the request, else its spec's, else 30 s): it gets a
    /// `deletionTimestamp` and stays. An object being deleted only ever gets a shorter grace period (a delete
    /// without one leaves the pending one alone). An object with finalizers stays, marked, until an update takes
    /// the last one away. `gone` in the answer says the object was removed.
    pub fn delete(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        name: &str,
        grace: Option<i64>,
        preconditions: (Option<String>, Option<String>),
    ) -> Result<Deleted, ApiError> {
        self.delete_propagating(r, namespace, name, grace, preconditions, Propagation::Background)
    }

    /// [`Store::delete`] with a `propagationPolicy`: `Orphan` and `Foreground` hold the object with the
    /// garbage collector's finalizer (`orphan`, `foregroundDeletion`) until the collector has orphaned or deleted
    /// its dependents, as the registry's `BeforeDelete` sets them.
    pub fn delete_propagating(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        name: &str,
        grace: Option<i64>,
        preconditions: (Option<String>, Option<String>),
        propagation: Propagation,
    ) -> Result<Deleted, ApiError> {
        let mut inner = self.lock();
        let key = Key::new(r, namespace, name);
        let stored = inner.objects.get(&key).cloned().ok_or_else(|| not_found(r, name))?;
        let (uid, rv) = preconditions;
        check_uid(r, name, uid.as_deref(), &stored)?;
        if let Some(rv) = rv
            && Some(rv.as_str()) != rv_of(&stored)
        {
            return Err(conflict(r, name));
        }
        // The collector's finalizer is part of the deletion's change: the history keeps the object as stored.
        let mut old = stored.clone();
        if let Some(f) = propagation.finalizer()
            && !deleting(&old)
            && !finalizers(&old).contains(&f)
        {
            let list = old["metadata"]["finalizers"].as_array().cloned().unwrap_or_default();
            old["metadata"]["finalizers"] = Value::Array(list.into_iter().chain([json!(f)]).collect());
        }
        // A negative grace period is taken as 1 s, as the registry's `BeforeDelete` takes it.
        let grace = grace.map(|g| if g < 0 { 1 } else { g });
        let pending = |object: Value| Ok(Deleted { object, gone: false });
        let namespace = r.kind == "Namespace";
        let period;
        // When the deletion was first asked: a shorter grace moves the deadline from there.
        let asked = if deleting(&old) {
            let current = pending_grace(&old);
            match grace {
                Some(g) if g < current => {
                    period = g;
                    let t: Option<jiff::Timestamp> =
                        old["metadata"]["deletionTimestamp"].as_str().and_then(|t| t.parse().ok());
                    t.and_then(|t| t.checked_sub(jiff::SignedDuration::from_secs(current)).ok())
                        .unwrap_or_else(jiff::Timestamp::now)
                }
                // The pending deletion stands: a delete asks for nothing longer.
                _ if current > 0 || !finalizers(&old).is_empty() || namespace => return pending(old),
                _ => {
                    period = 0;
                    jiff::Timestamp::now()
                }
            }
        } else {
            period = if r.kind == "Pod" {
                let bound = old["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
                let terminal = matches!(old["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
                let spec = old["spec"]["terminationGracePeriodSeconds"].as_i64().map(|g| if g < 0 { 1 } else { g });
                let asked_for = grace.or(spec).unwrap_or(30);
                if bound && !terminal { asked_for.min(MAX_GRACE) } else { 0 }
            } else {
                0
            };
            jiff::Timestamp::now()
        };
        // A namespace is held by its spec's finalizers until the namespace controller has emptied it.
        if period > 0 || !finalizers(&old).is_empty() || namespace {
            let at = asked.checked_add(jiff::SignedDuration::from_secs(period)).unwrap_or(asked);
            let mut new = old.clone();
            new["metadata"]["deletionTimestamp"] = json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
            if namespace {
                new["status"]["phase"] = json!("Terminating");
            } else {
                new["metadata"]["deletionGracePeriodSeconds"] = json!(period);
            }
            inner.rv += 1;
            new["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            inner.objects.insert(key.clone(), new.clone());
            self.record(&mut inner, key, "MODIFIED", new.clone(), Some(stored));
            return pending(new);
        }
        inner.objects.remove(&key);
        inner.rv += 1;
        let mut last = old;
        last["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        self.record(&mut inner, key, "DELETED", last.clone(), Some(stored));
        Ok(Deleted { object: last, gone: true })
    }

    /// Changes an object as a registry's own subresource does (a binding), without the update strategy: `f`
    /// edits it in place; identity and kind stay.
    pub fn write(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = Key::new(r, namespace, name);
        let old = inner.objects.get(&key).cloned().ok_or_else(|| not_found(r, name))?;
        let mut new = old.clone();
        f(&mut new)?;
        inner.rv += 1;
        new["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        inner.objects.insert(key.clone(), new.clone());
        self.record(&mut inner, key, "MODIFIED", new.clone(), Some(old));
        Ok(new)
    }

    /// Removes an object whatever holds it (the namespace controller's last step).
    pub fn remove(&self, r: &Resource, namespace: Option<&str>, name: &str) {
        let mut inner = self.lock();
        let key = Key::new(r, namespace, name);
        if let Some(stored) = inner.objects.remove(&key) {
            inner.rv += 1;
            let mut last = stored.clone();
            last["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            self.record(&mut inner, key, "DELETED", last, Some(stored));
        }
    }

    /// The changes after `rv` for `r` (and `namespace`) and a receiver for the later ones, taken under one lock
    /// so none is missed; `Err(oldest)` when `rv` is older than the history kept.
    #[expect(clippy::type_complexity)]
    pub fn watch_from(
        &self,
        r: &Resource,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<(Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>), u64> {
        let inner = self.lock();
        if rv < inner.oldest {
            return Err(inner.oldest);
        }
        let replay = inner.history.iter().filter(|c| c.rv > rv && concerns(c, r, namespace)).cloned().collect();
        Ok((replay, self.changes.subscribe()))
    }

    /// Forgets the history of changes: watches from any earlier resourceVersion get 410 Expired.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.oldest = inner.rv;
    }
}

/// What a delete did.
#[derive(Debug, Clone)]
pub struct Deleted {
    /// The object: its last state if it is gone, else as it is now (marked for deletion).
    pub object: Value,
    /// True when the object was removed; false when a grace period or finalizers keep it for now.
    pub gone: bool,
}

/// Sets `field` of the object `v` to `to`, or removes it when `to` is `None`.
fn set_or_remove(v: &mut Value, field: &str, to: Option<&Value>) {
    match (to, v) {
        (Some(to), v) => v[field] = to.clone(),
        (None, Value::Object(o)) => {
            o.remove(field);
        }
        (None, _) => {}
    }
}

/// True when the object carries a `deletionTimestamp`.
pub fn deleting(v: &Value) -> bool {
    v["metadata"]["deletionTimestamp"].as_str().is_some_and(|t| !t.is_empty())
}

/// The object's finalizers.
pub fn finalizers(v: &Value) -> Vec<&str> {
    v["metadata"]["finalizers"].as_array().map(|f| f.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// The grace period of a pending deletion, in seconds (0 when none is pending).
fn pending_grace(v: &Value) -> i64 {
    v["metadata"]["deletionGracePeriodSeconds"].as_i64().unwrap_or(0)
}

/// An object's `ownerReferences`, read in place.
fn owner_refs(v: &Value) -> &[Value] {
    v["metadata"]["ownerReferences"].as_array().map_or(&[], Vec::as_slice)
}

/// True when `change` is about an object of `r` in `namespace` (any, if `None`).
pub fn concerns(change: &Change, r: &Resource, namespace: Option<&str>) -> bool {
    change.key.is_of(r, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RESOURCES;

    fn pods() -> &'static Resource {
        RESOURCES.iter().find(|r| r.plural == "pods").unwrap()
    }

    #[test]
    fn writes_follow_the_apiserver_rules() {
        let s = Store::default();
        let r = pods();
        let p = s.create(r, Some("default"), json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n"}})).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "1");
        assert_eq!(
            s.create(r, Some("default"), json!({"metadata": {"name": "p"}})).unwrap_err().reason,
            "AlreadyExists"
        );
        // A stale resourceVersion conflicts; status is not written through the main resource.
        let mut stale = p.clone();
        stale["status"] = json!({"phase": "Running"});
        let ok = |_: &Value, _: &Value| Ok(());
        let v = s.replace(r, Some("default"), "p", stale.clone(), false, &ok).unwrap();
        assert!(v["status"].is_null());
        assert_eq!(v["metadata"]["resourceVersion"], "1", "nothing changed, no new resourceVersion");
        let v = s.replace(r, Some("default"), "p", stale.clone(), true, &ok).unwrap();
        assert_eq!(v["status"]["phase"], "Running");
        assert_eq!(s.replace(r, Some("default"), "p", stale, true, &ok).unwrap_err().reason, "Conflict");
        // A graceful delete marks the pod; a shorter grace moves it; grace 0 removes it.
        let d = s.delete(r, Some("default"), "p", Some(30), (None, None)).unwrap();
        assert!(!d.gone);
        assert_eq!(d.object["metadata"]["deletionGracePeriodSeconds"], 30);
        let d = s.delete(r, Some("default"), "p", Some(60), (None, None)).unwrap();
        assert_eq!(d.object["metadata"]["deletionGracePeriodSeconds"], 30, "a grace period never grows");
        let d = s.delete(r, Some("default"), "p", None, (None, None)).unwrap();
        assert_eq!(d.object["metadata"]["deletionGracePeriodSeconds"], 30, "a delete without grace keeps it");
        assert_eq!(s.delete(r, Some("default"), "p", Some(0), (Some("x".into()), None)).unwrap_err().code, 409);
        s.delete(r, Some("default"), "p", Some(0), (None, None)).unwrap();
        assert_eq!(s.get(r, Some("default"), "p").unwrap_err().code, 404);
        let (replay, _) = s.watch_from(r, None, 0).unwrap();
        let kinds: Vec<_> = replay.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]);
        s.compact();
        assert!(s.watch_from(r, None, 2).is_err());
    }

    #[test]
    fn a_propagation_policy_is_read_as_the_apiserver_validates_it() {
        let of = |v: Value| Propagation::of(&v).map_err(|e| e.code);
        assert_eq!(of(json!({})), Ok(Propagation::Background));
        assert_eq!(of(json!({"propagationPolicy": "Foreground"})), Ok(Propagation::Foreground));
        assert_eq!(of(json!({"propagationPolicy": "Orphan"})), Ok(Propagation::Orphan));
        assert_eq!(of(json!({"orphanDependents": true})), Ok(Propagation::Orphan));
        assert_eq!(of(json!({"orphanDependents": false})), Ok(Propagation::Background));
        assert_eq!(of(json!({"propagationPolicy": "Sideways"})), Err(422));
        assert_eq!(of(json!({"propagationPolicy": "Orphan", "orphanDependents": true})), Err(422));
    }
}
