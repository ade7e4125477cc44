//! The config by section: each section is a type of its own with its own validation from the defaulted
//! [`KubeletConfiguration`], and each serves one consumer (the resource manager, the eviction loop, the node's
//! registration and status, the runtime, pod sync, the node's shutdown, the start checks, the endpoints, the image
//! garbage collector).
//! [`crate::validate`] composes them, with the few checks that span sections.

pub mod cluster;
pub mod endpoints;
pub mod eviction;
pub mod host;
pub mod images;
pub mod pods;
pub mod resources;
pub mod runtime;
pub mod shutdown;

use std::time::Duration;

use crate::{ConfigError, KubeletConfiguration, duration};

/// A section of [`crate::Config`], as a reload reports it changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Section {
    /// [`crate::Config::resources`]: the resource manager's.
    Resources,
    /// [`crate::Config::eviction`]: the eviction loop's.
    Eviction,
    /// [`crate::Config::cluster`]: the node's registration, status and lease.
    Cluster,
    /// [`crate::Config::runtime`]: the container runtime's.
    Runtime,
    /// [`crate::Config::pods`]: pod sync's.
    Pods,
    /// [`crate::Config::shutdown`]: the node's graceful shutdown.
    Shutdown,
    /// [`crate::Config::host`]: the start checks and the daemon's own place on the host.
    Host,
    /// [`crate::Config::endpoints`]: the HTTP endpoints.
    Endpoints,
    /// [`crate::Config::images`]: the image garbage collector's.
    Images,
}

/// A defaulted field's value: after [`KubeletConfiguration::with_defaults`] every field is set, so `None` is a
/// defaulting bug, reported with the field rather than a panic.
pub(crate) fn required<'a, T>(v: &'a Option<T>, field: &str) -> Result<&'a T, ConfigError> {
    v.as_ref().ok_or_else(|| ConfigError::field(field, "missing after defaulting"))
}

/// A defaulted duration field, parsed.
pub(crate) fn duration_field(field: &str, value: &Option<String>) -> Result<Duration, ConfigError> {
    parse_duration(field, required(value, field)?)
}

/// A duration's text, parsed, an error naming `field`.
pub(crate) fn parse_duration(field: &str, value: &str) -> Result<Duration, ConfigError> {
    duration::parse(value).map_err(|e| ConfigError::field(field, e))
}

/// `nodewarden:`, the nodewarden block, defaulted.
pub(crate) fn nodewarden(c: &KubeletConfiguration) -> Result<&crate::raw::NodewardenSettings, ConfigError> {
    required(&c.nodewarden, "nodewarden")
}

/// The header of every test config.
#[cfg(test)]
pub(crate) const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

/// A config for a section's tests: [`HEAD`] and `body`, read and defaulted as [`crate::parse`] does, without
/// the other sections' validation.
#[cfg(test)]
pub(crate) fn raw(body: &str) -> KubeletConfiguration {
    let raw: KubeletConfiguration = serde_saphyr::from_str(&format!("{HEAD}{body}")).expect("a test config parses");
    raw.with_defaults()
}

/// Asserts that a section's validation refuses each `(body, field)` case with an error naming the field.
#[cfg(test)]
pub(crate) fn assert_refused<T: std::fmt::Debug>(
    validate: impl Fn(&KubeletConfiguration) -> Result<T, ConfigError>,
    cases: &[(&str, &str)],
) {
    for (body, want) in cases {
        match validate(&raw(body)) {
            Err(ConfigError::Field { field, reason }) => assert_eq!(field, *want, "for {body:?}: {reason}"),
            other => panic!("expected a field error for\n{body}\ngot {other:?}"),
        }
    }
}
