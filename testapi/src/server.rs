//! The HTTP side: one handler that resolves the path, checks the caller, applies faults and serves the verb.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::discovery;
use crate::route::{self, Target};
use crate::select::Selector;
use crate::store::{self, ApiError, Change, concerns};
use crate::tls::X509;
use crate::{Logged, Peer, State, admission, openapi, protobuf, restriction, token, typed, writes};

fn json_response(code: u16, v: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn error(e: &ApiError) -> Response {
    json_response(e.code, &e.status())
}

/// Decodes `a=b&c=d` with percent escapes and `+` as a space.
pub fn query(uri: &Uri) -> HashMap<String, String> {
    fn hex(b: u8) -> Option<u8> {
        char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok())
    }
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push(h * 16 + l);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                },
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// The identity of a request, as the apiserver's authenticators decide it in turn: a valid client certificate
/// (x509), then a bearer token. `Some(node)` is a node, `None` the admin; credentials that authenticate no one (an
/// unknown token, an expired or revoked certificate) are refused with 401. A request with none is the admin's
/// over plain HTTP, and refused with 401 over TLS (`--anonymous-auth=false`), so that a client that lost its
/// certificate is noticed.
fn identity(state: &State, headers: &HeaderMap, peer: &Peer) -> Result<Option<String>, ApiError> {
    let x509 = match &state.tls {
        Some(tls) => tls.authenticate(peer.0.as_deref(), jiff::Timestamp::now()),
        None => X509::None,
    };
    if let X509::User(who) = x509 {
        return Ok(who);
    }
    let unauthorized = || ApiError::new(401, "Unauthorized", "Unauthorized");
    let Some(auth) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return if x509 == X509::Invalid || state.tls.is_some() { Err(unauthorized()) } else { Ok(None) };
    };
    let token = auth.strip_prefix("Bearer ").unwrap_or(auth);
    match state.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(token) {
        Some(node) => Ok(node.clone()),
        None => Err(unauthorized()),
    }
}

/// The single handler: answers, then logs the request with its status (and a write's body).
pub async fn handle(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    axum::Extension(peer): axum::Extension<Peer>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (at, time) = (tokio::time::Instant::now(), jiff::Timestamp::now());
    let mut response = respond(&state, &peer, &method, &uri, &headers, &body).await;
    let fault = state.fault();
    if let Some(every) = fault.trickle
        && fault.meets(method.as_str(), uri.path())
    {
        response = trickled(response, every).await;
    }
    if let Some(limit) = fault.cut_after
        && fault.meets(method.as_str(), uri.path())
    {
        response = cut(response, limit);
    }
    let kept = if method == Method::GET {
        String::new()
    } else {
        String::from_utf8_lossy(&body[..body.len().min(LOGGED_BODY)]).into_owned()
    };
    state.log(Logged {
        method: method.to_string(),
        path: uri.path().to_owned(),
        query: uri.query().unwrap_or("").to_owned(),
        user_agent: headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned(),
        status: response.status().as_u16(),
        body: kept,
        bytes_in: body.len(),
        bytes_out: http_body::Body::size_hint(response.body()).exact(),
        at,
        time,
    });
    response
}

