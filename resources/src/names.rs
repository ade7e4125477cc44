//! Validation of the names that become cgroup directory names: pod UIDs and container names.
//!
//! A name is checked before it is joined to any path, so that no input can make nodewarden touch a cgroup outside
//! its root.

use crate::error::NameError;

/// The longest name accepted. Kubernetes container names are DNS labels (63 bytes) and UIDs are 36 bytes; file
/// names on cgroupfs may be up to 255 bytes.
pub const MAX_NAME_LEN: usize = 253;

fn check(what: &'static str, name: &str, allowed: impl Fn(char) -> bool) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what });
    }
    if name.len() > MAX_NAME_LEN {
        let shown: String = name.chars().take(40).collect();
        return Err(NameError::TooLong { what, name: shown, max: MAX_NAME_LEN });
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
    check("pod UID", uid, |c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Checks a container name: a DNS label (lower-case letters, digits, `-`), as Kubernetes requires; upper case and
/// `_` and `.` are tolerated since they cannot escape a path.
pub fn validate_container_name(name: &str) -> Result<(), NameError> {
    check("container name", name, |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))?;
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
}
