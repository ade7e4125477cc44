//! Typed errors of the resources crate. Every error that touches a file carries the path and the operation.

use std::io;
use std::path::PathBuf;

/// The file operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Reading a file.
    Read,
    /// Writing a file.
    Write,
    /// Creating a cgroup directory.
    Create,
    /// Removing a cgroup directory.
    Remove,
    /// Listing a directory.
    List,
    /// Querying a file system.
    Statfs,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Create => "create",
            Op::Remove => "remove",
            Op::List => "list",
            Op::Statfs => "statfs",
        })
    }
}

/// An I/O failure on a kernel file, with the path and the operation.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {}: {source}", path.display())]
pub struct IoError {
    /// What was being done.
    pub op: Op,
    /// The file or directory.
    pub path: PathBuf,
    /// The underlying error.
    #[source]
    pub source: io::Error,
}

impl IoError {
    /// Wraps an I/O error with its operation and path.
    pub fn new(op: Op, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self { op, path: path.into(), source }
    }

    /// The raw OS error number, when there is one (EBUSY, EINVAL, ENOENT, ...).
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// True when the file or directory does not exist.
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == io::ErrorKind::NotFound
    }
}

/// A kernel file whose content could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {}: {reason}", path.display())]
pub struct ParseError {
    /// The file.
    pub path: PathBuf,
    /// What was wrong.
    pub reason: String,
}

/// A name that may not become part of a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("{what} is empty")]
    Empty {
        /// What the name names (pod UID, container name).
        what: &'static str,
    },
    /// The name is longer than allowed.
    #[error("{what} {name:?} is longer than {max} bytes")]
    TooLong {
        /// What the name names.
        what: &'static str,
        /// The name, truncated for display.
        name: String,
        /// The maximum length.
        max: usize,
    },
    /// The name holds a character that is not allowed, such as `/`, NUL or `.` in a position that escapes.
    #[error("{what} {name:?} contains {bad:?}, which is not allowed in a cgroup name")]
    BadChar {
        /// What the name names.
        what: &'static str,
        /// The name.
        name: String,
        /// The offending character.
        bad: char,
    },
    /// The name is `.` or `..` or otherwise would leave its parent directory.
    #[error("{what} {name:?} would escape its parent cgroup")]
    Escapes {
        /// What the name names.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A path that the systemd driver cannot read as a slice.
    #[error(
        "{path} is neither plain components (read as the kubelet reads them) nor the path systemd gives its last \
         slice (such as /a.slice/a-b.slice)"
    )]
    NotASlice {
        /// The path.
        path: String,
    },
}

/// Any error of a cgroupfs operation.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A file's content could not be parsed.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A name was refused before it became a path.
    #[error(transparent)]
    Name(#[from] NameError),
    /// systemd did not start, change or stop a slice (the systemd driver).
    #[error(transparent)]
    Unit(#[from] crate::systemd::UnitError),
}
