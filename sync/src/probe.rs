//! Liveness, readiness and startup probes: their settings with the kubelet's defaults, the success and failure
//! thresholds, and the exec, HTTP GET and TCP checks.

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// `startupProbe`.
    Startup,
    /// `livenessProbe`.
    Liveness,
    /// `readinessProbe`.
    Readiness,
}

impl ProbeKind {
    /// The kubelet's name for it in events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }
}

/// What a probe checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run a command in the container; exit 0 is success.
    Exec(Vec<String>),
    /// An HTTP GET; 200 to 399 is success.
    Http {
        /// `Host` and address.
        host: String,
        /// The port.
        port: u16,
        /// The path.
        path: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// A TCP connection; connecting is success.
    Tcp {
        /// The address.
        host: String,
        /// The port.
        port: u16,
    },
}

/// A probe with the kubelet's defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// What it checks.
    pub action: Action,
    /// `initialDelaySeconds` (0).
    pub initial_delay: Duration,
    /// `periodSeconds` (10).
    pub period: Duration,
    /// `timeoutSeconds` (1).
    pub timeout: Duration,
    /// `successThreshold` (1).
    pub success_threshold: u32,
    /// `failureThreshold` (3).
    pub failure_threshold: u32,
}

fn secs(v: Option<i32>, default: u64, min: u64) -> Duration {
    Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).filter(|v| *v >= min).unwrap_or(default))
}

fn count(v: Option<i32>, default: u32) -> u32 {
    v.and_then(|v| u32::try_from(v).ok()).filter(|v| *v >= 1).unwrap_or(default)
}

/// The address a probe of a pod on the host's network uses when it names no host.
pub const LOOPBACK: &str = "127.0.0.1";

fn port(p: &IntOrString, c: &Container) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => {
            u16::try_from(*n).ok().filter(|n| *n > 0).ok_or_else(|| format!("port {n} is out of range"))
        }
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("container has no port named {name:?}")),
    }
}

impl ProbeConfig {
    /// Reads a probe of container `c`; named ports are looked up in its `ports`.
    /// A probe that names no host goes to `pod_ip`.
    pub fn from_probe(p: &Probe, c: &Container, pod_ip: &str) -> Result<Self, String> {
        let action = if let Some(e) = &p.exec {
            Action::Exec(e.command.clone().unwrap_or_default())
        } else if let Some(h) = &p.http_get {
            if h.scheme.as_deref().is_some_and(|s| !s.eq_ignore_ascii_case("HTTP")) {
                return Err("only HTTP probes are supported (scheme HTTPS is not)".into());
            }
            let path = h.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".into());
            let path = if path.starts_with('/') { path } else { format!("/{path}") };
            Action::Http {
                host: h.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.into()),
                port: port(&h.port, c)?,
                path,
                headers: h.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect(),
            }
        } else if let Some(t) = &p.tcp_socket {
            Action::Tcp {
                host: t.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.into()),
                port: port(&t.port, c)?,
            }
        } else {
            return Err("the probe has no exec, httpGet or tcpSocket".into());
        };
        Ok(Self {
            action,
            initial_delay: secs(p.initial_delay_seconds, 0, 0),
            period: secs(p.period_seconds, 10, 1),
            timeout: secs(p.timeout_seconds, 1, 1),
            success_threshold: count(p.success_threshold, 1),
            failure_threshold: count(p.failure_threshold, 3),
        })
    }
}

/// Consecutive results and the probe's current verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeState {
    successes: u32,
    failures: u32,
    /// The verdict: `None` until a threshold is reached.
    pub result: Option<bool>,
}

impl ProbeState {
    /// Records one result; returns the new verdict when it changed.
    pub fn record(&mut self, ok: bool, cfg: &ProbeConfig) -> Option<bool> {
        if ok {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
        let verdict = if self.successes >= cfg.success_threshold {
            Some(true)
        } else if self.failures >= cfg.failure_threshold {
            Some(false)
        } else {
            None
        };
        match verdict {
            Some(v) if self.result != Some(v) => {
                self.result = Some(v);
                Some(v)
            }
            _ => None,
        }
    }
}

/// Room for the request line and the fixed headers besides the path and host.
const REQUEST_CAPACITY: usize = 128;

/// The bytes read of a probe's answer: the status line must fit.
pub const HTTP_HEAD_LIMIT: usize = 512;

/// The request of an HTTP probe, as the kubelet's prober sends it: `GET` of `path` with the `Host`, `User-Agent`,
/// `Accept` and `Connection: close` headers, then the probe's own `headers`, in one buffer for one write.
pub fn http_probe_request(host: &str, port: u16, path: &str, headers: &[(String, String)]) -> String {
    let mut req = String::with_capacity(REQUEST_CAPACITY + path.len() + host.len());
    let _ = write!(
        req,
        // The release is the Node's (`nodewarden_cluster::KUBERNETES_VERSION`; a test of the daemon holds them equal).
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.34\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        let _ = write!(req, "{k}: {v}\r\n");
    }
    req.push_str("\r\n");
    req
}

/// Whether `head` (what was read of an answer so far) holds the whole status line.
pub fn has_status_line(head: &[u8]) -> bool {
    head.contains(&b'\n')
}

/// The status code of an HTTP answer from its first bytes; `Err` with the status line when it is not one.
pub fn http_status_code(head: &[u8]) -> Result<u16, String> {
    let head = String::from_utf8_lossy(head);
    let line = head.lines().next().unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("not an HTTP response: {line:?}"))
}

