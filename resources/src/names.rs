//! Validation of the names that become cgroup directory names: pod UIDs and container names.
//!
//! A name is checked before it is joined to any path, so that no input can make nodewarden touch a cgroup outside
//! its root.

use crate::error::NameError;

/// The longest name accepted as a cgroup directory name (file names on cgroupfs may be up to 255 bytes).
pub const MAX_NAME_LEN: usize = 253;

/// The longest pod UID accepted. The apiserver's UIDs are UUIDs (36 bytes), static pods' hashes 32; the limit keeps
/// the longest name a UID becomes within `NAME_MAX` (255 bytes): the systemd driver's container slice,
/// `kubepods-besteffort-pod<UID>-<container>.slice`, 30 bytes and a container name around it.
pub const MAX_UID_LEN: usize = 128;

/// The longest container name accepted: a DNS label, as Kubernetes requires.
pub const MAX_CONTAINER_NAME_LEN: usize = 63;

fn check(what: &'static str, name: &str, max: usize, allowed: impl Fn(char) -> bool) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what });
    }
    if name.len() > max {
        let shown: String = name.chars().take(40).collect();
        return Err(NameError::TooLong { what, name: shown, max });
    }
    if name == "." || name == ".." {
        return Err(NameError::Escapes { what, name: name.to_owned() });
    }
    if let Some(bad) = name.chars().find(|c| !allowed(*c)) {
        return Err(NameError::BadChar { what, name: name.to_owned(), bad });
    }
    Ok(())
}

/// Checks a pod UID: ASCII letters, digits, `-` and `_` only (UUIDs, and the hex hashes given to static pods).
pub fn validate_pod_uid(uid: &str) -> Result<(), NameError> {
    check("pod UID", uid, MAX_UID_LEN, |c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Checks a container name: a DNS label (lower-case letters, digits, `-`), as Kubernetes requires; upper case and
/// `_` and `.` are tolerated since they cannot escape a path.
pub fn validate_container_name(name: &str) -> Result<(), NameError> {
    check("container name", name, MAX_CONTAINER_NAME_LEN, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
    })?;
    if name.starts_with('.') {
        return Err(NameError::Escapes { what: "container name", name: name.to_owned() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_uuids_and_labels() {
        assert_eq!(validate_pod_uid("8d6b1a0e-1c5e-4f7e-9b0a-3a6b1d2c3e4f"), Ok(()));
        assert_eq!(validate_container_name("app-1"), Ok(()));
    }

    #[test]
    fn refuses_escapes() {
        for bad in ["..", ".", "../x", "a/b", "/", "a\0b", "pod uid"] {
            assert!(validate_pod_uid(bad).is_err(), "{bad:?} accepted as a UID");
            assert!(validate_container_name(bad).is_err(), "{bad:?} accepted as a container name");
        }
        assert_eq!(
            validate_container_name(".hidden"),
            Err(NameError::Escapes { what: "container name", name: ".hidden".into() })
        );
        assert_eq!(validate_pod_uid(""), Err(NameError::Empty { what: "pod UID" }));
        assert!(matches!(validate_pod_uid(&"a".repeat(300)), Err(NameError::TooLong { .. })));
    }

    #[test]
    fn the_longest_names_accepted_stay_within_name_max() {
        let uid = "a".repeat(MAX_UID_LEN);
        let name = "c".repeat(MAX_CONTAINER_NAME_LEN);
        assert_eq!(validate_pod_uid(&uid), Ok(()));
        assert_eq!(validate_container_name(&name), Ok(()));
        assert!(matches!(validate_pod_uid(&format!("{uid}a")), Err(NameError::TooLong { max: 128, .. })));
        assert!(matches!(validate_container_name(&format!("{name}c")), Err(NameError::TooLong { max: 63, .. })));
        // The longest directory names they become, under either driver.
        let longest = [format!("pod{uid}"), format!("kubepods-besteffort-pod{uid}-{name}.slice")];
        assert!(longest.iter().all(|n| n.len() <= 255), "{:?}", longest.map(|n| n.len()));
    }
}
