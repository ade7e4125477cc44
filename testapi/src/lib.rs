//! A test apiserver for nodewarden's tests and benchmarks.
//!
//! It follows the real apiserver where a client would notice: discovery for kubectl, create/get/list/watch with
//! one resourceVersion counter, bookmarks, watch-list and the in-stream 410 for a compacted history, lists at a
//! past resourceVersion (`resourceVersionMatch=Exact`, and each page of a paged list at its first page's), 410 for
//! a list or continue token compacted away and 504 for a resourceVersion not reached, field and label selectors, optimistic
//! concurrency, the status subresources and their strategies, the four patch types (server-side apply in a basic
//! form), deletion as the registry does it (grace periods that only shrink, finalizers, preconditions), pod
//! admission (defaults, validation, the ServiceAccount plugin's `kube-api-access-*` volume, default tolerations,
//! the status reset, spec immutability), the namespace lifecycle with its `default` ServiceAccount and
//! `kube-root-ca.crt`, the garbage collector (dependents deleted with their last owner, or orphaned, or first, by
//! the deletion's `propagationPolicy`), bindings, evictions, TokenRequest, Tables for `kubectl get`, the Node authorizer's and
//! NodeRestriction's rules for a `system:node:<name>` token or certificate, and the controller manager's node lifecycle
//! controller (a quiet node goes `Unknown` and tainted `unreachable`). Tests control faults (connections refused,
//! injected status codes with `Retry-After`, delays, trickled or cut answers, oversized watch lines, watches
//! closed, history compacted) and read the request log. Plain HTTP, or HTTPS with a CA of its own and the x509
//! authenticator's client certificates (`start_tls`; a request with no credentials is then refused); JSON bodies,
//! and protobuf ones for the kinds `kubectl create` sends so.
//!
//! It is a test fixture: nothing in the daemon uses it.

mod admission;
mod b64;
mod discovery;
mod gc;
mod lifecycle;
mod openapi;
mod patch;
mod protobuf;
mod restriction;
mod route;
mod select;
mod server;
mod store;
mod tls;
mod token;
mod typed;
mod writes;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use serde_json::Value;

use route::{RESOURCES, Resource};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use lifecycle::DEFAULT_GRACE as DEFAULT_NODE_MONITOR_GRACE;
pub use store::ApiError;
pub use tls::ClientCertificate;

/// Faults injected into every request (until cleared).
#[derive(Debug, Clone, Default)]
pub struct Fault {
    /// Answer with this status code (a `Status` object with the reason the apiserver gives with it: `Forbidden`
    /// for 403, `InternalError` for 500, ...).
    pub status: Option<u16>,
    /// `status`, `trickle` and `cut_after` only for paths containing this; every path if `None`.
    pub paths: Option<String>,
    /// `status`, `trickle` and `cut_after` only for this method (`POST`, ...); every method if `None`.
    pub method: Option<String>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// With `status` 429: the seconds the answer asks the client to wait (`Retry-After` and
    /// `details.retryAfterSeconds`, as the apiserver's max-in-flight and priority-and-fairness filters send).
    pub retry_after: Option<u32>,
    /// Send the answer's body one byte every this long (a trickling server or load balancer).
    pub trickle: Option<Duration>,
    /// Drop the connection after this many bytes of the answer's body (a proxy or server that died mid-answer;
    /// for a watch, mid-stream).
    pub cut_after: Option<usize>,
    /// Pad every event of a watch opened while this is set to at least this many bytes (an annotation on the
    /// object), as a huge object makes an oversized line.
    pub oversized: Option<usize>,
}

impl Fault {
    /// Whether a request of `method` to `path` meets the fault.
    pub(crate) fn meets(&self, method: &str, path: &str) -> bool {
        self.paths.as_ref().is_none_or(|p| path.contains(p.as_str()))
            && self.method.as_ref().is_none_or(|m| m == method)
    }
}

