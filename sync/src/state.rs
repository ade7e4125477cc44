//! What a pod worker keeps on disk so that a restarted daemon loses no status: each container's restart count,
//! main process, start time and last exit. Written atomically and durably (the file and its directory synced)
//! beside the pod's volumes, and stamped with the pod's UID, so a file that belongs to another pod is ignored.
//! A pod's status is published only after the save of what it says has returned, so a daemon killed right after it
//! reported a start adopts the container with the start time and restart count it reported.
//!
//! That a pod is over (evicted, failed, succeeded) is also written to a small record whose space is reserved when
//! the pod's directory is marked as nodewarden's (or, if that failed, at a later save): writing it in place needs
//! no new blocks, so an eviction under nodefs pressure (ENOSPC on rootDir) still survives a restart, and a state
//! file lost or truncated meanwhile cannot bring the pod back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jiff::Timestamp;

use crate::status::{PodPhase, Terminal};
use crate::volumes::pod_dir;
use nodewarden_runtime::{ContainerId, ExitInfo};

/// One container's saved state.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedContainer {
    /// Restarts so far.
    pub restarts: u32,
    /// The main process while it runs.
    pub pid: Option<u32>,
    /// The main process's start time in clock ticks after boot (absent in files written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_start: Option<u64>,
    /// When the current or last run started.
    pub started_at: Option<Timestamp>,
    /// The last exit.
    pub last: Option<ExitInfo>,
    /// The runtime's ID of the current run while it runs (absent in files written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<ContainerId>,
    /// The runtime's ID of the run that ended last, kept as a dead container (absent in files written before it
    /// was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_id: Option<ContainerId>,
}

/// A pod's saved state.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedPod {
    /// The pod this state belongs to (absent in files written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// By container name.
    pub containers: BTreeMap<String, SavedContainer>,
    /// When the pod was first started.
    pub start_time: Option<Timestamp>,
    /// Set once the pod is over (evicted, failed or succeeded). A restarted daemon keeps it that way instead of
    /// running the pod again. Files written before it was a struct hold a `[phase, reason, message]` array.
    #[serde(default, deserialize_with = "terminal_or_array")]
    pub terminal: Option<Terminal>,
    /// While the pod is being deleted: when its grace period ends. A daemon restarted meanwhile gives the pod the
    /// rest of it (the kubelet keeps the grace period in container labels), not a fresh default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_deadline: Option<Timestamp>,
}

/// `SavedPod.terminal` as saved now, or as an array by earlier versions.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum SavedTerminal {
    Struct(Terminal),
    Array(String, Option<String>, Option<String>),
}

fn terminal_or_array<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Terminal>, D::Error> {
    let saved: Option<SavedTerminal> = serde::Deserialize::deserialize(d)?;
    Ok(saved.and_then(|t| match t {
        SavedTerminal::Struct(t) => Some(t),
        SavedTerminal::Array(phase, reason, message) => {
            let phase = match phase.as_str() {
                "Succeeded" => PodPhase::Succeeded,
                "Failed" => PodPhase::Failed,
                // A deleted pod's placeholder: nothing to keep.
                _ => return None,
            };
            Some(Terminal { reason, message, ..Terminal::ended(phase) })
        }
    }))
}

fn path(root: &Path, uid: &str) -> PathBuf {
    pod_dir(root, uid).join("nodewarden-state.json")
}

fn terminal_path(root: &Path, uid: &str) -> PathBuf {
    pod_dir(root, uid).join("nodewarden-terminal")
}

/// The space reserved for the terminal record.
const TERMINAL_RECORD_BYTES: u64 = 4096;

/// The terminal record's content.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct TerminalRecord {
    uid: String,
    terminal: Terminal,
}

/// Why a saved file was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not a state file (or a terminal record) of this version or an earlier one.
    #[error("unreadable: {0}")]
    Unreadable(String),
    /// It belongs to another pod.
    #[error("it belongs to pod {0}")]
    OtherPod(String),
}

/// The terminal state in a terminal record's bytes (up to the first NUL of its reserved space), when it holds one
/// for `uid`; `Ok(None)` for an empty record.
pub fn decode_terminal(bytes: &[u8], uid: &str) -> Result<Option<Terminal>, StateError> {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    if end == 0 {
        return Ok(None);
    }
    let r: TerminalRecord = serde_json::from_slice(&bytes[..end]).map_err(|e| StateError::Unreadable(e.to_string()))?;
    if r.uid != uid {
        return Err(StateError::OtherPod(r.uid));
    }
    Ok(Some(r.terminal))
}