/// The answer with its body sent one byte every `every` (its length unsaid, as a chunked answer).
async fn trickled(response: Response, every: Duration) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    let stream = futures_util::stream::unfold(0usize, move |at| {
        let bytes = bytes.clone();
        async move {
            if at >= bytes.len() {
                return None;
            }
            tokio::time::sleep(every).await;
            Some((Ok::<_, std::convert::Infallible>(bytes.slice(at..=at)), at + 1))
        }
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// The answer with its body ended, and the connection dropped, after `limit` bytes.
fn cut(response: Response, limit: usize) -> Response {
    use futures_util::StreamExt;
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let stream = futures_util::stream::unfold(Some((body.into_data_stream(), 0usize)), move |state| async move {
        let (mut body, sent) = state?;
        if sent >= limit {
            let dropped = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "cut by the test");
            return Some((Err(dropped), None));
        }
        match body.next().await {
            Some(Ok(chunk)) => {
                let n = chunk.len().min(limit - sent);
                Some((Ok(chunk.slice(..n)), Some((body, sent + n))))
            }
            _ => None,
        }
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// How much of a write's body the log keeps.
const LOGGED_BODY: usize = 16 << 10;

async fn respond(
    state: &Arc<State>,
    peer: &Peer,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let fault = state.fault();
    if !fault.delay.is_zero() {
        tokio::time::sleep(fault.delay).await;
    }
    if let Some(code) = fault.status
        && fault.meets(method.as_str(), &path)
    {
        if code == 429 {
            let wait = fault.retry_after.unwrap_or(1);
            let mut status =
                ApiError::new(429, "TooManyRequests", "Too many requests, please try again later.").status();
            status["details"] = json!({"retryAfterSeconds": wait});
            let mut r = json_response(429, &status);
            r.headers_mut().insert("retry-after", wait.into());
            return r;
        }
        // The reason the apiserver gives with each code (`metav1.StatusReason`), as clients classify by it.
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        return error(&ApiError::new(code, reason, format!("injected by the test: {code}")));
    }
    let who = match identity(state, headers, peer) {
        Ok(w) => w,
        Err(e) => return error(&e),
    };
    match (method.as_str(), path.trim_end_matches('/')) {
        ("GET", "/version") => return json_response(200, &discovery::version()),
        ("GET", "/api") => return json_response(200, &discovery::core_versions()),
        ("GET", "/apis") => return json_response(200, &discovery::group_list()),
        ("GET", "/healthz" | "/readyz" | "/livez") => return (StatusCode::OK, "ok").into_response(),
        ("GET", "/openapi/v3") => return json_response(200, &openapi::root()),
        _ => {}
    }
    if method == Method::GET {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match parts.as_slice() {
            ["api", v] => {
                return discovery::resource_list("", v).map_or_else(|| not_served(&path), |l| json_response(200, &l));
            }
            ["openapi", "v3", gv @ ..] => {
                return openapi::document(&gv.join("/")).map_or_else(|| not_served(&path), |d| json_response(200, &d));
            }
            ["apis", g] => return discovery::group(g).map_or_else(|| not_served(&path), |l| json_response(200, &l)),
            ["apis", g, v] => {
                return discovery::resource_list(g, v).map_or_else(|| not_served(&path), |l| json_response(200, &l));
            }
            _ => {}
        }
    }
    let Some(target) = route::parse(&path) else {
        return not_served(&path);
    };
    let q = query(uri);
    // A dry run would be carried out for real by this store: refused, so that nothing is written by mistake (the
    // real apiserver runs admission and answers without storing; `kubectl diff` and `--dry-run=server` ask so).
    if method != Method::GET && q.get("dryRun").is_some_and(|d| !d.is_empty()) {
        return error(&ApiError::new(
            400,
            "BadRequest",
            "the test apiserver does not do dry runs (dryRun): nothing was written; ask without it",
        ));
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    // kubectl's typed clients send built-in kinds as protobuf; CBOR is not spoken (client-go falls back to JSON).
    if !body.is_empty() && content_type.contains("cbor") {
        return error(&ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/vnd.kubernetes.protobuf (got {content_type:?})"
            ),
        ));
    }
    let body = if !body.is_empty() && content_type.starts_with("application/vnd.kubernetes.protobuf") {
        match protobuf::object(body) {
            Ok(v) => Bytes::from(v.to_string()),
            Err(e) => return error(&e),
        }
    } else {
        body.clone()
    };
    let body = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice::<Value>(&body) {
            // Objects only, with an object (or no) `metadata`: anything else would be indexed as one. A JSON
            // patch is a list of operations.
            Ok(v) if v.is_object() && (v["metadata"].is_null() || v["metadata"].is_object()) => Some(v),
            Ok(v) if v.is_array() && content_type.starts_with(writes::JSON_PATCH) => Some(v),
            Ok(_) => return error(&ApiError::new(400, "BadRequest", "the request body must be a JSON object")),
            Err(e) => return error(&ApiError::new(400, "BadRequest", format!("the request body is not JSON: {e}"))),
        }
    };
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let req = Request { query: &q, body, content_type: &content_type, accept: &accept, who: who.as_deref() };
    match serve(state, method, &target, req).await {
        Ok(r) => r,
        Err(e) => error(&e),
    }
}

fn not_served(path: &str) -> Response {
    error(&ApiError::new(404, "NotFound", format!("the server could not find the requested resource ({path})")))
}

fn verb(method: &Method, target: &Target, q: &HashMap<String, String>) -> &'static str {
    match (method.as_str(), &target.name) {
        ("GET", None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
        ("GET", None) => "list",
        ("GET", Some(_)) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "unknown",
    }
}

/// What a request carries besides its target.
pub(crate) struct Request<'a> {
    pub(crate) query: &'a HashMap<String, String>,
    pub(crate) body: Option<Value>,
    pub(crate) content_type: &'a str,
    pub(crate) accept: &'a str,
    /// The node the caller is, or `None` for an admin.
    pub(crate) who: Option<&'a str>,
}

async fn serve(
    state: &Arc<State>,
    method: &Method,
    target: &Target,
    mut req: Request<'_>,
) -> Result<Response, ApiError> {
    let r = &target.resource;
    let ns = target.namespace.as_deref();
    let q = req.query;
    let verb = verb(method, target, q);
    let stored = target.name.as_deref().and_then(|n| state.store.get(r, ns, n).ok());
    if let Some(sub) = target.subresource.as_deref()
        && !r.serves(sub)
    {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({sub})"),
        ));
    }
    if let Some(node) = req.who {
        let ask = restriction::Ask {
            verb,
            target,
            body: req.body.as_ref(),
            stored: stored.as_ref(),
            field_selector: q.get("fieldSelector").map(String::as_str),
        };
        restriction::check(&state.store, node, &ask)?;
    }
    // Each subresource takes its own verbs; a collection takes no update, a named object no create.
    let allowed = match (target.subresource.as_deref(), target.name.is_some()) {
        (Some("status"), _) => matches!(verb, "get" | "update" | "patch"),
        (Some(_), _) => verb == "create",
        (None, true) => matches!(verb, "get" | "update" | "patch" | "delete"),
        (None, false) => matches!(verb, "list" | "watch" | "create"),
    };
    if !allowed {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        ));
    }
    if let Some(body) = &mut req.body
        && matches!(verb, "create" | "update")
    {
        let (kind, api_version) = match target.subresource.as_deref() {
            Some("binding") => ("Binding", "v1".to_owned()),
            Some("eviction") => ("Eviction", "policy/v1".to_owned()),
            Some("token") => ("TokenRequest", "authentication.k8s.io/v1".to_owned()),
            _ => (r.kind, r.api_version()),
        };
        let unknown = typed::check(kind, &api_version, body)?;
        typed::validate_fields(kind, &api_version, q.get("fieldValidation").map(String::as_str), &unknown)?;
    }
    match (verb, target.subresource.as_deref()) {
        ("create", Some("binding")) => return writes::bind(state, target, req.body).map(|s| json_response(201, &s)),
        ("create", Some("eviction")) => return writes::evict(state, target, req.body).map(|s| json_response(201, &s)),
        ("create", Some("token")) => {
            let name = target.name.as_deref().unwrap_or("");
            let request = req.body.unwrap_or_else(|| json!({}));
            return token::issue(&state.store, ns.unwrap_or(""), name, request).map(|t| json_response(201, &t));
        }
        _ => {}
    }
    match verb {
        "get" => {
            let name = target.name.as_deref().unwrap_or("");
            wait_for(state, q).await?;
            let v = state.store.get(r, ns, name)?;
            if discovery::wants_table(req.accept) {
                return Ok(json_response(200, &discovery::table(r, &[v], state.store.resource_version())));
            }
            Ok(json_response(200, &v))
        }
        "list" => {
            let selector = Selector::parse(
                r.kind,
                q.get("fieldSelector").map(String::as_str),
                q.get("labelSelector").map(String::as_str),
            )
            .map_err(|m| ApiError::new(400, "BadRequest", m))?;
            let read = list_read(q)?;
            wait_for(state, q).await?;
            let (items, rv) = match read.at {
                Some(at) => (state.store.list_at(r, ns, &selector, at).map_err(|_| read.expired())?, at),
                None => state.store.list(r, ns, &selector),
            };
            if discovery::wants_table(req.accept) {
                return Ok(json_response(200, &discovery::table(r, &items, rv)));
            }
            Ok(json_response(200, &page(r, items, rv, read.after.as_deref(), q)))
        }
        "watch" => watch(state, target, q),
        "create" => {
            let body = req.body.ok_or_else(|| ApiError::new(400, "BadRequest", "a create needs a body"))?;
            Ok(json_response(201, &state.create(r, ns, body)?))
        }
        "update" | "patch" => writes::write(state, verb, target, req).map(|v| json_response(200, &v)),
        "delete" => {
            let name = target.name.as_deref().unwrap_or("");
            admission::check_delete(r, name)?;
            let options = req.body.unwrap_or(Value::Null);
            let grace = options["gracePeriodSeconds"]
                .as_i64()
                .or_else(|| q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
            let pre = &options["preconditions"];
            let pre = (pre["uid"].as_str().map(str::to_owned), pre["resourceVersion"].as_str().map(str::to_owned));
            let propagation = store::Propagation::of(&options)?;
            let deleted = state.store.delete_propagating(r, ns, name, grace, pre, propagation)?;
            // Pods, namespaces and service accounts answer with the object; other kinds, once gone, with a Status.
            if deleted.gone && !matches!(r.kind, "Pod" | "Namespace" | "ServiceAccount") {
                let uid = deleted.object["metadata"]["uid"].clone();
                return Ok(json_response(200, &success(r, name, uid)));
            }
            Ok(json_response(200, &deleted.object))
        }
        _ => Err(ApiError::new(405, "MethodNotAllowed", format!("{method} is not supported here"))),
    }
}

