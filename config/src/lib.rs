//! Configuration: the kubelet's own `KubeletConfiguration` file (`kubelet.config.k8s.io/v1beta1`), with the
//! kubelet's defaults and validation, and nodewarden's settings in a `nodewarden:` block.
//!
//! Loading is two steps: the YAML is read into a generic tree, whose top-level keys are sorted into implemented,
//! accepted-but-ignored (real kubelet fields nodewarden does not implement) and unknown (an error naming the field
//! and the nearest known name); then the implemented fields are deserialized and validated into [`Config`].

pub mod duration;
mod fields;
mod kubelet_fields;
mod raw;
mod reload;
pub mod section;

use std::path::Path;

use nodewarden_resources::ResourceConfig;

pub use raw::{KubeletConfiguration, QuantityMap};
pub use reload::{LIVE, Reloaded, reload, restart_only};
pub use section::Section;
pub use section::cluster::ClusterConfig;
pub use section::endpoints::EndpointsConfig;
pub use section::eviction::EvictionConfig;
pub use section::host::HostConfig;
pub use section::images::ImagesConfig;
pub use section::pods::PodsConfig;
pub use section::runtime::RuntimeConfig;
pub use section::shutdown::ShutdownConfig;

/// The only `apiVersion` accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only `kind` accepted.
pub const KIND: &str = "KubeletConfiguration";
/// Config files larger than this are refused before parsing.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why a config was refused. `field` is the kubelet field name (dotted for nested keys) where one applies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not YAML (or JSON) of the expected shape.
    #[error("invalid YAML: {0}")]
    Syntax(String),
    /// A field is unknown or has an invalid value.
    #[error("field {field}: {reason}")]
    Field {
        /// The field, such as `evictionHard.memory.available`.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl ConfigError {
    fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Field { field: field.into(), reason: reason.into() }
    }
}

/// The validated, typed configuration: the file as given, and one section per consumer, each validated on its own
/// (see [`section`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The effective kubelet configuration, every field set: what `check-config` prints and `/configz` serves.
    pub effective: KubeletConfiguration,
    /// Real kubelet fields present in the file that nodewarden ignores.
    pub ignored: Vec<String>,
    /// Accepted settings that nodewarden does not honour as the kubelet would (said once at start).
    pub warnings: Vec<String>,
    /// What the resources crate needs. `memory_qos` is the request; the daemon also checks the kernel.
    pub resources: ResourceConfig,
    /// What the eviction loop follows.
    pub eviction: EvictionConfig,
    /// The node's registration and status.
    pub cluster: ClusterConfig,
    /// The container runtime.
    pub runtime: RuntimeConfig,
    /// Pod sync's directories, log rotation and the node's name.
    pub pods: PodsConfig,
    /// The node's graceful shutdown.
    pub shutdown: ShutdownConfig,
    /// The start checks and the daemon's own place on the host.
    pub host: HostConfig,
    /// The HTTP endpoints.
    pub endpoints: EndpointsConfig,
    /// The image garbage collector.
    pub images: ImagesConfig,
}

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let read_err = |reason: String| ConfigError::Read { path: path.display().to_string(), reason };
    let bytes = nodewarden_resources::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| read_err(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| read_err("the file is not UTF-8".into()))?;
    parse(&text)
}

/// Parses and validates config text.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let tree: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    let serde_json::Value::Object(mut map) = tree else {
        return Err(ConfigError::Syntax("the document is not a mapping of fields".into()));
    };
    let implemented = fields::of::<KubeletConfiguration>();
    let mut ignored = Vec::new();
    for key in map.keys().cloned().collect::<Vec<_>>() {
        if implemented.contains(&key.as_str()) {
            continue;
        }
        if kubelet_fields::IGNORED.contains(&key.as_str()) {
            map.remove(&key);
            ignored.push(key);
            continue;
        }
        let known = implemented.iter().chain(kubelet_fields::IGNORED.iter()).copied();
        let hint = kubelet_fields::suggest(&key, known).map(|s| format!(" (did you mean {s}?)")).unwrap_or_default();
        return Err(ConfigError::field(key, format!("unknown field: not a KubeletConfiguration field{hint}")));
    }
    let raw: KubeletConfiguration = serde_path_to_error::deserialize(serde_json::Value::Object(map)).map_err(|e| {
        let field = e.path().to_string();
        ConfigError::field(field, e.into_inner().to_string())
    })?;
    let mut config = validate(raw.with_defaults())?;
    config.ignored = ignored;
    Ok(config)
}

/// The config from the defaulted file: the document's kind, then each section's own validation, composed with
/// what one section takes from another (whether pods are enforced, the hard thresholds allocatable subtracts,
/// whether containers get cgroups of their own).
fn validate(c: KubeletConfiguration) -> Result<Config, ConfigError> {
    match c.api_version.as_deref() {
        Some(API_VERSION) => {}
        other => return Err(ConfigError::field("apiVersion", format!("must be {API_VERSION}, found {other:?}"))),
    }
    match c.kind.as_deref() {
        Some(KIND) => {}
        other => return Err(ConfigError::field("kind", format!("must be {KIND}, found {other:?}"))),
    }
    let mut warnings = Vec::new();
    let enforce_pods = section::resources::enforces_pods(&c, &mut warnings)?;
    let eviction = EvictionConfig::validate(&c, enforce_pods)?;
    let runtime = RuntimeConfig::validate(&c)?;
    // The process runtime starts containers in cgroups of their own; a CRI runtime makes its own.
    let container_cgroups = runtime.endpoint.is_none();
    let resources =
        section::resources::validate(&c, enforce_pods, eviction.reserve(), container_cgroups, &mut warnings)?;
    let endpoints = EndpointsConfig::validate(&c, &mut warnings)?;
    let host = HostConfig::validate(&c, &mut warnings)?;
    Ok(Config {
        ignored: Vec::new(),
        warnings,
        resources,
        eviction,
        cluster: ClusterConfig::validate(&c)?,
        runtime,
        pods: PodsConfig::validate(&c)?,
        shutdown: ShutdownConfig::validate(&c)?,
        host,
        endpoints,
        images: ImagesConfig::validate(&c)?,
        effective: c,
    })
}

impl Config {
    /// The effective configuration as YAML, as `check-config` prints it.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(&self.effective).unwrap_or_else(|e| format!("# cannot render the config: {e}\n"))
    }
}

#[cfg(test)]
mod tests;