/// Whether an HTTP probe with this status code passes (the kubelet's 200 to 399).
pub fn http_probe_passes(code: u16) -> bool {
    (200..400).contains(&code)
}

/// Runs an HTTP GET as the kubelet's prober does; `Ok` with a message when it succeeded.
pub async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<String, String> {
    let run = async {
        let mut s =
            TcpStream::connect((host, port)).await.map_err(|e| format!("Get http://{host}:{port}{path}: {e}"))?;
        // One write: the request is small, and a probe runs for every probed container.
        let req = http_probe_request(host, port, path, headers);
        s.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
        // Only the status line is read.
        let mut buf = [0u8; HTTP_HEAD_LIMIT];
        let mut n = 0;
        while n < buf.len() && !has_status_line(&buf[..n]) {
            match s.read(&mut buf[n..]).await.map_err(|e| e.to_string())? {
                0 => break,
                k => n += k,
            }
        }
        let code = http_status_code(&buf[..n])?;
        if http_probe_passes(code) {
            Ok(format!("HTTP probe succeeded with statuscode: {code}"))
        } else {
            Err(format!("HTTP probe failed with statuscode: {code}"))
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("Get http://{host}:{port}{path}: timeout after {timeout:?}")),
    }
}

/// Connects to a TCP port; `Ok` when the connection was accepted.
pub async fn tcp(host: &str, port: u16, timeout: Duration) -> Result<String, String> {
    match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(String::new()),
        Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
        Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, TCPSocketAction};

    fn cfg(success: u32, failure: u32) -> ProbeConfig {
        ProbeConfig {
            action: Action::Exec(vec!["true".into()]),
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn thresholds_decide_the_verdict() {
        let c = cfg(2, 3);
        let mut s = ProbeState::default();
        assert_eq!(s.record(true, &c), None);
        assert_eq!(s.record(true, &c), Some(true));
        assert_eq!(s.record(true, &c), None, "no change, no transition");
        assert_eq!(s.record(false, &c), None);
        assert_eq!(s.record(false, &c), None);
        assert_eq!(s.record(true, &c), None, "a success resets the failures");
        for _ in 0..2 {
            assert_eq!(s.record(false, &c), None);
        }
        assert_eq!(s.record(false, &c), Some(false));
        assert_eq!(s.result, Some(false));
    }

    #[test]
    fn defaults_and_named_ports() {
        let c = Container {
            name: "a".into(),
            ports: Some(vec![ContainerPort { name: Some("http".into()), container_port: 8080, ..Default::default() }]),
            ..Default::default()
        };
        let p = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("http".into()),
                path: Some("healthz".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let got = ProbeConfig::from_probe(&p, &c, "10.88.0.7").unwrap();
        assert_eq!(
            got.action,
            Action::Http { host: "10.88.0.7".into(), port: 8080, path: "/healthz".into(), headers: vec![] }
        );
        assert_eq!(
            (got.period, got.timeout, got.success_threshold, got.failure_threshold),
            (Duration::from_secs(10), Duration::from_secs(1), 1, 3)
        );
        let bad = Probe {
            tcp_socket: Some(TCPSocketAction { port: IntOrString::String("nope".into()), ..Default::default() }),
            ..Default::default()
        };
        assert!(ProbeConfig::from_probe(&bad, &c, LOOPBACK).unwrap_err().contains("no port named \"nope\""));
    }

    #[tokio::test]
    async fn http_and_tcp_checks() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for code in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /ok HTTP/1.1\r\n"));
                s.write_all(format!("HTTP/1.1 {code}\r\n\r\n").as_bytes()).await.unwrap();
            }
        });
        let t = Duration::from_secs(2);
        assert!(http_get("127.0.0.1", port, "/ok", &[], t).await.is_ok());
        assert_eq!(
            http_get("127.0.0.1", port, "/ok", &[], t).await,
            Err("HTTP probe failed with statuscode: 503".into())
        );
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open_port = open.local_addr().unwrap().port();
        assert!(tcp("127.0.0.1", open_port, t).await.is_ok());
        drop(open);
        assert!(tcp("127.0.0.1", open_port, t).await.is_err());
    }
}
