//! The pods section: where pod sync finds static pods and keeps pods' state and logs, from `staticPodPath`,
//! `fileCheckFrequency`, `staticPodURL`, `staticPodURLHeader`, `httpCheckFrequency`, `syncFrequency`, `podLogsDir`,
//! `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval` and nodewarden's `rootDir`,
//! `nodeName` and how many exited containers are kept (`minimumContainerTTLDuration`,
//! `maximumDeadContainersPerContainer`, `maximumDeadContainers`).

use std::path::PathBuf;
use std::time::Duration;

use nodewarden_resources::parse_non_negative;
use nodewarden_sync::{DeadContainerPolicy, LogRotation};

use super::{duration_field, nodewarden, required};
use crate::{ConfigError, KubeletConfiguration};

/// The pods section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodsConfig {
    /// `staticPodPath`, if set.
    pub static_pod_path: Option<PathBuf>,
    /// `fileCheckFrequency` (`0s` means the default, 20s).
    pub file_check_frequency: Duration,
    /// `staticPodURL`, if set: an `http` or `https` URL.
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader`: each header of the requests, once per value.
    pub static_pod_url_header: Vec<(String, String)>,
    /// `httpCheckFrequency` (`0s` means the default, 20s).
    pub http_check_frequency: Duration,
    /// `syncFrequency` (`0s` means the default, 1m): how often volumes made from objects are refreshed.
    pub sync_frequency: Duration,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
    /// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`.
    pub log_rotation: LogRotation,
    /// `nodewarden.rootDir`.
    pub root_dir: PathBuf,
    /// `nodewarden.nodeName`.
    pub node_name: String,
    /// `nodewarden.minimumContainerTTLDuration`, `maximumDeadContainersPerContainer` and `maximumDeadContainers`.
    pub dead_containers: DeadContainerPolicy,
}

impl PodsConfig {
    /// The pods section.
    pub fn validate(c: &KubeletConfiguration) -> Result<Self, ConfigError> {
        let log_rotation = log_rotation(c)?;
        // As in the kubelet, zero (kubeadm writes `0s`) means the default.
        let file_check_frequency = check_frequency("fileCheckFrequency", &c.file_check_frequency)?;
        let http_check_frequency = check_frequency("httpCheckFrequency", &c.http_check_frequency)?;
        let sync_frequency = match duration_field("syncFrequency", &c.sync_frequency)? {
            d if d.is_zero() => Duration::from_secs(60),
            d if d < Duration::from_secs(1) => return Err(ConfigError::field("syncFrequency", "must be at least 1s")),
            d => d,
        };
        let url = required(&c.static_pod_url, "staticPodURL")?;
        let static_pod_url = (!url.is_empty()).then(|| url.clone());
        if let Some(u) = &static_pod_url {
            let rest = u.strip_prefix("http://").or_else(|| u.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.starts_with('/'))
                || u.chars().any(|ch| ch.is_control() || ch == ' ')
            {
                return Err(ConfigError::field("staticPodURL", format!("{u:?} is not an http:// or https:// URL")));
            }
        }
        let mut static_pod_url_header = Vec::new();
        for (name, values) in required(&c.static_pod_url_header, "staticPodURLHeader")? {
            let bad = |s: &str| s.chars().any(char::is_control);
            if name.is_empty() || bad(name) || name.contains(':') || values.iter().any(|v| bad(v)) {
                return Err(ConfigError::field(
                    "staticPodURLHeader",
                    format!(
                        "header {:?}: a name must be non-empty without ':', and no control characters",
                        name.escape_debug().to_string()
                    ),
                ));
            }
            static_pod_url_header.extend(values.iter().map(|v| (name.clone(), v.clone())));
        }
        let nw = nodewarden(c)?;
        let pod_logs_dir = absolute("podLogsDir", required(&c.pod_logs_dir, "podLogsDir")?)?;
        let root_dir = absolute("nodewarden.rootDir", required(&nw.root_dir, "nodewarden.rootDir")?)?;
        let node_name = required(&nw.node_name, "nodewarden.nodeName")?.clone();
        if node_name.is_empty()
            || node_name.len() > 63
            || !node_name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(ConfigError::field("nodewarden.nodeName", format!("{node_name:?} is not a valid node name")));
        }
        let static_pod_path = required(&c.static_pod_path, "staticPodPath")?;
        Ok(PodsConfig {
            static_pod_path: (!static_pod_path.is_empty()).then(|| PathBuf::from(static_pod_path)),
            file_check_frequency,
            static_pod_url,
            static_pod_url_header,
            http_check_frequency,
            sync_frequency,
            pod_logs_dir,
            log_rotation,
            root_dir,
            node_name,
            dead_containers: dead_containers(nw)?,
        })
    }
}

/// The container garbage collection policy: as the kubelet's flags, a negative limit is none.
fn dead_containers(nw: &crate::raw::NodewardenSettings) -> Result<DeadContainerPolicy, ConfigError> {
    let field = "nodewarden.minimumContainerTTLDuration";
    let min_age = super::parse_duration(field, required(&nw.minimum_container_ttl_duration, field)?)?;
    let limit = |field: &str, v: &Option<i64>| -> Result<Option<usize>, ConfigError> {
        Ok(usize::try_from(*required(v, field)?).ok())
    };
    let max_per_container =
        limit("nodewarden.maximumDeadContainersPerContainer", &nw.maximum_dead_containers_per_container)?;
    let max_containers = limit("nodewarden.maximumDeadContainers", &nw.maximum_dead_containers)?;
    Ok(DeadContainerPolicy { min_age, max_per_container, max_containers })
}

