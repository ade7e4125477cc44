//! `staticPodURL`, the kubelet's third source of pods: a manifest or a `v1.PodList` fetched every
//! `httpCheckFrequency` (with `staticPodURLHeader`), its pods static pods of source `http` (mirror pods, never
//! evicted for priority, as those of `staticPodPath`). A fetch that fails (the server away, an error status, an
//! answer that does not parse) keeps the set served before; until a first answer, pods adopted at start are not
//! cleaned up.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use nodewarden_sync::{HTTP_SOURCE, PodSource, SourceSnapshot, parse_url_pods};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The largest answer taken: a list of the node's pods, far above what a node runs.
const MAX_ANSWER_BYTES: usize = 16 << 20;
/// How long one fetch may take, to its last byte.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The pods `staticPodURL` serves.
pub struct UrlPodSource {
    url: String,
    headers: Vec<(String, String)>,
    node_name: String,
    every: Duration,
    client: HttpsClient,
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The request could not be made or answered.
    #[error("{0}")]
    Request(String),
    /// The server answered with an error status.
    #[error("the server answered {0}")]
    Status(http::StatusCode),
    /// The answer did not come within [`FETCH_TIMEOUT`].
    #[error("no whole answer within {0:?}")]
    Timeout(Duration),
}

impl UrlPodSource {
    /// A source fetching `url` with `headers` every `every`, for node `node_name`. Loads the system's root
    /// certificates for `https`: an error when there are none.
    pub fn new(
        url: &str,
        headers: Vec<(String, String)>,
        node_name: &str,
        every: Duration,
    ) -> Result<Self, std::io::Error> {
        let https =
            hyper_rustls::HttpsConnectorBuilder::new().with_native_roots()?.https_or_http().enable_http1().build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Self { url: url.to_owned(), headers, node_name: node_name.to_owned(), every, client })
    }

    /// One fetch: the answer's body.
    async fn fetch(&self) -> Result<Bytes, FetchError> {
        let mut request = http::Request::get(&self.url).header(http::header::USER_AGENT, "nodewarden");
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request.body(Empty::new()).map_err(|e| FetchError::Request(e.to_string()))?;
        let answer = async {
            let response = self.client.request(request).await.map_err(|e| FetchError::Request(e.to_string()))?;
            if !response.status().is_success() {
                return Err(FetchError::Status(response.status()));
            }
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES);
            body.collect().await.map(|b| b.to_bytes()).map_err(|e| FetchError::Request(e.to_string()))
        };
        tokio::time::timeout(FETCH_TIMEOUT, answer).await.map_err(|_| FetchError::Timeout(FETCH_TIMEOUT))?
    }
}

impl PodSource for UrlPodSource {
    async fn run(self, tx: mpsc::Sender<SourceSnapshot>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // What was last logged, so that a failure that lasts is logged once, not every tick.
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let parsed = match self.fetch().await {
                Ok(body) => parse_url_pods(&body, &self.url, &self.node_name).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let pods = match parsed {
                Ok(pods) => pods,
                Err(error) => {
                    if last_error.as_ref() != Some(&error) {
                        tracing::warn!(url = %self.url, error = %error, "cannot read the pods of staticPodURL; the pods served before stay");
                    }
                    last_error = Some(error);
                    continue;
                }
            };
            if last_error.take().is_some() {
                tracing::info!(url = %self.url, pods = pods.len(), "staticPodURL answers again");
            }
            let pods = pods.into_iter().map(Arc::new).collect();
            let snapshot = SourceSnapshot { source: HTTP_SOURCE, pods, invalid: Vec::new() };
            tokio::select! {
                () = shutdown.cancelled() => return,
                sent = tx.send(snapshot) => if sent.is_err() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A server answering each request with the status and body of `answer`, recording the request's headers.
    async fn serve(answer: Arc<Mutex<(u16, String)>>, seen: Arc<Mutex<Vec<String>>>) -> String {
        let app = axum::Router::new().route(
            "/pods",
            axum::routing::get(move |headers: http::HeaderMap| {
                let (answer, seen) = (answer.clone(), seen.clone());
                async move {
                    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
                    seen.lock().unwrap().push(auth.to_owned());
                    let (status, body) = answer.lock().unwrap().clone();
                    (http::StatusCode::from_u16(status).unwrap(), body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/pods")
    }

    fn list(names: &[&str]) -> String {
        let items: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"metadata": {{"name": "{n}"}}, "spec": {{"containers": [{{"name": "c", "image": "i"}}]}}}}"#
                )
            })
            .collect();
        format!(r#"{{"kind": "PodList", "apiVersion": "v1", "items": [{}]}}"#, items.join(","))
    }

    async fn recv(rx: &mut mpsc::Receiver<SourceSnapshot>) -> SourceSnapshot {
        tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap()
    }

    fn names(s: &SourceSnapshot) -> Vec<String> {
        s.pods.iter().filter_map(|p| p.metadata.name.clone()).collect()
    }

    #[tokio::test]
    async fn the_url_is_fetched_with_its_headers_and_a_failure_keeps_the_last_set() {
        let answer = Arc::new(Mutex::new((200, list(&["a", "b"]))));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let url = serve(answer.clone(), seen.clone()).await;
        let headers = vec![("Authorization".to_owned(), "Bearer t".to_owned())];
        let source = UrlPodSource::new(&url, headers, "n1", Duration::from_millis(100)).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let stop = CancellationToken::new();
        tokio::spawn(source.run(tx, stop.clone()));
        let first = recv(&mut rx).await;
        assert_eq!((first.source, names(&first)), ("http", vec!["a-n1".to_owned(), "b-n1".to_owned()]));
        assert_eq!(seen.lock().unwrap()[0], "Bearer t");
        // The server fails, then serves a list with a bad pod: no snapshot, so the pods served before stay.
        *answer.lock().unwrap() = (500, String::new());
        // What a fetch answered before the change sent goes first.
        tokio::time::sleep(Duration::from_millis(200)).await;
        while rx.try_recv().is_ok() {}
        tokio::time::sleep(Duration::from_millis(250)).await;
        *answer.lock().unwrap() = (200, r#"{"kind": "PodList", "items": [{"metadata": {"name": "x"}}]}"#.to_owned());
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(rx.try_recv().is_err(), "a failed fetch sent a snapshot");
        assert!(seen.lock().unwrap().len() >= 5, "fetched every 100 ms");
        // Back with another set: it replaces the old one.
        *answer.lock().unwrap() = (200, list(&["c"]));
        let again = recv(&mut rx).await;
        assert_eq!(names(&again), ["c-n1"]);
        stop.cancel();
    }
}