/// One request, as the log keeps it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// The method.
    pub method: String,
    /// The path.
    pub path: String,
    /// The raw query.
    pub query: String,
    /// The client's User-Agent.
    pub user_agent: String,
    /// The status code of the answer (200 for a watch that started).
    pub status: u16,
    /// The body of a write (its first 16 KiB), empty for reads.
    pub body: String,
    /// The size of the request's body.
    pub bytes_in: usize,
    /// The size of the answer's body, when it is known as the answer starts (not for watches or trickled answers).
    pub bytes_out: Option<u64>,
    /// When it arrived.
    pub at: Instant,
    /// When it arrived, by the wall clock (to compare with a daemon's log).
    pub time: jiff::Timestamp,
}

/// The requests the log keeps.
const MAX_LOGGED: usize = 100_000;

/// The state the handler shares.
pub(crate) struct State {
    pub(crate) store: store::Store,
    fault: Mutex<Fault>,
    /// Bearer tokens: `Some(node)` for a node identity, `None` for an admin token.
    pub(crate) tokens: Mutex<HashMap<String, Option<String>>>,
    requests: Mutex<Vec<Logged>>,
    /// Bumped to end every open watch.
    pub(crate) closed: watch::Sender<u64>,
    pub(crate) tasks: TaskTracker,
    /// HTTPS: the CA, the acceptor and the client certificates issued.
    pub(crate) tls: Option<tls::Tls>,
}

/// A connection's client certificate (its DER), if it presented one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Peer(pub(crate) Option<Arc<[u8]>>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    pub(crate) fn log(&self, l: Logged) {
        let mut r = lock(&self.requests);
        // Bounded, for long benchmark runs: the oldest half goes.
        if r.len() >= MAX_LOGGED {
            r.drain(..MAX_LOGGED / 2);
        }
        r.push(l);
    }

    pub(crate) fn fault(&self) -> Fault {
        lock(&self.fault).clone()
    }

    /// Creates an object as the apiserver does: admission, the store, then what the controllers add.
    pub(crate) fn create(&self, r: &Resource, namespace: Option<&str>, mut object: Value) -> Result<Value, ApiError> {
        // A generated name is made first, so that validation sees it (`rest.BeforeCreate`).
        if object["metadata"]["name"].as_str().is_none_or(str::is_empty)
            && let Some(prefix) = object["metadata"]["generateName"].as_str().filter(|p| !p.is_empty())
        {
            let name = format!("{prefix}{}", admission::suffix(self.store.resource_version()));
            object["metadata"]["name"] = Value::from(name);
        }
        let admitted = admission::on_create(&self.store, r, namespace, object)?;
        let created = self.store.create(r, namespace, admitted)?;
        admission::after_create(&self.store, &created, || self.tls.as_ref().map(tls::Tls::ca_pem));
        Ok(created)
    }
}

/// A running test apiserver on 127.0.0.1; stopped when dropped.
pub struct TestApi {
    addr: SocketAddr,
    state: Arc<State>,
    up: watch::Sender<bool>,
    grace: watch::Sender<Option<Duration>>,
    stop: CancellationToken,
}

/// The resource named by its plural (`events` is the core group's); a name not served is a bug in the test.
fn resource(plural: &str) -> &'static Resource {
    match RESOURCES.iter().find(|r| r.plural == plural) {
        Some(r) => r,
        None => panic!("the test apiserver serves no {plural:?}"),
    }
}

impl TestApi {
    /// Starts plain HTTP on a free port of 127.0.0.1, or on `port`.
    pub async fn start(port: u16) -> std::io::Result<TestApi> {
        Self::serve(port, None).await
    }

    /// Starts HTTPS on a free port of 127.0.0.1, or on `port`, with a new CA: see
    /// [`TestApi::issue_client_certificate`] and [`TestApi::ca_pem`].
    pub async fn start_tls(port: u16) -> std::io::Result<TestApi> {
        Self::serve(port, Some(tls::Tls::new()?)).await
    }

