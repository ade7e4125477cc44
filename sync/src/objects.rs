//! The API objects a pod's volumes and environment read (ConfigMaps, Secrets, service account tokens) and the port
//! they come through ([`PodObjects`], implemented by the daemon: from the apiserver once the node is in a cluster,
//! from nowhere on a node of static pods only).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::future::BoxFuture;

/// A kind of object a pod references by name in its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// A `v1.ConfigMap`.
    ConfigMap,
    /// A `v1.Secret`.
    Secret,
}

impl ObjectKind {
    /// The word the kubelet's messages use: `configmap "x" not found`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
        }
    }

    /// The kind's name: `ConfigMap`, `Secret`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }
}

/// What a ConfigMap or Secret holds. Its values may be secret: `Debug` shows the keys only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ObjectData {
    /// Every key with its bytes: a ConfigMap's `data` and `binaryData`, a Secret's `data`.
    pub data: BTreeMap<String, Vec<u8>>,
    /// The keys that came from a ConfigMap's `binaryData`: projected into volumes, never into the environment.
    pub binary: BTreeSet<String>,
}

impl std::fmt::Debug for ObjectData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectData").field("keys", &self.data.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

impl ObjectData {
    /// The value an environment variable reads from `key` (a ConfigMap's `data`, a Secret's `data`).
    pub fn env_value(&self, key: &str) -> Option<String> {
        if self.binary.contains(key) {
            return None;
        }
        self.data.get(key).map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// A service account token to ask for: the kubelet's TokenRequest, bound to the pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenAsk {
    /// The pod's namespace.
    pub namespace: String,
    /// Its service account.
    pub service_account: String,
    /// The audience; `None` for the apiserver's own.
    pub audience: Option<String>,
    /// `expirationSeconds`.
    pub expiration_seconds: i64,
    /// The pod the token is bound to.
    pub pod_name: String,
    /// Its UID.
    pub pod_uid: String,
}

/// A service account token. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The token.
    pub token: String,
    /// When it expires.
    pub expires: jiff::Timestamp,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token").field("expires", &self.expires).finish_non_exhaustive()
    }
}

/// A Service as the environment of a container names it (the kubelet's service links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAddress {
    /// The Service's name.
    pub name: String,
    /// Its cluster IP.
    pub cluster_ip: String,
    /// Its ports, the first one first.
    pub ports: Vec<ServicePort>,
}

/// One port of a [`ServiceAddress`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Its name; empty when it has none.
    pub name: String,
    /// The port.
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
}

/// Why an object could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The node is in no cluster: there is nowhere to read objects from.
    #[error("couldn't get {kind} {namespace}/{name}, no kubeClient defined")]
    NoClient {
        /// `configMap`, `secret` or `serviceAccountToken`, as the kubelet words it.
        kind: &'static str,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// The apiserver answered with an error, or did not answer.
    #[error("{0}")]
    Api(String),
}

/// A future of the port.
pub type ObjectFuture<'a, T> = BoxFuture<'a, Result<T, ObjectError>>;

/// Where pod sync gets the objects its pods reference: the daemon's side implements it, with a cache of its own
/// (the kubelet's `Cache` strategy) and a token manager that renews a token before it expires.
pub trait PodObjects: Send + Sync + 'static {
    /// The object `name` of `kind` in `namespace`; `None` when it does not exist.
    fn object<'a>(
        &'a self,
        kind: ObjectKind,
        namespace: &'a str,
        name: &'a str,
    ) -> ObjectFuture<'a, Option<Arc<ObjectData>>>;

    /// A token for `ask`: the one already issued while it is fresh, else a new one.
    fn token<'a>(&'a self, ask: &'a TokenAsk) -> ObjectFuture<'a, Token>;

    /// The Services of `namespace`, which containers' environments name (the kubelet's service links; the
    /// apiserver's own, `default/kubernetes`, whose `KUBERNETES_SERVICE_HOST` in-cluster clients read, in every
    /// one). None for a node in no cluster, as a kubelet without a client adds none.
    fn services<'a>(&'a self, namespace: &'a str) -> ObjectFuture<'a, Vec<ServiceAddress>> {
        let _ = namespace;
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// The pod `uid` is gone: what was kept for it (its tokens) may go.
    fn forget_pod(&self, _uid: &str) {}
}

/// The port of a node in no cluster: every object is out of reach, with the kubelet's message.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObjects;

