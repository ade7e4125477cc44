//! The objects pods reference, for pod sync ([`PodObjects`]): ConfigMaps and Secrets read from the apiserver with
//! a cache that keeps each one for a while (the kubelet's `Cache` change detection: at most one read of an object
//! per `ttl`, however many pods use it), and service account tokens kept until 80% of their life or 24 hours have
//! passed, as the kubelet's token manager renews them. Before the node has joined its cluster nothing can be read;
//! a node in no cluster says so in the kubelet's words.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use nodewarden_cluster::{KubeError, ObjectReader};
use nodewarden_sync::{
    ObjectData, ObjectError, ObjectFuture, ObjectKind, PodObjects, ServiceAddress, ServicePort, Token, TokenAsk,
};
use tokio::time::Instant;

/// The longest a token is used, whatever its lifetime.
const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 3600);

/// A token and when it was issued.
struct Kept {
    token: Token,
    issued: jiff::Timestamp,
}

impl Kept {
    /// Whether it is to be renewed at `now`: past 80% of its life, or a day old.
    fn stale(&self, ask: &TokenAsk, now: jiff::Timestamp) -> bool {
        let lived = now.duration_since(self.issued).as_secs_f64();
        let life = self.token.expires.duration_since(self.issued).as_secs_f64().min(ask.expiration_seconds as f64);
        lived >= 0.8 * life || lived >= MAX_TOKEN_AGE.as_secs_f64()
    }
}

/// An object by kind, namespace and name.
type ObjectKey = (ObjectKind, String, String);
/// When an object was read, and what was read (`None`: there was none).
type Cached = (Instant, Option<Arc<ObjectData>>);

/// The lines of readers, one a key: of an object, or of a namespace's Services.
type Lines<K> = Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>;

/// A place in the line of the readers of one key; the line goes from the map once its last reader has left.
struct Turn<'a, K: Eq + std::hash::Hash + Clone> {
    lines: &'a Lines<K>,
    key: K,
    line: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl<'a, K: Eq + std::hash::Hash + Clone> Turn<'a, K> {
    fn take(lines: &'a Lines<K>, key: &K) -> Self {
        let line = lines.lock().unwrap_or_else(PoisonError::into_inner).entry(key.clone()).or_default().clone();
        Self { lines, key: key.clone(), line: Some(line) }
    }

    /// Waits until the readers before this one are done.
    async fn wait(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        Some(self.line.clone()?.lock_owned().await)
    }
}

impl<K: Eq + std::hash::Hash + Clone> Drop for Turn<'_, K> {
    fn drop(&mut self) {
        // Under the map's lock, so that the last reader to leave sees itself last.
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        drop(self.line.take());
        if lines.get(&self.key).is_some_and(|l| Arc::strong_count(l) == 1) {
            lines.remove(&self.key);
        }
    }
}

/// The daemon's [`PodObjects`].
pub struct ApiObjects {
    reader: OnceLock<ObjectReader>,
    /// Whether a cluster is configured: without one, nothing will ever be read.
    in_cluster: AtomicBool,
    ttl: Duration,
    cache: Mutex<HashMap<ObjectKey, Cached>>,
    tokens: Mutex<HashMap<TokenAsk, Kept>>,
    /// The Services of each namespace containers' environments name, when read.
    services: Mutex<HashMap<String, (Instant, Vec<ServiceAddress>)>>,
    /// One read of each object at a time: pods starting together that miss the cache wait for the first one's
    /// read instead of each reading the object (a burst of 110 pods read one ConfigMap 64 times).
    reading: Lines<ObjectKey>,
    /// The same for the Services, by namespace.
    reading_services: Lines<String>,
}

