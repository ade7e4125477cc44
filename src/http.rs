//! The read-only HTTP endpoints on `healthzBindAddress:healthzPort`: `/healthz`, `/readyz`, `/metrics`, `/pods`,
//! `/evictions`, `/configz`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use nodewarden_eviction::EvictionStatus;
use nodewarden_resources::LedgerView;
use nodewarden_sync::StatusStore;
use tokio::sync::watch;

use crate::config::Config;
use crate::health::Health;
use crate::metrics::{CONTENT_TYPE, Metrics};

/// What the endpoints read: what the loops publish, never the ledger itself.
pub struct Endpoints {
    /// The readiness checks.
    pub health: Health,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The ledger as published, for the gauges set when scraped.
    pub view: LedgerView,
    /// Pods and their status.
    pub store: Arc<StatusStore>,
    /// The eviction loop's conditions and recent evictions.
    pub eviction: Arc<EvictionStatus>,
    /// The configuration in force.
    pub config: watch::Receiver<Arc<Config>>,
}

/// The router of every endpoint.
pub fn router(endpoints: Endpoints) -> Router {
    let state = Arc::new(endpoints);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/configz", get(configz))
        .route("/pods", get(pods))
        .route("/evictions", get(evictions))
        .with_state(state)
}

/// The process is alive and serving.
async fn healthz() -> &'static str {
    "ok"
}

/// Ready only when nodewarden can really run pods: its eviction loop completed a pass recently and the
/// kubepods cgroup is there. Each check is listed as the kubelet lists them (`[+]name ok`, `[-]name failed: why`).
async fn readyz(State(state): State<Arc<Endpoints>>) -> Response {
    let checks = state.health.readiness();
    let mut body = String::new();
    let mut ok = true;
    for (name, result) in &checks {
        match result {
            Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
            Err(why) => {
                ok = false;
                body.push_str(&format!("[-]{name} failed: {why}\n"));
            }
        }
    }
    if ok {
        body.push_str("readyz check passed\n");
        (StatusCode::OK, body).into_response()
    } else {
        body.push_str("readyz check failed\n");
        (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
    }
}

async fn metrics(State(state): State<Arc<Endpoints>>) -> Response {
    state.metrics.refresh(&state.view);
    match state.metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot render metrics: {e}\n")).into_response(),
    }
}

/// Every pod with its status as a `v1.PodList`, plus an entry per refused manifest, as the kubelet's `/pods`.
async fn pods(State(state): State<Arc<Endpoints>>) -> Response {
    // Written one pod at a time under the store's lock (never the whole list under it), and sent with its length:
    // a chunked body would break the plain HTTP clients scripts use against this port.
    match state.store.pod_list_json() {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot render the pods: {e}\n")).into_response(),
    }
}

/// The node conditions, the thresholds met and the recent evictions (oldest first), each with the signal, its
/// value and threshold, and the ranked candidates.
async fn evictions(State(state): State<Arc<Endpoints>>) -> Response {
    let evaluation = state.eviction.evaluation();
    axum::Json(serde_json::json!({
        "conditions": evaluation.pressure.names(),
        "thresholdsMet": evaluation.met,
        "evictions": state.eviction.history(),
    }))
    .into_response()
}

/// The effective configuration, as the kubelet serves it: `{"kubeletconfig": {...}}`.
async fn configz(State(state): State<Arc<Endpoints>>) -> Response {
    axum::Json(serde_json::json!({ "kubeletconfig": state.config.borrow().effective })).into_response()
}
