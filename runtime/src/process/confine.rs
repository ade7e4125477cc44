//! What of a container's `securityContext` a host process can have, and the refusal of the rest. The process
//! runtime shares the host's root file system, network, `/proc` and the daemon's seccomp state, so
//! `readOnlyRootFilesystem`, a seccomp profile other than `Unconfined` and pod `sysctls` are refused naming the
//! field; `allowPrivilegeEscalation: false` (no_new_privs), dropped capabilities, the user, its primary group and
//! the supplemental groups are applied in the child before it execs.

use rustix::thread::CapabilitySet;

use crate::seam::{ContainerSpec, RuntimeError};
use crate::security::Seccomp;

/// The group of a user without a `runAsGroup` and without an entry in `/etc/passwd`: the overflow group, never
/// root's.
pub const NOGROUP: u32 = 65534;

/// Refuses what a host process cannot be given.
pub(super) fn check(spec: &ContainerSpec) -> Result<(), RuntimeError> {
    let s = &spec.security;
    let refuse = |field: &str, why: &str| {
        Err(RuntimeError::Config(format!("{field} is not supported by the process runtime: {why}")))
    };
    if s.read_only_root {
        return refuse("securityContext.readOnlyRootFilesystem", "containers share the host's file system");
    }
    if s.seccomp != Seccomp::Unconfined {
        return refuse("seccompProfile", "only Unconfined is (the process keeps the daemon's seccomp state)");
    }
    if !s.sysctls.is_empty() {
        return refuse("spec.securityContext.sysctls", "pods share the host's kernel parameters");
    }
    if !s.add_capabilities.is_empty() && spec.user.is_some_and(|u| u != 0) {
        return refuse("securityContext.capabilities.add", "a non-root user gets no capabilities from it");
    }
    Ok(())
}

/// The capabilities named in `capabilities.drop` (`ALL` is every one).
pub(super) fn dropped(names: &[String]) -> CapabilitySet {
    names.iter().fold(CapabilitySet::empty(), |set, n| {
        if n == "ALL" {
            CapabilitySet::all()
        } else {
            set | CapabilitySet::from_name(n).unwrap_or(CapabilitySet::empty())
        }
    })
}

/// The primary group of `uid` in `passwd` (the text of `/etc/passwd`), else [`NOGROUP`]; a user other than root
/// whose passwd group is root's (`operator:x:11:0`) gets [`NOGROUP`] too.
pub(super) fn primary_group(passwd: &str, uid: u32) -> u32 {
    let gid = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.get(2).and_then(|u| u.parse::<u32>().ok()) == Some(uid))
        .and_then(|f| f.get(3).and_then(|g| g.parse().ok()))
        .unwrap_or(NOGROUP);
    if gid == 0 && uid != 0 { NOGROUP } else { gid }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_without_a_group_gets_its_passwd_group_and_never_root() {
        let passwd =
            "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/usr/sbin/nologin\nweb:x:1000:1001::/:/bin/sh\n";
        assert_eq!(primary_group(passwd, 1000), 1001);
        assert_eq!(primary_group(passwd, 0), 0);
        assert_eq!(
            primary_group("operator:x:11:0::/root:/sbin/nologin\n", 11),
            NOGROUP,
            "never root's group by default"
        );
        assert_eq!(primary_group(passwd, 4242), NOGROUP);
        assert_eq!(primary_group("garbage\n::x:\n", 4242), NOGROUP);
    }

    #[test]
    fn names_dropped_capabilities() {
        assert_eq!(dropped(&["NET_RAW".into(), "CHOWN".into()]), CapabilitySet::NET_RAW | CapabilitySet::CHOWN);
        assert_eq!(dropped(&["ALL".into()]), CapabilitySet::all());
        assert_eq!(dropped(&[]), CapabilitySet::empty());
        assert!(
            !(dropped(&["ALL".into()]) - dropped(&["NET_BIND_SERVICE".into()]))
                .contains(CapabilitySet::NET_BIND_SERVICE)
        );
    }
}