    async fn serve(port: u16, tls: Option<tls::Tls>) -> std::io::Result<TestApi> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            store: store::Store::default(),
            fault: Mutex::new(Fault::default()),
            tokens: Mutex::new(HashMap::new()),
            requests: Mutex::new(Vec::new()),
            closed: watch::Sender::new(0),
            tasks: TaskTracker::new(),
            tls,
        });
        for ns in admission::SYSTEM_NAMESPACES {
            let made = state.create(resource("namespaces"), None, serde_json::json!({"metadata": {"name": ns}}));
            if let Err(e) = made {
                return Err(std::io::Error::other(e.message));
            }
        }
        // The apiserver's own Service, as its controller keeps it: what every container's KUBERNETES_SERVICE_*
        // variables name.
        let master = serde_json::json!({
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": admission::MASTER_SERVICE_IP,
                     "clusterIPs": [admission::MASTER_SERVICE_IP], "sessionAffinity": "None",
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": addr.port()}]},
        });
        if let Err(e) = state.create(resource("services"), Some("default"), master) {
            return Err(std::io::Error::other(e.message));
        }
        let (up, up_rx) = watch::channel(true);
        let stop = CancellationToken::new();
        // The apiserver's limit on a request body (--max-request-bytes' default): a larger one is a 413.
        let app = axum::Router::new()
            .fallback(server::handle)
            .layer(axum::extract::DefaultBodyLimit::max(3 << 20))
            .with_state(state.clone());
        let acceptor = state.tls.as_ref().map(|t| t.acceptor.clone());
        tokio::spawn(accept(Some(listener), addr, (app, acceptor), up_rx, stop.clone()));
        let grace = watch::Sender::new(Some(lifecycle::DEFAULT_GRACE));
        tokio::spawn(node_lifecycle(state.clone(), grace.subscribe(), stop.clone()));
        Ok(TestApi { addr, state, up, grace, stop })
    }

    /// Sets the node lifecycle controller's grace period (`--node-monitor-grace-period`, 50 s unless set), or
    /// stops the controller with `None`.
    pub fn set_node_monitor_grace(&self, grace: Option<Duration>) {
        self.grace.send_replace(grace);
    }

    /// The base URL, `http://127.0.0.1:<port>` (`https` when started with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.state.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The CA's certificate, PEM encoded, when started with TLS.
    pub fn ca_pem(&self) -> Option<String> {
        self.state.tls.as_ref().map(tls::Tls::ca_pem)
    }

    /// Issues a client certificate valid from now for `valid_for`: of node `node` (`CN=system:node:<node>`,
    /// `O=system:nodes`, restricted as NodeRestriction restricts a kubelet), or of an admin with `None`. An
    /// error without TLS.
    pub fn issue_client_certificate(
        &self,
        node: Option<&str>,
        valid_for: Duration,
    ) -> std::io::Result<ClientCertificate> {
        let Some(tls) = &self.state.tls else {
            return Err(std::io::Error::other("the test apiserver was started without TLS"));
        };
        tls.issue(node, jiff::Timestamp::now(), valid_for)
    }

    /// Refuses `cert` from now on (401), as a certificate past its end is refused.
    pub fn revoke_client_certificate(&self, cert: &ClientCertificate) {
        if let Some(tls) = &self.state.tls {
            tls.revoke(cert);
        }
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Registers `token` as the credentials of node `node` (`system:node:<node>`, restricted as NodeRestriction
    /// restricts a kubelet), or as an admin with `None`. Requests without a token are the admin's.
    pub fn add_token(&self, token: &str, node: Option<&str>) {
        lock(&self.state.tokens).insert(token.to_owned(), node.map(str::to_owned));
    }

    /// Forgets `token`: requests that carry it are refused (401), as a revoked or expired credential's.
    pub fn remove_token(&self, token: &str) {
        lock(&self.state.tokens).remove(token);
    }

    /// Writes a kubeconfig for this server with `token` into `dir` and returns its path.
    pub fn write_kubeconfig(&self, dir: &Path, token: &str) -> std::io::Result<PathBuf> {
        let path = dir.join(format!("kubeconfig-{token}"));
        std::fs::write(&path, self.kubeconfig(&format!("token: {token}")))?;
        Ok(path)
    }

    /// Writes `cert` and its key into `dir` as `<name>.crt` and `<name>.key`, and a kubeconfig naming both files
    /// (as a kubelet's names its rotated `kubelet-client-current.pem`), as `kubeconfig-<name>`; returns the
    /// kubeconfig's path.
    pub fn write_kubeconfig_with_certificate(
        &self,
        dir: &Path,
        name: &str,
        cert: &ClientCertificate,
    ) -> std::io::Result<PathBuf> {
        let (crt, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&crt, &cert.cert_pem)?;
        // The key readable by its owner only, as a kubelet's.
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&key)?;
        std::io::Write::write_all(&mut file, cert.key_pem.as_bytes())?;
        let path = dir.join(format!("kubeconfig-{name}"));
        let user = format!("client-certificate: {}\n    client-key: {}", crt.display(), key.display());
        std::fs::write(&path, self.kubeconfig(&user))?;
        Ok(path)
    }

    /// A kubeconfig for this server (its CA included under TLS) whose user has `user` (YAML lines at its indent).
    fn kubeconfig(&self, user: &str) -> String {
        let ca = self.ca_pem().map_or_else(String::new, |pem| {
            format!("\n    certificate-authority-data: {}", b64::encode(pem.as_bytes(), false))
        });
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}{ca}\n\
             users:\n- name: node\n  user:\n    {user}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: node\n\
             current-context: test\n",
            self.url()
        )
    }

    /// Sets the fault every request meets.
    pub fn set_fault(&self, fault: Fault) {
        *lock(&self.state.fault) = fault;
    }

    /// Stops accepting connections (new ones are refused) and drops the open ones, or starts again on the same
    /// port.
    pub fn set_up(&self, up: bool) {
        self.up.send_replace(up);
        if !up {
            self.close_watches();
        }
    }

    /// Ends every open watch stream (clients resume from their last resourceVersion).
    pub fn close_watches(&self) {
        self.state.closed.send_modify(|g| *g += 1);
    }

    /// Forgets the change history: a watch from an older resourceVersion gets the in-stream 410 Expired.
    pub fn compact(&self) {
        self.state.store.compact();
    }

    /// The requests so far. A request is logged once it has been answered, so a write's effect on the store can be
    /// read a moment before the write is in this log: wait for the request, not for its effect.
    pub fn requests(&self) -> Vec<Logged> {
        lock(&self.state.requests).clone()
    }

    /// One object, as the test (an admin) reads it: `plural` (`nodes`, `pods`, `leases`, `events`, ...).
    pub fn get(&self, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.state.store.get(resource(plural), namespace, name).ok()
    }

    /// All objects of `plural` in `namespace` (all namespaces if `None`).
    pub fn list(&self, plural: &str, namespace: Option<&str>) -> Vec<Value> {
        self.state.store.list(resource(plural), namespace, &select::Selector::default()).0
    }

    /// What `f` makes of each object of `plural` in `namespace` (all namespaces if `None`), read in place: a
    /// bench polling a hundred pods copies none of them, and takes no CPU from the node it measures for copies.
    pub fn scan<T>(&self, plural: &str, namespace: Option<&str>, f: impl FnMut(&Value) -> Option<T>) -> Vec<T> {
        self.state.store.scan(resource(plural), namespace, f).0
    }

    /// Creates an object as the test, through admission as an admin's create (e.g. a pod bound to a node, as a
    /// scheduler would).
    pub fn create(&self, plural: &str, namespace: Option<&str>, object: Value) -> Result<Value, ApiError> {
        self.state.create(resource(plural), namespace, object)
    }

    /// Applies a JSON merge patch to an object as the test (an admin), status included.
    pub fn patch(&self, plural: &str, namespace: Option<&str>, name: &str, merge: &Value) -> Result<Value, ApiError> {
        let r = resource(plural);
        self.state.store.write(r, namespace, name, |object| {
            patch::merge(object, merge);
            Ok(())
        })
    }

    /// Deletes an object as the test, with a grace period for pods.
    pub fn delete(
        &self,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
        grace: Option<i64>,
    ) -> Result<Value, ApiError> {
        self.state.store.delete(resource(plural), namespace, name, grace, (None, None)).map(|d| d.object)
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.stop.cancel();
        self.close_watches();
    }
}

