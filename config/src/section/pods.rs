//! The pods section: where pod sync finds static pods and keeps pods' state and logs, from `staticPodPath`,
//! `fileCheckFrequency`, `podLogsDir`, `containerLogMaxSize`, `containerLogMaxFiles`,
//! `containerLogMonitorInterval` and nodewarden's `rootDir` and `nodeName`.

use std::path::PathBuf;
use std::time::Duration;

use nodewarden_resources::parse_non_negative;
use nodewarden_sync::LogRotation;

use super::{duration_field, nodewarden, required};
use crate::{ConfigError, KubeletConfiguration};

/// The pods section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodsConfig {
    /// `staticPodPath`, if set.
    pub static_pod_path: Option<PathBuf>,
    /// `fileCheckFrequency` (`0s` means the default, 20s).
    pub file_check_frequency: Duration,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
    /// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`.
    pub log_rotation: LogRotation,
    /// `nodewarden.rootDir`.
    pub root_dir: PathBuf,
    /// `nodewarden.nodeName`.
    pub node_name: String,
}

impl PodsConfig {
    /// The pods section.
    pub fn validate(c: &KubeletConfiguration) -> Result<Self, ConfigError> {
        let log_rotation = log_rotation(c)?;
        // As in the kubelet, zero (kubeadm writes `0s`) means the default.
        let file_check_frequency = match duration_field("fileCheckFrequency", &c.file_check_frequency)? {
            d if d.is_zero() => Duration::from_secs(20),
            d if d < Duration::from_secs(1) => {
                return Err(ConfigError::field("fileCheckFrequency", "must be at least 1s"));
            }
            d => d,
        };
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
            pod_logs_dir,
            log_rotation,
            root_dir,
            node_name,
        })
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
                pod_logs_dir: PathBuf::from("/var/log/pods"),
                log_rotation: LogRotation::default(),
                root_dir: PathBuf::from("/var/lib/nodewarden"),
                node_name: "n1".into(),
            }
        );
        let p = PodsConfig::validate(&raw("staticPodPath: /m\nfileCheckFrequency: 0s\n")).unwrap();
        assert_eq!((p.static_pod_path, p.file_check_frequency), (Some(PathBuf::from("/m")), Duration::from_secs(20)));
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
                ("podLogsDir: logs\n", "podLogsDir"),
                ("nodewarden:\n  rootDir: state\n", "nodewarden.rootDir"),
                ("nodewarden:\n  nodeName: Not_A_Name\n", "nodewarden.nodeName"),
            ],
        );
    }
}