impl ApiObjects {
    /// Objects for a node in no cluster (until [`ApiObjects::expect_cluster`]), each read kept for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            reader: OnceLock::new(),
            in_cluster: AtomicBool::new(false),
            ttl,
            cache: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            services: Mutex::new(HashMap::new()),
            reading: Mutex::new(HashMap::new()),
            reading_services: Mutex::new(HashMap::new()),
        }
    }

    /// The cached copy of `key`, if it is fresh.
    fn fresh(&self, key: &ObjectKey) -> Option<Option<Arc<ObjectData>>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.get(key).filter(|(at, _)| at.elapsed() < self.ttl).map(|(_, o)| o.clone())
    }

    /// A cluster is being joined: until it is, objects are out of reach for now, not for good.
    pub fn expect_cluster(&self) {
        self.in_cluster.store(true, Ordering::SeqCst);
    }

    /// Reads from now on through `reader` (once; a second call is ignored).
    pub fn join(&self, reader: ObjectReader) {
        let _ = self.reader.set(reader);
    }

    fn reader(&self, kind: &'static str, namespace: &str, name: &str) -> Result<&ObjectReader, ObjectError> {
        match self.reader.get() {
            Some(r) => Ok(r),
            None if !self.in_cluster.load(Ordering::SeqCst) => {
                Err(ObjectError::NoClient { kind, namespace: namespace.to_owned(), name: name.to_owned() })
            }
            None => Err(ObjectError::Api("the node has not joined its cluster yet".into())),
        }
    }

    async fn read(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ObjectData>>, ObjectError> {
        let key = (kind, namespace.to_owned(), name.to_owned());
        if let Some(o) = self.fresh(&key) {
            return Ok(o);
        }
        let turn = Turn::take(&self.reading, &key);
        let _reading = turn.wait().await;
        // Read by whoever went first meanwhile.
        if let Some(o) = self.fresh(&key) {
            return Ok(o);
        }
        let cached = self.cache.lock().unwrap_or_else(PoisonError::into_inner).get(&key).cloned();
        match self.fetch(kind, namespace, name).await {
            Ok(data) => {
                let data = data.map(Arc::new);
                self.cache.lock().unwrap_or_else(PoisonError::into_inner).insert(key, (Instant::now(), data.clone()));
                Ok(data)
            }
            // The apiserver out of reach: the last copy read serves, as the kubelet's object managers serve theirs.
            Err(e) => match cached {
                Some((_, o)) if !matches!(e, ObjectError::NoClient { .. }) => {
                    tracing::debug!(kind = kind.as_str(), %namespace, %name, error = %e, "serving the object's last copy");
                    Ok(o)
                }
                _ => Err(e),
            },
        }
    }

    async fn fetch(&self, kind: ObjectKind, namespace: &str, name: &str) -> Result<Option<ObjectData>, ObjectError> {
        Ok(match kind {
            ObjectKind::ConfigMap => {
                let reader = self.reader("configMap", namespace, name)?;
                reader.config_map(namespace, name).await.map_err(api_error)?.map(|cm| {
                    let mut data: std::collections::BTreeMap<String, Vec<u8>> =
                        cm.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
                    let mut binary = BTreeSet::new();
                    for (k, v) in cm.binary_data.unwrap_or_default() {
                        binary.insert(k.clone());
                        data.insert(k, v.0);
                    }
                    ObjectData { data, binary }
                })
            }
            ObjectKind::Secret => {
                let reader = self.reader("secret", namespace, name)?;
                reader.secret(namespace, name).await.map_err(api_error)?.map(|s| ObjectData {
                    data: s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect(),
                    binary: BTreeSet::new(),
                })
            }
        })
    }

    async fn issue(&self, ask: &TokenAsk) -> Result<Token, ObjectError> {
        let now = jiff::Timestamp::now();
        let kept = self
            .tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(ask)
            .map(|k| (k.token.clone(), k.stale(ask, now)));
        let kept = match kept {
            Some((token, false)) => return Ok(token),
            Some((token, true)) => Some(token),
            None => None,
        };
        let reader = self.reader("serviceAccountToken", &ask.namespace, &ask.service_account)?;
        let asked = reader.token(
            &ask.namespace,
            &ask.service_account,
            ask.audience.as_deref(),
            ask.expiration_seconds,
            &ask.pod_name,
            &ask.pod_uid,
        );
        let issued = match asked.await {
            Ok(issued) => issued,
            // A token due for renewal that has not expired serves until it does, as the kubelet's token manager
            // keeps it while the apiserver is away.
            Err(e) => match kept {
                Some(t) if t.expires > now => {
                    tracing::warn!(pod = %format!("{}/{}", ask.namespace, ask.pod_name), error = %e, expires = %t.expires, "cannot renew a service account token; the current one serves until it expires");
                    return Ok(t);
                }
                _ => return Err(api_error(e)),
            },
        };
        let token = Token { token: issued.token, expires: issued.expires };
        tracing::info!(
            pod = %format!("{}/{}", ask.namespace, ask.pod_name), service_account = %ask.service_account,
            expires = %token.expires, "service account token issued"
        );
        let kept = Kept { token: token.clone(), issued: now };
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner).insert(ask.clone(), kept);
        Ok(token)
    }
}