/// The controllers: the node lifecycle controller, a pass every `--node-monitor-period` while a grace period is
/// set, and the namespace controller, which empties a terminating namespace every second and then removes it.
async fn node_lifecycle(state: Arc<State>, grace: watch::Receiver<Option<Duration>>, stop: CancellationToken) {
    let start = Instant::now();
    let mut tick = tokio::time::interval_at(start + lifecycle::PERIOD, lifecycle::PERIOD);
    let mut namespaces = tokio::time::interval_at(start + NAMESPACE_PERIOD, NAMESPACE_PERIOD);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = namespaces.tick() => {
                empty_terminating_namespaces(&state.store);
                gc::collect(&state.store);
            }
            _ = tick.tick() => {
                if let Some(g) = *grace.borrow() {
                    lifecycle::pass(&state.store, resource("nodes"), resource("leases"), resource("pods"), g);
                }
            }
        }
    }
}

/// How often the namespace controller looks at terminating namespaces, and the garbage collector at owners.
const NAMESPACE_PERIOD: Duration = Duration::from_secs(1);

/// One pass of the namespace controller: everything in a terminating namespace is deleted (pods gracefully, so
/// their kubelet ends them first); an emptied namespace goes.
fn empty_terminating_namespaces(store: &store::Store) {
    let all = select::Selector::default();
    let (namespaces, _) = store.list(resource("namespaces"), None, &all);
    for ns in namespaces.iter().filter(|n| store::deleting(n)) {
        let Some(name) = ns["metadata"]["name"].as_str() else { continue };
        let mut left = 0;
        for r in RESOURCES.iter().filter(|r| r.namespaced) {
            for o in store.list(r, Some(name), &all).0 {
                left += 1;
                if let Some(n) = o["metadata"]["name"].as_str() {
                    let _ = store.delete(r, Some(name), n, None, (None, None));
                }
            }
        }
        // Its metadata finalizers (the garbage collector's, for one deleted with a propagation policy) go first.
        if left == 0 && store::finalizers(ns).is_empty() {
            store.remove(resource("namespaces"), None, name);
        }
    }
}

