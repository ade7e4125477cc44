//! What a pod worker keeps on disk so that a restarted daemon loses no status: each container's restart count,
//! main process, start time and last exit. Written atomically beside the pod's volumes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jiff::Timestamp;

use crate::runtime::ExitInfo;
use crate::status::{PodPhase, Terminal};
use crate::volumes::pod_dir;

/// One container's saved state.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedContainer {
    /// Restarts so far.
    pub restarts: u32,
    /// The main process while it runs.
    pub pid: Option<u32>,
    /// When the current or last run started.
    pub started_at: Option<Timestamp>,
    /// The last exit.
    pub last: Option<ExitInfo>,
}

/// A pod's saved state.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedPod {
    /// By container name.
    pub containers: BTreeMap<String, SavedContainer>,
    /// When the pod was first started.
    pub start_time: Option<Timestamp>,
    /// Set once the pod is over (evicted, failed or succeeded). A restarted daemon keeps it that way instead of
    /// running the pod again. Files written before it was a struct hold a `[phase, reason, message]` array.
    #[serde(default, deserialize_with = "terminal_or_array")]
    pub terminal: Option<Terminal>,
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
            Some(Terminal { phase, reason, message })
        }
    }))
}

fn path(root: &Path, uid: &str) -> PathBuf {
    pod_dir(root, uid).join("nodewarden-state.json")
}

/// Loads a pod's state; a missing or unreadable file gives an empty state (logged when unreadable).
pub fn load(root: &Path, uid: &str) -> SavedPod {
    let p = path(root, uid);
    match std::fs::read(&p) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(file = %p.display(), error = %e, "ignoring an unreadable pod state file");
            SavedPod::default()
        }),
        Err(_) => SavedPod::default(),
    }
}

/// Saves a pod's state (write to a temporary file, then rename).
pub fn save(root: &Path, uid: &str, state: &SavedPod) -> Result<(), String> {
    let p = path(root, uid);
    let dir = p.parent().ok_or("no parent")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tmp = p.with_extension("json.tmp");
    let bytes = serde_json::to_vec(state).map_err(|e| e.to_string())?;
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &p).map_err(|e| format!("{}: {e}", p.display()))
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
        save(dir.path(), "u", &s).unwrap();
        assert_eq!(load(dir.path(), "u"), s);
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
        assert_eq!(load(dir.path(), "u"), SavedPod::default());
    }
}