/// A check frequency: as in the kubelet, zero (kubeadm writes `0s`) means the default, 20 s; at least 1 s.
fn check_frequency(field: &str, v: &Option<String>) -> Result<Duration, ConfigError> {
    match duration_field(field, v)? {
        d if d.is_zero() => Ok(Duration::from_secs(20)),
        d if d < Duration::from_secs(1) => Err(ConfigError::field(field, "must be at least 1s")),
        d => Ok(d),
    }
}

/// `containerLogMaxSize` (more than 0), `containerLogMaxFiles` (at least 2) and `containerLogMonitorInterval` (at
/// least 1s).
fn log_rotation(c: &KubeletConfiguration) -> Result<LogRotation, ConfigError> {
    let max_size = parse_non_negative(required(&c.container_log_max_size, "containerLogMaxSize")?)
        .map_err(|e| ConfigError::field("containerLogMaxSize", e.to_string()))?;
    if max_size == 0 {
        return Err(ConfigError::field("containerLogMaxSize", "must be more than 0"));
    }
    let max_files = match *required(&c.container_log_max_files, "containerLogMaxFiles")? {
        n if n >= 2 => u32::try_from(n).unwrap_or(u32::MAX),
        n => {
            return Err(ConfigError::field(
                "containerLogMaxFiles",
                format!("{n} is less than 2 (the kubelet's minimum)"),
            ));
        }
    };
    let interval = duration_field("containerLogMonitorInterval", &c.container_log_monitor_interval)?;
    if interval < Duration::from_secs(1) {
        return Err(ConfigError::field("containerLogMonitorInterval", "must be at least 1s"));
    }
    Ok(LogRotation { max_size, max_files, interval })
}

/// A path that must be absolute.
fn absolute(field: &str, v: &str) -> Result<PathBuf, ConfigError> {
    if v.starts_with('/') { Ok(PathBuf::from(v)) } else { Err(ConfigError::field(field, "must be an absolute path")) }
}

#[cfg(test)]
mod tests {
    use super::super::{assert_refused, raw};
    use super::*;

    #[test]
    fn the_defaults() {
        let p = PodsConfig::validate(&raw("nodewarden:\n  nodeName: n1\n")).unwrap();
        assert_eq!(
            p,
            PodsConfig {
                static_pod_path: None,
                file_check_frequency: Duration::from_secs(20),
                static_pod_url: None,
                static_pod_url_header: Vec::new(),
                http_check_frequency: Duration::from_secs(20),
                sync_frequency: Duration::from_secs(60),
                pod_logs_dir: PathBuf::from("/var/log/pods"),
                log_rotation: LogRotation::default(),
                root_dir: PathBuf::from("/var/lib/nodewarden"),
                node_name: "n1".into(),
                dead_containers: DeadContainerPolicy::default(),
            }
        );
        let p = PodsConfig::validate(&raw("nodewarden:
  minimumContainerTTLDuration: 1m
  maximumDeadContainersPerContainer: -1
  maximumDeadContainers: 100
"))
        .unwrap();
        let policy = DeadContainerPolicy {
            min_age: Duration::from_secs(60),
            max_per_container: None,
            max_containers: Some(100),
        };
        assert_eq!(p.dead_containers, policy, "a negative limit is none, as the kubelet's flags");
        let p = PodsConfig::validate(&raw("staticPodPath: /m\nfileCheckFrequency: 0s\n")).unwrap();
        assert_eq!((p.static_pod_path, p.file_check_frequency), (Some(PathBuf::from("/m")), Duration::from_secs(20)));
        let p = PodsConfig::validate(&raw("staticPodURL: https://config.example/pods
staticPodURLHeader:
  Authorization: [Bearer x]
  \
             X-Node: [a, b]
httpCheckFrequency: 5s
"))
        .unwrap();
        assert_eq!(p.static_pod_url.as_deref(), Some("https://config.example/pods"));
        assert_eq!(p.http_check_frequency, Duration::from_secs(5));
        let headers = [("Authorization", "Bearer x"), ("X-Node", "a"), ("X-Node", "b")];
        assert_eq!(p.static_pod_url_header, headers.map(|(n, v)| (n.to_owned(), v.to_owned())));
    }

    #[test]
    fn invalid_values_name_the_field() {
        assert_refused(
            PodsConfig::validate,
            &[
                ("containerLogMaxSize: 0\n", "containerLogMaxSize"),
                ("containerLogMaxSize: lots\n", "containerLogMaxSize"),
                ("containerLogMaxFiles: 1\n", "containerLogMaxFiles"),
                ("containerLogMonitorInterval: 10ms\n", "containerLogMonitorInterval"),
                ("fileCheckFrequency: 10ms\n", "fileCheckFrequency"),
                ("httpCheckFrequency: 10ms\n", "httpCheckFrequency"),
                ("staticPodURL: ftp://x/pods\n", "staticPodURL"),
                ("staticPodURL: http://\n", "staticPodURL"),
                ("staticPodURLHeader:\n  \"X-A\": [\"a\\r\\nB: c\"]\n", "staticPodURLHeader"),
                ("podLogsDir: logs\n", "podLogsDir"),
                ("nodewarden:\n  rootDir: state\n", "nodewarden.rootDir"),
                ("nodewarden:\n  nodeName: Not_A_Name\n", "nodewarden.nodeName"),
                ("nodewarden:\n  minimumContainerTTLDuration: -1s\n", "nodewarden.minimumContainerTTLDuration"),
            ],
        );
    }
}