/// The terminal state in the record, when it holds one for `uid`.
fn load_terminal(root: &Path, uid: &str) -> Option<Terminal> {
    let p = terminal_path(root, uid);
    let bytes = nodewarden_resources::read_bounded(&p, TERMINAL_RECORD_BYTES).ok()?;
    decode_terminal(&bytes, uid).unwrap_or_else(|e| {
        tracing::warn!(file = %p.display(), error = %e, "ignoring a terminal record");
        None
    })
}

/// A pod's state from a state file's bytes: refused when unreadable or stamped with another pod's UID (files
/// written before the stamp was recorded have none and are taken).
pub fn decode(bytes: &[u8], uid: &str) -> Result<SavedPod, StateError> {
    let s: SavedPod = serde_json::from_slice(bytes).map_err(|e| StateError::Unreadable(e.to_string()))?;
    match &s.uid {
        Some(other) if other != uid => Err(StateError::OtherPod(other.clone())),
        _ => Ok(s),
    }
}

/// The bytes of a state file for `uid`, as [`save`] writes them.
pub fn encode(uid: &str, state: &SavedPod) -> Result<Vec<u8>, String> {
    let stamped = SavedPod { uid: Some(uid.to_owned()), ..state.clone() };
    serde_json::to_vec(&stamped).map_err(|e| e.to_string())
}

/// Loads a pod's state; a missing or unreadable file gives an empty state (logged when unreadable), and so does
/// one stamped with another pod's UID. The pod is terminal if either the state or the terminal record says so.
pub fn load(root: &Path, uid: &str) -> SavedPod {
    let p = path(root, uid);
    let mut saved = match std::fs::read(&p) {
        Ok(bytes) => decode(&bytes, uid).unwrap_or_else(|e| {
            tracing::warn!(file = %p.display(), error = %e, "ignoring a pod state file");
            SavedPod::default()
        }),
        Err(_) => SavedPod::default(),
    };
    if saved.terminal.is_none() {
        saved.terminal = load_terminal(root, uid);
    }
    saved
}

/// Whether nodewarden made the pod directory of `uid` (its state or terminal record is there). Start-up cleans up
/// only such pods: a pod cgroup or a `<rootDir>/pods` entry without the mark (a kubelet's, a stray one) is left
/// alone.
pub fn is_ours(root: &Path, uid: &str) -> bool {
    path(root, uid).exists() || terminal_path(root, uid).exists()
}

/// Syncs a directory, so that a rename or a new entry in it survives a power loss.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// A terminal record's bytes for `uid`, padded with NULs to its reserved size. A message too long for it is left
/// out (the record keeps the phase and reason); a record that does not fit even so is refused, never cut.
pub fn encode_terminal(uid: &str, terminal: &Terminal) -> Result<Vec<u8>, String> {
    let room = usize::try_from(TERMINAL_RECORD_BYTES).unwrap_or(usize::MAX);
    let record = |terminal: Terminal| {
        serde_json::to_vec(&TerminalRecord { uid: uid.to_owned(), terminal }).map_err(|e| e.to_string())
    };
    let mut bytes = record(terminal.clone())?;
    if bytes.len() >= room {
        bytes = record(Terminal { message: None, ..terminal.clone() })?;
    }
    if bytes.len() >= room {
        return Err(format!("a terminal record of {} bytes does not fit in {room}", bytes.len()));
    }
    bytes.resize(room, 0);
    Ok(bytes)
}

/// Opens (or makes) the terminal record of `uid` and reserves its space when it is short of it; says whether it
/// reserved just now. Nothing is synced.
fn open_terminal(root: &Path, uid: &str) -> std::io::Result<(std::fs::File, bool)> {
    let f = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(terminal_path(root, uid))?;
    // Reserved until it holds its full size (a reservation that failed, ENOSPC, is tried again).
    let short = f.metadata()?.len() < TERMINAL_RECORD_BYTES;
    if short {
        rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, TERMINAL_RECORD_BYTES)?;
    }
    Ok((f, short))
}

/// A pod's state or mark that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct WriteError {
    /// The file or directory that could not be written.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError { path: path.to_path_buf(), source }
}

/// Marks the pod directory of `uid` as nodewarden's (see [`is_ours`]) before anything else of the pod exists: the
/// directory and the terminal record with its space reserved, so that an eviction before the pod's first [`save`]
/// can still be written on a full file system. Nothing is synced: the mark only has to be seen by a daemon that
/// restarts on the same boot (the pod's cgroups do not outlive a boot), and the pod's first save makes it durable.
pub fn mark(root: &Path, uid: &str) -> Result<(), WriteError> {
    let dir = pod_dir(root, uid);
    std::fs::create_dir_all(&dir).map_err(at(&dir))?;
    close_pods_dir(root).map_err(at(&root.join("pods")))?;
    open_terminal(root, uid).map(drop).map_err(at(&terminal_path(root, uid)))
}