/// Accepts connections while up; while down the listener is closed (connections are refused) and the
/// connections open when it went down are dropped.
async fn accept(
    mut listener: Option<TcpListener>,
    addr: SocketAddr,
    (app, tls): (axum::Router, Option<tokio_rustls::TlsAcceptor>),
    mut up: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Some(l) = &listener else {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = up.changed() => if changed.is_err() { return },
            }
            if *up.borrow() {
                listener = rebind(addr).await;
            }
            continue;
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = up.changed() => {
                if changed.is_err() { return }
                if !*up.borrow() {
                    listener = None;
                    connections.abort_all();
                }
            }
            accepted = l.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                connections.spawn(serve_connection(stream, app.clone(), tls.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// How long a client has to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection: HTTP/1.1, over TLS when `tls` is set, each request told the client certificate.
async fn serve_connection(stream: tokio::net::TcpStream, app: axum::Router, tls: Option<tokio_rustls::TlsAcceptor>) {
    let http = hyper::server::conn::http1::Builder::new();
    let Some(tls) = tls else {
        let service = hyper_util::service::TowerToHyperService::new(app.layer(axum::Extension(Peer::default())));
        let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
        return;
    };
    let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await else { return };
    let der = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| Arc::from(c.as_ref()));
    let service = hyper_util::service::TowerToHyperService::new(app.layer(axum::Extension(Peer(der))));
    let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
}

/// Binds `addr` again after a stop (retrying while the port is in TIME_WAIT elsewhere).
async fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    for _ in 0..50 {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        let _ = socket.set_reuseaddr(true);
        if socket.bind(addr).is_ok()
            && let Ok(l) = socket.listen(1024)
        {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