/// The `Status` of a write that succeeded without an object to return.
pub(crate) fn success(r: &route::Resource, name: &str, uid: Value) -> Value {
    let mut details = json!({"name": name, "kind": r.plural, "uid": uid});
    if !r.group.is_empty() {
        details["group"] = json!(r.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

/// A get or list at a `resourceVersion` the store has not reached waits for it, up to 3 s, then is answered
/// 504 with the `ResourceVersionTooLarge` cause, as the watch cache answers.
async fn wait_for(state: &State, q: &HashMap<String, String>) -> Result<(), ApiError> {
    let Some(wanted) = q.get("resourceVersion").and_then(|v| v.parse::<u64>().ok()) else { return Ok(()) };
    let give_up = tokio::time::Instant::now() + Duration::from_secs(3);
    while state.store.resource_version() < wanted {
        if tokio::time::Instant::now() >= give_up {
            let mut e = ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {wanted}, current: {}", state.store.resource_version()),
            );
            e.causes = vec![("ResourceVersionTooLarge".into(), "Too large resource version".into())];
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Where a list reads: the current state, or the state at a past resourceVersion (`resourceVersionMatch=Exact`,
/// or the first page's of a continue token, as etcd pages a consistent snapshot), and after which name.
struct ListRead {
    at: Option<u64>,
    after: Option<String>,
}

impl ListRead {
    /// The 410 for a read at a resourceVersion compacted away.
    fn expired(&self) -> ApiError {
        let message = if self.after.is_some() {
            "the continue token is too old: the list it continues was compacted away; start the list again without it"
        } else {
            "The resourceVersion for the provided list is too old."
        };
        ApiError::new(410, "Expired", message)
    }
}

/// A list's `resourceVersion`, `resourceVersionMatch` and `continue`, checked as the apiserver's
/// `ValidateListOptions` and its storage check them (422 Invalid, or 400 for a continue token).
fn list_read(q: &HashMap<String, String>) -> Result<ListRead, ApiError> {
    let given = |k: &str| q.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (matching, rv, token) = (given("resourceVersionMatch"), given("resourceVersion"), given("continue"));
    let invalid =
        |why: String| ApiError::new(422, "Invalid", format!("ListOptions.meta.k8s.io \"\" is invalid: {why}"));
    let forbidden = |why: &str| invalid(format!("resourceVersionMatch: Forbidden: {why}"));
    match (matching, rv) {
        (None, _) => {}
        (Some("Exact" | "NotOlderThan"), None) => {
            return Err(forbidden("resourceVersionMatch is forbidden unless resourceVersion is provided"));
        }
        (Some("Exact" | "NotOlderThan"), Some(_)) if token.is_some() => {
            return Err(forbidden("resourceVersionMatch is forbidden when continue is provided"));
        }
        (Some("Exact"), Some("0")) => {
            return Err(forbidden("resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""));
        }
        (Some("Exact" | "NotOlderThan"), Some(_)) => {}
        (Some(other), _) => {
            return Err(invalid(format!(
                "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\", \"\""
            )));
        }
    }
    let bad = |m: &str| ApiError::new(400, "BadRequest", m.to_owned());
    if let Some(c) = token {
        if rv.is_some_and(|v| v != "0") {
            return Err(bad("specifying resource version is not allowed when using continue"));
        }
        let (first, last) = c.split_once(':').ok_or_else(|| bad("invalid continue token"))?;
        let first: u64 = first.parse().map_err(|_| bad("invalid continue token"))?;
        return Ok(ListRead { at: Some(first), after: Some(last.to_owned()) });
    }
    let at = match (matching, rv) {
        (Some("Exact"), Some(v)) => Some(v.parse().map_err(|_| bad(&format!("invalid resourceVersion {v:?}")))?),
        _ => None,
    };
    Ok(ListRead { at, after: None })
}

/// A page of a list, by `limit`, of the objects after the name a continue token served last. A page's token
/// carries the resourceVersion read and its last name, so every page reads the first page's state and reports
/// its resourceVersion (a watch from it then replays what changed while paging).
fn page(r: &route::Resource, items: Vec<Value>, rv: u64, after: Option<&str>, q: &HashMap<String, String>) -> Value {
    let key = |o: &Value| {
        format!(
            "{}/{}",
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    let mut rest: Vec<Value> = items.into_iter().filter(|o| after.is_none_or(|a| key(o).as_str() > a)).collect();
    rest.sort_by_key(|o| key(o));
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if rest.len() > limit {
        let remaining = rest.len() - limit;
        rest.truncate(limit);
        if let Some(last) = rest.last() {
            meta["continue"] = json!(format!("{rv}:{}", key(last)));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    json!({"kind": format!("{}List", r.kind), "apiVersion": r.api_version(), "metadata": meta, "items": rest})
}

/// One line of a watch stream.
fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// How often a watch that asked for bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(5);

/// What a watch sends for `change` under `selector`: field-selector transitions turn into ADDED and DELETED.
fn filtered(change: &Change, selector: &Selector) -> Option<&'static str> {
    let now = selector.matches(&change.object);
    let before = change.old.as_ref().is_some_and(|o| selector.matches(o));
    match (change.kind, before, now) {
        ("MODIFIED", true, true) => Some("MODIFIED"),
        ("MODIFIED", true, false) => Some("DELETED"),
        ("MODIFIED", false, true) => Some("ADDED"),
        ("MODIFIED", false, false) => None,
        (kind, _, true) => Some(kind),
        _ => None,
    }
}

/// The annotation of the bookmark that ends a watch-list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A watch's `sendInitialEvents` (watch-list), checked as the apiserver's `ValidateListOptions` checks it:
/// it needs `resourceVersionMatch=NotOlderThan`, and when true `allowWatchBookmarks=true`; a
/// `resourceVersionMatch` without it is refused. 422 Invalid otherwise.
fn watch_list(q: &HashMap<String, String>, bookmarks: bool) -> Result<Option<bool>, ApiError> {
    let send = match q.get("sendInitialEvents").map(String::as_str) {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            return Err(ApiError::new(400, "BadRequest", format!("sendInitialEvents: invalid boolean {other:?}")));
        }
    };
    let matching = q.get("resourceVersionMatch").map(String::as_str).filter(|m| !m.is_empty());
    let invalid =
        |why: &str| Err(ApiError::new(422, "Invalid", format!("ListOptions.meta.k8s.io \"\" is invalid: {why}")));
    match (send, matching) {
        (None, None) => Ok(None),
        (None, Some(_)) => invalid("resourceVersionMatch: Forbidden: only allowed for a watch with sendInitialEvents"),
        (Some(_), m) if m != Some("NotOlderThan") => {
            invalid("resourceVersionMatch: Forbidden: sendInitialEvents needs resourceVersionMatch NotOlderThan")
        }
        (Some(true), _) if !bookmarks => {
            invalid("allowWatchBookmarks: Forbidden: must be true when sendInitialEvents is true")
        }
        (s, _) => Ok(s),
    }
}

fn watch(state: &Arc<State>, target: &Target, q: &HashMap<String, String>) -> Result<Response, ApiError> {
    let r = target.resource;
    let ns = target.namespace.clone();
    let selector =
        Selector::parse(r.kind, q.get("fieldSelector").map(String::as_str), q.get("labelSelector").map(String::as_str))
            .map_err(|m| ApiError::new(400, "BadRequest", m))?;
    let from: Option<u64> =
        q.get("resourceVersion").filter(|v| !v.is_empty() && *v != "0").and_then(|v| v.parse().ok());
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let send_initial = watch_list(q, bookmarks)?;
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), |t| Duration::from_secs(t.min(86_400)));
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    // Without a resourceVersion, a watch starts with the current objects as ADDED (unless sendInitialEvents=false
    // asks to start at the most recent without them); with sendInitialEvents=true it does from any resourceVersion
    // (the state now is not older than the one asked for) and marks their end with a bookmark.
    let (initial, start) = match (from, send_initial) {
        (_, Some(true)) | (None, None) => state.store.list(&r, ns.as_deref(), &selector),
        (Some(rv), _) => (Vec::new(), rv),
        (None, Some(false)) => (Vec::new(), state.store.resource_version()),
    };
    let end_of_initial = send_initial == Some(true);
    let pad = state.fault().oversized;
    let event_line = move |kind: &str, object: &Value| match pad {
        Some(n) => {
            let mut padded = object.clone();
            padded["metadata"]["annotations"]["testapi.nodewarden.io/padding"] = json!("x".repeat(n));
            event_line(kind, &padded)
        }
        None => event_line(kind, object),
    };
    let opened = state.store.watch_from(&r, ns.as_deref(), start);
    let mut closed = state.closed.subscribe();
    state.tasks.spawn(async move {
        let (replay, mut changes) = match opened {
            Ok(w) => w,
            Err(oldest) => {
                let status = json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired",
                    "code": 410, "message": format!("too old resource version: {start} ({oldest})"),
                });
                let _ = tx.send(event_line("ERROR", &status)).await;
                return;
            }
        };
        for o in &initial {
            if tx.send(event_line("ADDED", o)).await.is_err() {
                return;
            }
        }
        if end_of_initial {
            let bookmark = json!({
                "kind": r.kind, "apiVersion": r.api_version(),
                "metadata": {"resourceVersion": start.to_string(), "annotations": {INITIAL_EVENTS_END: "true"}},
            });
            if tx.send(event_line("BOOKMARK", &bookmark)).await.is_err() {
                return;
            }
        }
        let mut last = start;
        for c in replay {
            last = c.rv;
            if let Some(kind) = filtered(&c, &selector)
                && tx.send(event_line(kind, &c.object)).await.is_err()
            {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = closed.changed() => return,
                _ = tick.tick(), if bookmarks => {
                    // Only as far as this stream has read the changes: a bookmark promises every event before it.
                    let bookmark = json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": {"resourceVersion": last.to_string()}});
                    if tx.send(event_line("BOOKMARK", &bookmark)).await.is_err() { return; }
                }
                c = changes.recv() => match c {
                    Ok(c) if c.rv > last => {
                        last = c.rv;
                        if concerns(&c, &r, ns.as_deref())
                            && let Some(kind) = filtered(&c, &selector)
                            && tx.send(event_line(kind, &c.object)).await.is_err()
                        {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Lagged or closed: end the stream; the client resumes from its last resourceVersion.
                    Err(_) => return,
                },
            }
        }
    });
    let stream =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx)) },
        );
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_decoded() {
        let uri: Uri = "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1%2Cstatus.phase%21%3DFailed&watch=true&x=%zz+y"
            .parse()
            .unwrap();
        let q = query(&uri);
        assert_eq!(q["fieldSelector"], "spec.nodeName=n1,status.phase!=Failed");
        assert_eq!(q["watch"], "true");
        assert_eq!(q["x"], "%zz y");
    }
}