/// Keeps `<rootDir>/pods` closed to other users (`0750`, as the kubelet makes it): the pods' volumes below it hold
/// Secrets and service account tokens, which only root (the runtimes, mounting them) may reach from the host.
/// A directory an earlier version left open is closed.
fn close_pods_dir(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let pods = root.join("pods");
    let mode = std::fs::symlink_metadata(&pods)?.permissions().mode() & 0o7777;
    if mode & 0o007 != 0 {
        std::fs::set_permissions(&pods, std::fs::Permissions::from_mode(mode & 0o7770))?;
    }
    Ok(())
}

/// Writes the terminal record in its reserved space, or reserves the space when the pod is not over yet. The
/// record's file is synced when it was reserved now or `first`. Says, also with an error, whether its directory
/// entry then still needs the directory synced.
fn save_terminal(root: &Path, uid: &str, terminal: Option<&Terminal>, first: bool) -> (bool, std::io::Result<()>) {
    use std::io::{Seek, Write};
    let (mut f, reserved) = match open_terminal(root, uid) {
        Ok(opened) => opened,
        Err(e) => return (false, Err(e)),
    };
    let new = reserved || first;
    let mut write = || -> std::io::Result<()> {
        if let Some(terminal) = terminal {
            let bytes = encode_terminal(uid, terminal).map_err(std::io::Error::other)?;
            f.rewind()?;
            f.write_all(&bytes)?;
        }
        // One sync: the whole file (its reservation) when it is new to this worker, else the record's data.
        match (new, terminal) {
            (true, _) => f.sync_all(),
            (false, Some(_)) => f.sync_data(),
            (false, None) => Ok(()),
        }
    };
    (new, write())
}

