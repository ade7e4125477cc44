//! One daemon per node: an exclusive `flock(2)` on the `rootDir` directory itself and on
//! `<rootDir>/nodewarden.lock`, taken before anything else is touched and held for the daemon's life. The
//! directory's lock holds when the lock file is removed (a clean-up of rootDir), since a clean-up of its contents
//! does not replace the directory; the file's lock is what earlier versions took. The kernel drops both when the
//! process ends, however it ends, so a `kill -9` leaves no stale lock. The file keeps the holder's PID for the
//! message a second daemon prints; a PID that cannot be written (a full disk) costs only that message.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode, OFlags, flock, open};

/// The lock file's name in `rootDir`.
pub const LOCK_FILE: &str = "nodewarden.lock";

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another nodewarden is running with rootDir {} (PID {holder}, holding {}); stop it first, or give this one \
         a rootDir of its own",
        dir.display(),
        path.display()
    )]
    Held {
        /// The root directory.
        dir: PathBuf,
        /// The lock file.
        path: PathBuf,
        /// What the file says about its holder (its PID, or `unknown`).
        holder: String,
    },
    /// The file cannot be created or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The lock, held until dropped (or the process ends).
#[derive(Debug)]
pub struct NodeLock {
    _dir: OwnedFd,
    _file: File,
}

/// The PID a lock file names, for the message of a daemon that found it held.
fn holder_of(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(file) = File::open(path) {
        let _ = file.take(64).read_to_string(&mut text);
    }
    let holder = text.trim();
    if holder.is_empty() { "unknown".to_owned() } else { holder.to_owned() }
}

/// Takes the node lock in `root_dir` (created if missing), without waiting.
pub fn lock(root_dir: &Path) -> Result<NodeLock, LockError> {
    let path = root_dir.join(LOCK_FILE);
    let io = |p: &Path, source| LockError::Io { path: p.to_path_buf(), source };
    std::fs::create_dir_all(root_dir).map_err(|e| io(root_dir, e))?;
    let held = || LockError::Held { dir: root_dir.to_path_buf(), path: path.clone(), holder: holder_of(&path) };
    // Close-on-exec, so no container inherits a lock.
    let dir = open(root_dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| io(root_dir, e.into()))?;
    match flock(&dir, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Err(held()),
        Err(e) => return Err(io(root_dir, e.into())),
    }
    // No O_TRUNC before the lock is held (the holder's PID would be lost); no following a planted symlink.
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut file = File::from(open(&path, flags, Mode::from_raw_mode(0o644)).map_err(|e| io(&path, e.into()))?);
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Err(held()),
        Err(e) => return Err(io(&path, e.into())),
    }
    let written = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id()));
    if let Err(e) = written {
        // The daemon must start on the disk it may have to relieve; only the holder's PID is lost.
        tracing::warn!(file = %path.display(), error = %e, "cannot write the daemon's PID into the lock file; the lock holds");
    }
    Ok(NodeLock { _dir: dir, _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_root_is_refused_with_the_holder_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let held = lock(&root).unwrap();
        let text = std::fs::read_to_string(root.join(LOCK_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // flock locks belong to the open file: a second open in this process conflicts as another process would.
        let err = lock(&root).unwrap_err();
        assert!(matches!(&err, LockError::Held { holder, .. } if *holder == std::process::id().to_string()), "{err}");
        assert!(err.to_string().contains("another nodewarden is running"), "{err}");
        // Released with the holder: the next daemon takes it.
        drop(held);
        lock(&root).unwrap();
    }

    #[test]
    fn removing_the_lock_file_does_not_let_a_second_daemon_in() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let _held = lock(&root).unwrap();
        std::fs::remove_file(root.join(LOCK_FILE)).unwrap();
        let err = lock(&root).unwrap_err();
        assert!(matches!(&err, LockError::Held { .. }), "{err}");
    }

    #[test]
    fn a_symlink_planted_as_the_lock_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE)).unwrap();
        assert!(matches!(lock(dir.path()), Err(LockError::Io { .. })));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