impl PodObjects for NoObjects {
    fn object<'a>(
        &'a self,
        kind: ObjectKind,
        namespace: &'a str,
        name: &'a str,
    ) -> ObjectFuture<'a, Option<Arc<ObjectData>>> {
        let kind = match kind {
            ObjectKind::ConfigMap => "configMap",
            ObjectKind::Secret => "secret",
        };
        let e = ObjectError::NoClient { kind, namespace: namespace.to_owned(), name: name.to_owned() };
        Box::pin(std::future::ready(Err(e)))
    }

    fn token<'a>(&'a self, ask: &'a TokenAsk) -> ObjectFuture<'a, Token> {
        let e = ObjectError::NoClient {
            kind: "serviceAccountToken",
            namespace: ask.namespace.clone(),
            name: ask.service_account.clone(),
        };
        Box::pin(std::future::ready(Err(e)))
    }
}

/// The objects one use of a pod read (a container start, a volume refresh), by kind and name: each fetched once,
/// as the kubelet's per-call maps; a failed fetch is kept as its message.
pub type ObjectMap = BTreeMap<(ObjectKind, String), Result<Option<Arc<ObjectData>>, String>>;

/// The object `name` of `kind` from `map`: `None` when it is missing and `optional`; the kubelet's
/// `configmap "x" not found` when it is missing and not.
pub(crate) fn lookup(
    map: &ObjectMap,
    kind: ObjectKind,
    name: &str,
    optional: bool,
) -> Result<Option<Arc<ObjectData>>, String> {
    match map.get(&(kind, name.to_owned())) {
        Some(Ok(Some(o))) => Ok(Some(o.clone())),
        Some(Ok(None)) if optional => Ok(None),
        Some(Ok(None)) => Err(format!("{} {name:?} not found", kind.as_str())),
        Some(Err(e)) => Err(e.clone()),
        None => Err(format!("{} {name:?} was not fetched", kind.as_str())),
    }
}

/// Fetches what `map` lacks of `refs` through `port`.
pub(crate) async fn fetch_into(
    port: &dyn PodObjects,
    namespace: &str,
    refs: impl IntoIterator<Item = (ObjectKind, String)>,
    map: &mut ObjectMap,
) {
    for (kind, name) in refs {
        if map.contains_key(&(kind, name.clone())) {
            continue;
        }
        let got = port.object(kind, namespace, &name).await.map_err(|e| e.to_string());
        map.insert((kind, name), got);
    }
}

/// The objects a pod's volumes read, fetched on first use.
pub(crate) struct Fetched<'a> {
    port: &'a dyn PodObjects,
    namespace: &'a str,
    got: ObjectMap,
}

impl<'a> Fetched<'a> {
    /// Nothing fetched yet, for a pod of `namespace`.
    pub(crate) fn new(port: &'a dyn PodObjects, namespace: &'a str) -> Self {
        Self { port, namespace, got: ObjectMap::new() }
    }

    /// The object, as [`lookup`] finds it once fetched.
    pub(crate) async fn maybe(
        &mut self,
        kind: ObjectKind,
        name: &str,
        optional: bool,
    ) -> Result<Option<Arc<ObjectData>>, String> {
        fetch_into(self.port, self.namespace, [(kind, name.to_owned())], &mut self.got).await;
        lookup(&self.got, kind, name, optional)
    }

    /// The port, for tokens.
    pub(crate) fn port(&self) -> &'a dyn PodObjects {
        self.port
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A port of objects held in memory, for tests.
    use super::*;
    use std::sync::Mutex;

    /// Objects by (kind, namespace, name); tokens issued with a counter.
    #[derive(Default)]
    pub(crate) struct MemObjects {
        pub objects: Mutex<BTreeMap<(ObjectKind, String, String), Arc<ObjectData>>>,
        pub tokens: Mutex<Vec<TokenAsk>>,
    }

    impl MemObjects {
        pub(crate) fn put(&self, kind: ObjectKind, ns: &str, name: &str, data: &[(&str, &str)]) {
            let data = ObjectData {
                data: data.iter().map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec())).collect(),
                binary: BTreeSet::new(),
            };
            self.objects.lock().unwrap().insert((kind, ns.into(), name.into()), Arc::new(data));
        }
    }

    impl PodObjects for MemObjects {
        fn object<'a>(
            &'a self,
            kind: ObjectKind,
            namespace: &'a str,
            name: &'a str,
        ) -> ObjectFuture<'a, Option<Arc<ObjectData>>> {
            let o = self.objects.lock().unwrap().get(&(kind, namespace.into(), name.into())).cloned();
            Box::pin(std::future::ready(Ok(o)))
        }

        fn token<'a>(&'a self, ask: &'a TokenAsk) -> ObjectFuture<'a, Token> {
            let mut t = self.tokens.lock().unwrap();
            t.push(ask.clone());
            let token = Token {
                token: format!("token-{}-{}", ask.service_account, t.len()),
                expires: jiff::Timestamp::now() + jiff::SignedDuration::from_secs(ask.expiration_seconds),
            };
            Box::pin(std::future::ready(Ok(token)))
        }
    }
}
