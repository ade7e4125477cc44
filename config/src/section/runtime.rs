//! The runtime section: which container runtime runs the pods and how it is called, from
//! `containerRuntimeEndpoint` and `runtimeRequestTimeout` (the pulls' concurrency is the images section's).

use std::time::Duration;

use super::{duration_field, required};
use crate::{ConfigError, KubeletConfiguration};

/// The runtime section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// `containerRuntimeEndpoint`, a `unix://` socket, if set (otherwise the embedded process runtime).
    pub endpoint: Option<String>,
    /// `runtimeRequestTimeout` (`0s` means the default, 2m).
    pub request_timeout: Duration,
}

impl RuntimeConfig {
    /// The runtime section.
    pub fn validate(c: &KubeletConfiguration) -> Result<Self, ConfigError> {
        let endpoint = required(&c.container_runtime_endpoint, "containerRuntimeEndpoint")?;
        if !endpoint.is_empty() && !endpoint.starts_with("unix://") {
            return Err(ConfigError::field(
                "containerRuntimeEndpoint",
                format!("{endpoint:?} must be a unix:// socket"),
            ));
        }
        let request_timeout = match duration_field("runtimeRequestTimeout", &c.runtime_request_timeout)? {
            Duration::ZERO => Duration::from_secs(120),
            d => d,
        };
        Ok(RuntimeConfig { endpoint: (!endpoint.is_empty()).then(|| endpoint.clone()), request_timeout })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{assert_refused, raw};
    use super::*;

    #[test]
    fn the_embedded_runtime_by_default_and_a_unix_socket_otherwise() {
        let r = RuntimeConfig::validate(&raw("")).unwrap();
        assert_eq!(r, RuntimeConfig { endpoint: None, request_timeout: Duration::from_secs(120) });
        let r =
            RuntimeConfig::validate(&raw("containerRuntimeEndpoint: unix:///run/c.sock\nruntimeRequestTimeout: 0s\n"))
                .unwrap();
        assert_eq!((r.endpoint.as_deref(), r.request_timeout), (Some("unix:///run/c.sock"), Duration::from_secs(120)));
        assert_eq!(
            RuntimeConfig::validate(&raw("runtimeRequestTimeout: 5s\n")).unwrap().request_timeout,
            Duration::from_secs(5)
        );
        assert_refused(
            RuntimeConfig::validate,
            &[
                ("containerRuntimeEndpoint: tcp://1.2.3.4:1\n", "containerRuntimeEndpoint"),
                ("runtimeRequestTimeout: never\n", "runtimeRequestTimeout"),
            ],
        );
    }
}