/// Saves a pod's state durably: written to a temporary file and synced, renamed over the old one, the directory
/// synced. The terminal record is written first, so a pod that is over stays over even when the state file
/// cannot be written (ENOSPC). `first` says this is the first save since the pod was [`mark`]ed or taken over
/// from an earlier daemon: the terminal record and the directory are then synced even where this save does not
/// change them. The directory is synced once per save, also when the state file could not be written.
pub fn save(root: &Path, uid: &str, state: &SavedPod, first: bool) -> Result<(), WriteError> {
    use std::io::Write;
    let p = path(root, uid);
    let bytes = encode(uid, state).map_err(|e| at(&p)(std::io::Error::other(e)))?;
    let dir = pod_dir(root, uid);
    std::fs::create_dir_all(&dir).map_err(at(&dir))?;
    let (record_new, record) = save_terminal(root, uid, state.terminal.as_ref(), first);
    if let (Err(e), Some(_)) = (&record, &state.terminal) {
        tracing::warn!(pod_uid = %uid, error = %e, "cannot write the terminal record");
    }
    let tmp = p.with_extension("json.tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &p)
    };
    let written = write();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    // The rename, and a terminal record made in this save even when the state file could not be written.
    let synced = if written.is_ok() || record_new { sync_dir(&dir) } else { Ok(()) };
    written.map_err(at(&p))?;
    synced.map_err(at(&dir))?;
    // A record this save had to make durable and could not is an error, so that the next save is a first one
    // again; a record that was durable already is only logged above (the state file says the same).
    if record_new {
        record.map_err(at(&terminal_path(root, uid)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tolerates_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path(), "u"), SavedPod::default());
        let mut s = SavedPod::default();
        s.containers.insert("app".into(), SavedContainer { restarts: 3, pid: Some(42), ..Default::default() });
        s.terminal = Some(Terminal::failed(Some("Evicted".into()), Some("low on memory".into())));
        save(dir.path(), "u", &s, true).unwrap();
        assert_eq!(load(dir.path(), "u"), SavedPod { uid: Some("u".into()), ..s.clone() });
        let text = std::fs::read_to_string(path(dir.path(), "u")).unwrap();
        assert!(
            text.contains(r#""terminal":{"phase":"Failed","reason":"Evicted","message":"low on memory"}"#),
            "{text}"
        );
        // An earlier version's array.
        std::fs::write(path(dir.path(), "u"), r#"{"containers":{},"terminal":["Failed","Evicted","low"]}"#).unwrap();
        let evicted = Terminal::failed(Some("Evicted".into()), Some("low".into()));
        assert_eq!(load(dir.path(), "u").terminal, Some(evicted));
        std::fs::write(path(dir.path(), "u"), "{").unwrap();
        assert_eq!(load(dir.path(), "u").containers, BTreeMap::new());
    }

    #[test]
    fn a_foreign_or_truncated_state_file_neither_ends_nor_revives_a_pod() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Another pod's file, copied here: its terminal state and counts are not taken.
        let mut other = SavedPod::default();
        other.containers.insert("app".into(), SavedContainer { restarts: 9, ..Default::default() });
        other.terminal = Some(Terminal::failed(Some("Evicted".into()), None));
        save(root, "other", &other, true).unwrap();
        std::fs::create_dir_all(pod_dir(root, "u")).unwrap();
        std::fs::copy(path(root, "other"), path(root, "u")).unwrap();
        std::fs::copy(terminal_path(root, "other"), terminal_path(root, "u")).unwrap();
        let loaded = load(root, "u");
        assert_eq!((loaded.terminal, loaded.containers.len()), (None, 0));
        // This pod's own eviction, then its state file truncated (a power loss before the data reached the disk):
        // the terminal record keeps it evicted.
        let evicted = SavedPod { terminal: Some(Terminal::failed(Some("Evicted".into()), None)), ..Default::default() };
        save(root, "u", &evicted, true).unwrap();
        std::fs::write(path(root, "u"), "").unwrap();
        assert_eq!(load(root, "u").terminal, evicted.terminal);
        std::fs::remove_file(path(root, "u")).unwrap();
        assert_eq!(load(root, "u").terminal, evicted.terminal);
    }

    /// Evicts pod `u` on a full file system after `before` (a save or only the mark); checks that the eviction
    /// survives a restart although its state file could not be written.
    fn evicted_on_a_full_root_dir(before: impl Fn(&Path), first: bool) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(&root)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a small tmpfs here");
            return;
        }
        before(&root);
        // Fill the file system.
        let mut i = 0;
        while std::fs::write(root.join(format!("fill{i}")), vec![0u8; 4096]).is_ok() {
            i += 1;
        }
        let _ = std::fs::write(root.join("fill-last"), vec![0u8; 512]);
        let evicted = SavedPod {
            terminal: Some(Terminal::failed(
                Some("Evicted".into()),
                Some("The node was low on resource: ephemeral-storage.".into()),
            )),
            start_time: Some(Timestamp::UNIX_EPOCH),
            ..Default::default()
        };
        let saved = save(&root, "u", &evicted, first);
        let loaded = load(&root, "u");
        let _ = std::process::Command::new("umount").arg(&root).status();
        assert!(saved.is_err(), "the state file was written on a full file system");
        assert_eq!(loaded.terminal, evicted.terminal, "the eviction was lost");
    }

    #[test]
    fn an_eviction_on_a_full_root_dir_survives_a_restart() {
        let running = SavedPod { start_time: Some(Timestamp::UNIX_EPOCH), ..Default::default() };
        evicted_on_a_full_root_dir(|root| save(root, "u", &running, true).unwrap(), false);
    }

    #[test]
    fn an_eviction_before_the_first_save_on_a_full_root_dir_survives_a_restart() {
        // Only the mark was down (the pod was evicted while its image was pulled): it reserved the record's space.
        evicted_on_a_full_root_dir(|root| mark(root, "u").unwrap(), true);
    }

    #[test]
    fn the_mark_is_a_reserved_terminal_record_and_no_state() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_ours(dir.path(), "u"));
        mark(dir.path(), "u").unwrap();
        assert!(is_ours(dir.path(), "u"));
        // The pods' directory is closed to other users: their volumes hold Secrets and tokens.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("pods")) & 0o007, 0);
        std::fs::set_permissions(dir.path().join("pods"), std::fs::Permissions::from_mode(0o755)).unwrap();
        mark(dir.path(), "v").unwrap();
        assert_eq!(mode(&dir.path().join("pods")), 0o750, "an open one left by an earlier version is closed");
        let record = std::fs::metadata(terminal_path(dir.path(), "u")).unwrap();
        assert_eq!(record.len(), TERMINAL_RECORD_BYTES);
        assert_eq!(load(dir.path(), "u"), SavedPod::default());
        // Marked again (a worker that took the pod over): nothing changes, a record that holds a terminal state
        // included.
        mark(dir.path(), "u").unwrap();
        assert_eq!(load(dir.path(), "u"), SavedPod::default());
        let evicted = SavedPod { terminal: Some(Terminal::failed(Some("Evicted".into()), None)), ..Default::default() };
        save(dir.path(), "u", &evicted, true).unwrap();
        std::fs::remove_file(path(dir.path(), "u")).unwrap();
        mark(dir.path(), "u").unwrap();
        assert_eq!(load(dir.path(), "u").terminal, evicted.terminal);
    }
}