/// How long a namespace's Services list serves at most: a Service made with the pods that name it (one
/// `kubectl apply` of both) is in their variables, as the kubelet's informer has it within moments, at one list a
/// namespace at most this often while its pods start.
const SERVICES_FRESH: Duration = Duration::from_secs(5);

/// How many `syncFrequency`s the Services of a namespace no pod asks about are kept (the last list serves while
/// the apiserver is away).
const SERVICES_KEPT: u32 = 10;

/// A Service as the environment names it; `None` for one without a cluster IP (headless, `ExternalName`), which
/// gives no variables and hides no other of its name.
fn address(s: &k8s_openapi::api::core::v1::Service) -> Option<ServiceAddress> {
    let spec = s.spec.as_ref()?;
    let ip = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None")?;
    Some(ServiceAddress {
        name: s.metadata.name.clone()?,
        cluster_ip: ip.to_owned(),
        ports: spec
            .ports
            .iter()
            .flatten()
            .map(|p| ServicePort {
                name: p.name.clone().unwrap_or_default(),
                port: p.port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            })
            .collect(),
    })
}

/// The apiserver's own message where it gave one (`configmaps "x" is forbidden: ...`), else what failed.
fn api_error(e: KubeError) -> ObjectError {
    match e {
        KubeError::Api(s) => ObjectError::Api(s.message),
        other => ObjectError::Api(other.to_string()),
    }
}

