//! What the Node reports about the machine: hostname, address, machine and boot IDs, kernel, OS image.

use std::net::{IpAddr, UdpSocket};
use std::path::Path;

/// The machine's identity, read once at start (the boot ID cannot change while the daemon runs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostInfo {
    /// The host name, lower case (the `Hostname` address and the `kubernetes.io/hostname` label).
    pub hostname: String,
    /// The `InternalIP` address, if one was found.
    pub internal_ip: Option<String>,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// The DMI product UUID, where readable.
    pub system_uuid: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_image: String,
}

fn first_line(path: &Path) -> String {
    std::fs::read_to_string(path).ok().and_then(|s| s.lines().next().map(|l| l.trim().to_owned())).unwrap_or_default()
}

/// `PRETTY_NAME` from an os-release file's text, unquoted.
pub fn pretty_name(os_release: &str) -> Option<String> {
    os_release.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|v| v.trim().trim_matches('"').to_owned())
}

/// The host name's address in a hosts file's text, if it is not a loopback address.
pub fn hosts_address(hosts: &str, hostname: &str) -> Option<IpAddr> {
    hosts
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let ip: IpAddr = f.next()?.parse().ok()?;
            f.any(|n| n.eq_ignore_ascii_case(hostname)).then_some(ip)
        })
        .find(|ip| !ip.is_loopback())
}

/// The host name, lower case, as the Node's `Hostname` address and label show it.
fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().to_lowercase()
}

/// The node's address (its `InternalIP`, and every pod's `hostIP`): the address of the interface that would
/// carry traffic out (a UDP socket is connected, nothing is sent); else the host name's address in `/etc/hosts`;
/// else none. No DNS is asked: a node without a resolver must not wait for one at start.
pub fn node_ip() -> Option<IpAddr> {
    let routed = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .and_then(|s| s.local_addr())
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback());
    routed.or_else(|| hosts_address(&std::fs::read_to_string("/etc/hosts").ok()?, &hostname()))
}

impl HostInfo {
    /// Reads the running machine; `node_ip` is its address (`--node-ip`, or what [`node_ip`] found at start).
    pub fn read(node_ip: Option<IpAddr>) -> HostInfo {
        let hostname = hostname();
        let os_image = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|t| pretty_name(&t))
            .unwrap_or_else(|| "Linux".to_owned());
        HostInfo {
            internal_ip: node_ip.map(|ip| ip.to_string()),
            machine_id: first_line(Path::new("/etc/machine-id")),
            system_uuid: first_line(Path::new("/sys/class/dmi/id/product_uuid")),
            boot_id: first_line(Path::new("/proc/sys/kernel/random/boot_id")),
            kernel_version: rustix::system::uname().release().to_string_lossy().into_owned(),
            os_image,
            hostname,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_names() {
        assert_eq!(
            pretty_name("ID=debian\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(pretty_name("ID=x\n"), None);
        let hosts = "127.0.0.1 localhost\n127.0.1.1 h1\n10.0.0.5 h1 h1.example # the node\n";
        assert_eq!(hosts_address(hosts, "H1"), Some("10.0.0.5".parse().unwrap()));
        assert_eq!(hosts_address(hosts, "other"), None);
        let h = HostInfo::read(None);
        assert!(!h.hostname.is_empty());
        assert_eq!(h.boot_id.len(), 36, "{h:?}");
    }
}
