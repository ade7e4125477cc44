//! Reading a whole file that a user or a peer may make arbitrarily large (a config file, a manifest): never more
//! than a limit is read, even from a file that grows while it is read.

use std::io::Read;
use std::path::Path;

/// Why a bounded read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundedReadError {
    /// The file could not be opened or read.
    #[error("{0}")]
    Io(String),
    /// The file is larger than the limit.
    #[error("{size} bytes is larger than the {max} byte limit")]
    TooLarge {
        /// Its size (or, for a file that grew while read, more than `max`).
        size: u64,
        /// The limit.
        max: u64,
    },
}

/// Reads the file at `path`, refusing one larger than `max` bytes without reading it.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, BoundedReadError> {
    let io = |e: std::io::Error| BoundedReadError::Io(e.to_string());
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size > max {
        return Err(BoundedReadError::TooLarge { size, max });
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > max {
        return Err(BoundedReadError::TooLarge { size: read, max });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_files_over_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(read_bounded(&p, 5).unwrap(), b"12345");
        assert_eq!(read_bounded(&p, 4), Err(BoundedReadError::TooLarge { size: 5, max: 4 }));
        assert!(matches!(read_bounded(&dir.path().join("missing"), 5), Err(BoundedReadError::Io(_))));
        // A device that never ends is cut at the limit.
        assert!(matches!(read_bounded(Path::new("/dev/zero"), 1024), Err(BoundedReadError::TooLarge { .. })));
    }
}