impl PodObjects for ApiObjects {
    fn object<'a>(
        &'a self,
        kind: ObjectKind,
        namespace: &'a str,
        name: &'a str,
    ) -> ObjectFuture<'a, Option<Arc<ObjectData>>> {
        Box::pin(self.read(kind, namespace, name))
    }

    fn token<'a>(&'a self, ask: &'a TokenAsk) -> ObjectFuture<'a, Token> {
        Box::pin(self.issue(ask))
    }

    fn services<'a>(&'a self, namespace: &'a str) -> ObjectFuture<'a, Vec<ServiceAddress>> {
        Box::pin(async move {
            let cached = || self.services.lock().unwrap_or_else(PoisonError::into_inner).get(namespace).cloned();
            let fresh = || cached().filter(|(at, _)| at.elapsed() < self.ttl.min(SERVICES_FRESH)).map(|(_, s)| s);
            if let Some(s) = fresh() {
                return Ok(s);
            }
            // One read of a namespace at a time; those that waited take its result.
            let turn = Turn::take(&self.reading_services, &namespace.to_owned());
            let _reading = turn.wait().await;
            if let Some(s) = fresh() {
                return Ok(s);
            }
            let Some(reader) = self.reader.get() else { return Ok(Vec::new()) };
            match reader.services(namespace).await {
                Ok(found) => {
                    let services: Vec<ServiceAddress> = found.iter().filter_map(address).collect();
                    let mut all = self.services.lock().unwrap_or_else(PoisonError::into_inner);
                    // A namespace no pod has asked about for a while (deleted, perhaps) is forgotten.
                    all.retain(|_, (at, _)| at.elapsed() < self.ttl * SERVICES_KEPT);
                    all.insert(namespace.to_owned(), (Instant::now(), services.clone()));
                    Ok(services)
                }
                // The apiserver away: the last copy serves.
                Err(e) => match cached() {
                    Some((_, s)) => Ok(s),
                    None => Err(api_error(e)),
                },
            }
        })
    }

    fn forget_pod(&self, uid: &str) {
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner).retain(|ask, _| ask.pod_uid != uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(seconds: i64) -> TokenAsk {
        TokenAsk {
            namespace: "ns".into(),
            service_account: "default".into(),
            audience: None,
            expiration_seconds: seconds,
            pod_name: "p".into(),
            pod_uid: "u".into(),
        }
    }

    fn kept(issued: jiff::Timestamp, life: i64) -> Kept {
        let expires = issued + jiff::SignedDuration::from_secs(life);
        Kept { token: Token { token: "t".into(), expires }, issued }
    }

    #[test]
    fn a_token_is_renewed_past_eighty_percent_of_its_life_or_a_day() {
        let t0 = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let at = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
        let k = kept(t0, 3600);
        assert!(!k.stale(&ask(3600), at(2879)));
        assert!(k.stale(&ask(3600), at(2880)));
        // An expiry the apiserver extended (a year) is renewed on the asked lifetime, as a kubelet's would be.
        let extended = kept(t0, 365 * 24 * 3600);
        assert!(!extended.stale(&ask(3607), at(2000)));
        assert!(extended.stale(&ask(3607), at(2886)));
        let long = kept(t0, 7 * 24 * 3600);
        assert!(long.stale(&ask(7 * 24 * 3600), at(24 * 3600)));
    }

    /// A test apiserver, and objects read from it as its admin, each kept for `ttl`.
    async fn joined(ttl: Duration) -> (nodewarden_testapi::TestApi, ApiObjects) {
        let api = nodewarden_testapi::TestApi::start(0).await.unwrap();
        api.add_token("admin", None);
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.write_kubeconfig(dir.path(), "admin").unwrap();
        let clients =
            nodewarden_cluster::Clients::from_kubeconfig(&kubeconfig, 50.0, 100, Duration::from_secs(5)).await.unwrap();
        let objects = ApiObjects::new(ttl);
        objects.expect_cluster();
        objects.join(ObjectReader::new(clients));
        (api, objects)
    }

    #[tokio::test]
    async fn objects_are_read_once_per_ttl_and_the_last_copies_serve_while_the_apiserver_is_away() {
        let (api, objects) = joined(Duration::from_millis(300)).await;
        let cm = serde_json::json!({"metadata": {"name": "cfg"}, "data": {"a": "1"}, "binaryData": {"b": "AAE="}});
        api.create("configmaps", Some("default"), cm).unwrap();
        let pod = serde_json::json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}});
        let created = api.create("pods", Some("default"), pod).unwrap();
        let services = objects.services("default").await.unwrap();
        assert_eq!(services.len(), 1);
        assert_eq!((services[0].name.as_str(), services[0].ports[0].port), ("kubernetes", 443));
        assert_eq!(objects.services("elsewhere").await.unwrap(), [], "a namespace without Services");
        let gets =
            || api.requests().iter().filter(|r| r.method == "GET" && r.path.ends_with("/configmaps/cfg")).count();
        let read = objects.object(ObjectKind::ConfigMap, "default", "cfg").await.unwrap().unwrap();
        assert_eq!((read.env_value("a"), read.env_value("b")), (Some("1".into()), None), "binaryData is no env value");
        assert_eq!(read.data["b"], [0, 1]);
        objects.object(ObjectKind::ConfigMap, "default", "cfg").await.unwrap();
        assert_eq!(gets(), 1, "read once within the ttl");
        // Past the ttl, twenty pods asking at once: one read.
        tokio::time::sleep(Duration::from_millis(350)).await;
        let asks = (0..20).map(|_| objects.object(ObjectKind::ConfigMap, "default", "cfg"));
        let answers = futures_util::future::join_all(asks).await;
        assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|o| o.as_ref() == Some(&read))));
        assert_eq!(gets(), 2, "one read for all of them");
        let service_gets =
            || api.requests().iter().filter(|r| r.method == "GET" && r.path.ends_with("/default/services")).count();
        let asks = (0..20).map(|_| objects.services("default"));
        futures_util::future::join_all(asks).await;
        assert_eq!(service_gets(), 2, "the Services too");
        assert!(objects.reading_services.lock().unwrap().is_empty(), "no Services lock is left behind");
        assert!(objects.reading.lock().unwrap().is_empty(), "no lock is left behind");
        assert_eq!(objects.object(ObjectKind::Secret, "default", "none").await.unwrap(), None);
        let ask = TokenAsk { pod_uid: created["metadata"]["uid"].as_str().unwrap().into(), ..ask(3600) };
        let ask = TokenAsk { namespace: "default".into(), ..ask };
        let token = objects.token(&ask).await.unwrap();
        assert_eq!(objects.token(&ask).await.unwrap(), token, "a fresh token is kept");
        // The apiserver away past the ttl: the last copy serves; a token still valid serves.
        api.set_up(false);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let again = objects.object(ObjectKind::ConfigMap, "default", "cfg").await.unwrap().unwrap();
        assert_eq!(again, read);
        assert!(objects.object(ObjectKind::ConfigMap, "default", "other").await.is_err(), "never read: an error");
        objects.tokens.lock().unwrap().get_mut(&ask).unwrap().issued =
            jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3000);
        assert_eq!(objects.token(&ask).await.unwrap(), token, "due for renewal, not expired: it serves");
        objects.forget_pod(&ask.pod_uid);
        assert!(objects.token(&ask).await.is_err());
    }

    #[tokio::test]
    async fn a_namespaces_services_are_listed_again_after_a_few_seconds_whatever_the_sync_frequency() {
        let (api, objects) = joined(Duration::from_secs(60)).await;
        let names = |s: Vec<ServiceAddress>| s.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(objects.services("default").await.unwrap()), ["kubernetes"]);
        // A Service made with the pods that name it (one `kubectl apply`): in their variables within seconds.
        let web = serde_json::json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}});
        api.create("services", Some("default"), web).unwrap();
        assert_eq!(names(objects.services("default").await.unwrap()), ["kubernetes"], "the list serves a while");
        tokio::time::sleep(SERVICES_FRESH + Duration::from_millis(100)).await;
        assert_eq!(names(objects.services("default").await.unwrap()), ["kubernetes", "web"]);
    }

    #[test]
    fn a_service_without_a_cluster_ip_gives_no_address() {
        let service = |spec: serde_json::Value| -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "kubernetes"}, "spec": spec})).unwrap()
        };
        let ports = serde_json::json!([{"port": 443, "name": "https"}]);
        let set = address(&service(serde_json::json!({"clusterIP": "10.96.0.9", "ports": ports}))).unwrap();
        assert_eq!((set.cluster_ip.as_str(), set.ports[0].protocol.as_str()), ("10.96.0.9", "TCP"));
        // A headless or ExternalName Service of this name in a pod's namespace must not hide the apiserver's.
        assert_eq!(address(&service(serde_json::json!({"clusterIP": "None", "ports": ports}))), None);
        assert_eq!(address(&service(serde_json::json!({"type": "ExternalName", "externalName": "x"}))), None);
    }

    #[tokio::test]
    async fn a_node_in_no_cluster_says_so_and_one_joining_waits() {
        let alone = ApiObjects::new(Duration::from_secs(60));
        let e = alone.object(ObjectKind::Secret, "ns", "s").await.unwrap_err();
        assert_eq!(e.to_string(), "couldn't get secret ns/s, no kubeClient defined");
        let joining = ApiObjects::new(Duration::from_secs(60));
        joining.expect_cluster();
        let e = joining.token(&ask(3600)).await.unwrap_err();
        assert_eq!(e.to_string(), "the node has not joined its cluster yet");
    }
}
