//! The endpoints section: where the read-only HTTP endpoints listen, from `healthzBindAddress` and `healthzPort`.

use std::net::{IpAddr, SocketAddr};

use super::required;
use crate::{ConfigError, KubeletConfiguration};

/// The endpoints section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointsConfig {
    /// Where the read-only HTTP endpoints listen; `None` when `healthzPort` is 0.
    pub healthz: Option<SocketAddr>,
}

impl EndpointsConfig {
    /// The endpoints section; an address other than loopback is warned about, as what is served there is not
    /// authenticated.
    pub fn validate(c: &KubeletConfiguration, warnings: &mut Vec<String>) -> Result<Self, ConfigError> {
        let port = *required(&c.healthz_port, "healthzPort")?;
        let port = u16::try_from(port)
            .map_err(|_| ConfigError::field("healthzPort", format!("{port} is not a port (0..65535)")))?;
        let addr_text = required(&c.healthz_bind_address, "healthzBindAddress")?;
        let addr: IpAddr = addr_text
            .parse()
            .map_err(|_| ConfigError::field("healthzBindAddress", format!("{addr_text:?} is not an IP address")))?;
        let healthz = (port != 0).then_some(SocketAddr::new(addr, port));
        if healthz.is_some() && !addr.is_loopback() {
            warnings.push(format!(
                "healthzBindAddress {addr} is not a loopback address: /pods (every pod's spec, env values redacted), \
                 /configz and /evictions are served unauthenticated to whoever reaches {addr}:{port}"
            ));
        }
        Ok(EndpointsConfig { healthz })
    }
}

#[cfg(test)]
mod tests {
    use crate::parse;
    use crate::section::HEAD;

    #[test]
    fn a_non_loopback_healthz_address_is_warned_about() {
        let c = parse(&format!("{HEAD}healthzBindAddress: 0.0.0.0\n")).unwrap();
        assert!(c.warnings.iter().any(|w| w.contains("not a loopback address")), "{:?}", c.warnings);
        let c = parse(&format!("{HEAD}healthzBindAddress: 0.0.0.0\nhealthzPort: 0\n")).unwrap();
        assert!(c.warnings.is_empty(), "nothing is served: {:?}", c.warnings);
        assert!(parse(&format!("{HEAD}healthzBindAddress: \"::1\"\n")).unwrap().warnings.is_empty());
    }
}
