//! `statvfs` that cannot hang its caller: a file system that stops answering (a dead NFS mount) blocks the
//! system call, so each path is asked through a thread of its own and waited for at most [`STATFS_TIMEOUT`]. While
//! an earlier call for the path has not returned, the next one fails at once instead of stacking threads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How long a `statvfs` may take before its file system counts as not answering.
pub const STATFS_TIMEOUT: Duration = Duration::from_secs(1);

/// The thread that asks about one path, and whether it owes an answer.
struct Asker {
    ask: Sender<()>,
    answers: Receiver<std::io::Result<rustix::fs::StatVfs>>,
    owes: bool,
}

fn asker(path: &Path) -> std::io::Result<Asker> {
    let (ask, asked) = channel::<()>();
    let (answer, answers) = channel();
    let p = path.to_path_buf();
    std::thread::Builder::new().name("statfs".into()).spawn(move || {
        while asked.recv().is_ok() {
            if answer.send(rustix::fs::statvfs(&p).map_err(std::io::Error::from)).is_err() {
                return;
            }
        }
    })?;
    Ok(Asker { ask, answers, owes: false })
}

/// `statvfs(path)`, or an error of kind `TimedOut` when the file system does not answer in time.
pub fn statvfs(path: &Path) -> std::io::Result<rustix::fs::StatVfs> {
    static ASKERS: Mutex<BTreeMap<PathBuf, Asker>> = Mutex::new(BTreeMap::new());
    let hung =
        || std::io::Error::new(std::io::ErrorKind::TimedOut, format!("did not answer within {STATFS_TIMEOUT:?}"));
    let mut askers = ASKERS.lock().unwrap_or_else(PoisonError::into_inner);
    if !askers.contains_key(path) {
        askers.insert(path.to_path_buf(), asker(path)?);
    }
    let Some(a) = askers.get_mut(path) else { return Err(hung()) };
    if a.owes {
        // The last answer, if it came meanwhile, is stale: drop it and ask again.
        match a.answers.try_recv() {
            Ok(_) => a.owes = false,
            Err(_) => return Err(hung()),
        }
    }
    if a.ask.send(()).is_err() {
        askers.remove(path);
        return Err(std::io::Error::other("the statfs thread is gone"));
    }
    match a.answers.recv_timeout(STATFS_TIMEOUT) {
        Ok(r) => r,
        Err(RecvTimeoutError::Timeout) => {
            a.owes = true;
            Err(hung())
        }
        Err(RecvTimeoutError::Disconnected) => {
            askers.remove(path);
            Err(std::io::Error::other("the statfs thread is gone"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_for_a_live_path_and_errors_for_a_missing_one() {
        assert!(statvfs(Path::new("/")).is_ok_and(|s| s.f_blocks > 0));
        assert!(statvfs(Path::new("/definitely/not/here")).is_err());
        assert!(statvfs(Path::new("/")).is_ok(), "asked again, the thread answers again");
    }
}
