//! Pod sources. A source sends the whole set of pods it has whenever that set may have changed; the pod manager
//! works out what was added, changed and removed. The static pod directory is the first source; an apiserver
//! source implements the same trait.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use inotify::{EventMask, Inotify, WatchMask};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::manifest::{ManifestError, parse_static_pod, read_manifest};

/// A manifest that was refused, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidManifest {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: ManifestError,
}

/// Everything one source has now.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSnapshot {
    /// The source's name (`file`, `api`).
    pub source: &'static str,
    /// The valid pods, each with its UID set.
    pub pods: Vec<Pod>,
    /// What was refused.
    pub invalid: Vec<InvalidManifest>,
}

/// A source of pods: runs until shutdown, sending a snapshot after each change.
pub trait PodSource: Send + 'static {
    /// Runs the source. The first snapshot is the initial state; the manager treats pods it adopted and that no
    /// first snapshot names as gone.
    fn run(self, tx: mpsc::Sender<SourceSnapshot>, shutdown: CancellationToken) -> impl Future<Output = ()> + Send;
}

/// True for files in the manifest directory that are not manifests: hidden files (as the kubelet skips them),
/// and the backup, swap and temporary files editors and package managers leave beside the files they edit.
pub fn is_ignored_file(name: &str) -> bool {
    const SUFFIXES: [&str; 9] = ["~", ".swp", ".swo", ".swx", ".tmp", ".bak", ".orig", ".rpmnew", ".dpkg-new"];
    name.starts_with('.')
        || name.starts_with('#')
        || SUFFIXES.iter().any(|s| name.ends_with(s))
        || name.contains(".dpkg-")
        // vim creates and removes a file named 4913 to test whether it may write the directory.
        || name == "4913"
}

/// A file's identity and version, so unchanged files are not parsed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FileKey {
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

/// The static pod directory (`staticPodPath`), watched with inotify and rescanned every `fileCheckFrequency`.
#[derive(Debug)]
pub struct StaticPodSource {
    dir: PathBuf,
    node_name: String,
    resync: Duration,
    cache: HashMap<PathBuf, (FileKey, Result<Pod, ManifestError>)>,
}

impl StaticPodSource {
    /// A source for `dir` on node `node_name`, rescanned every `resync` besides the inotify events.
    pub fn new(dir: impl Into<PathBuf>, node_name: impl Into<String>, resync: Duration) -> Self {
        Self { dir: dir.into(), node_name: node_name.into(), resync, cache: HashMap::new() }
    }

    /// Reads the directory: each manifest file parsed (or taken from the cache when unchanged), pods with the
    /// same namespace and name in two files refused after the first.
    pub fn scan(&mut self) -> SourceSnapshot {
        let mut files: Vec<(PathBuf, FileKey)> = Vec::new();
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                for e in entries.flatten() {
                    let name = e.file_name();
                    if is_ignored_file(&name.to_string_lossy()) {
                        continue;
                    }
                    use std::os::unix::fs::MetadataExt;
                    // Follow symlinks, as a file read would.
                    let Ok(meta) = std::fs::metadata(e.path()) else { continue };
                    if !meta.is_file() {
                        continue;
                    }
                    let key = FileKey {
                        ino: meta.ino(),
                        len: meta.len(),
                        mtime: meta.mtime(),
                        mtime_nsec: meta.mtime_nsec(),
                    };
                    files.push((e.path(), key));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the static pod directory"),
        }
        files.sort();
        let present: HashSet<&PathBuf> = files.iter().map(|(f, _)| f).collect();
        self.cache.retain(|p, _| present.contains(p));
        let mut pods = Vec::new();
        let mut invalid = Vec::new();
        let mut names: BTreeMap<(String, String), PathBuf> = BTreeMap::new();
        for (path, key) in files {
            let parsed = match self.cache.get(&path) {
                Some((k, parsed)) if *k == key => parsed.clone(),
                _ => {
                    let parsed = read_manifest(&path).and_then(|b| parse_static_pod(&b, &path, &self.node_name));
                    if let Err(e) = &parsed {
                        tracing::warn!(manifest = %path.display(), error = %e, "invalid static pod manifest");
                    }
                    self.cache.insert(path.clone(), (key, parsed.clone()));
                    parsed
                }
            };
            match parsed {
                Ok(pod) => {
                    let full = (
                        pod.metadata.namespace.clone().unwrap_or_default(),
                        pod.metadata.name.clone().unwrap_or_default(),
                    );
                    if let Some(first) = names.get(&full) {
                        let error = ManifestError::Invalid {
                            field: "metadata.name".into(),
                            message: format!("pod {}/{} is already defined in {}", full.0, full.1, first.display()),
                        };
                        invalid.push(InvalidManifest { path, error });
                    } else {
                        names.insert(full, path);
                        pods.push(pod);
                    }
                }
                Err(error) => invalid.push(InvalidManifest { path, error }),
            }
        }
        SourceSnapshot { source: "file", pods, invalid }
    }

    fn watch(&self) -> Option<inotify::EventStream<Vec<u8>>> {
        let inotify = match Inotify::init() {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "cannot use inotify; the static pod directory is only rescanned");
                return None;
            }
        };
        let mask = WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::CREATE
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        if let Err(e) = inotify.watches().add(&self.dir, mask) {
            if self.dir.exists() {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the static pod directory");
            }
            return None;
        }
        inotify.into_event_stream(vec![0u8; 16 * 1024]).ok()
    }
}

/// Whether an inotify event calls for a rescan; `None` when the watch itself is gone.
fn wants_rescan(mask: EventMask, name: Option<&std::ffi::OsStr>) -> Option<bool> {
    if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED) {
        return None;
    }
    if mask.contains(EventMask::Q_OVERFLOW) {
        return Some(true);
    }
    Some(name.is_none_or(|n| !is_ignored_file(&n.to_string_lossy())))
}

impl PodSource for StaticPodSource {
    async fn run(mut self, tx: mpsc::Sender<SourceSnapshot>, shutdown: CancellationToken) {
        let mut events = self.watch();
        if events.is_none() && !self.dir.exists() {
            tracing::warn!(dir = %self.dir.display(), "the static pod directory does not exist; checking again every {:?}", self.resync);
        }
        let mut last: Option<SourceSnapshot> = None;
        loop {
            // Events that are already queued (a burst of renames, or those that came during the last scan) are
            // taken by this one scan, instead of one scan and one snapshot each.
            while let Some(ev) = next_event(&mut events).now_or_never() {
                if ev.is_none() {
                    events = self.watch();
                    break;
                }
            }
            let snapshot = self.scan();
            if last.as_ref() != Some(&snapshot) {
                if tx.send(snapshot.clone()).await.is_err() {
                    return;
                }
                last = Some(snapshot);
            }
            let resync = tokio::time::sleep(self.resync);
            tokio::pin!(resync);
            loop {
                tokio::select! {
                    () = &mut resync => {
                        if events.is_none() {
                            events = self.watch();
                        }
                        break;
                    }
                    () = shutdown.cancelled() => return,
                    ev = next_event(&mut events) => match ev {
                        Some(true) => break,
                        Some(false) => {}
                        None => {
                            // The directory was removed or replaced: watch it again (if it is there) and rescan.
                            events = self.watch();
                            break;
                        }
                    },
                }
            }
        }
    }
}

/// The next inotify event's verdict; pending forever without a watch.
async fn next_event(events: &mut Option<inotify::EventStream<Vec<u8>>>) -> Option<bool> {
    let Some(stream) = events.as_mut() else { return std::future::pending().await };
    match stream.next().await {
        Some(Ok(ev)) => wants_rescan(ev.mask, ev.name.as_deref()),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "inotify read failed; watching again");
            None
        }
        None => None,
    }
}

/// Where a manifest file lives, for messages: its name in the directory.
pub fn manifest_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec: {containers: [{name: a, image: b}]}\n";

    #[test]
    fn ignores_editor_files() {
        for f in [".web.yaml.swp", "web.yaml~", "#web.yaml#", ".#web.yaml", "4913", "web.yaml.dpkg-old", "x.tmp"] {
            assert!(is_ignored_file(f), "{f}");
        }
        for f in ["web.yaml", "web.json", "web"] {
            assert!(!is_ignored_file(f), "{f}");
        }
    }

    #[test]
    fn scans_and_reports_invalid_files_beside_valid_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), "kind: Deployment\n").unwrap();
        std::fs::write(dir.path().join("c.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join(".a.yaml.swp"), "garbage").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut src = StaticPodSource::new(dir.path(), "n", Duration::from_secs(20));
        let s = src.scan();
        assert_eq!(s.pods.len(), 1);
        assert_eq!(s.pods[0].metadata.name.as_deref(), Some("a-n"));
        assert_eq!(s.invalid.len(), 2);
        assert!(s.invalid[0].error.to_string().contains("not a Pod"));
        assert!(s.invalid[1].error.to_string().contains("already defined in"), "{}", s.invalid[1].error);
        // Unchanged files give the same snapshot; removing one drops it.
        assert_eq!(src.scan(), s);
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        let s = src.scan();
        assert_eq!(s.pods.len(), 1, "c.yaml's pod is no longer a duplicate");
        assert_eq!(s.invalid.len(), 1);
    }

    #[tokio::test]
    async fn inotify_reports_writes_renames_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let src = StaticPodSource::new(dir.path(), "n", Duration::from_secs(3600));
        let (tx, mut rx) = mpsc::channel(4);
        tokio::spawn(src.run(tx, CancellationToken::new()));
        async fn recv(rx: &mut mpsc::Receiver<SourceSnapshot>) -> SourceSnapshot {
            tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("no snapshot within 5 s").unwrap()
        }
        assert!(recv(&mut rx).await.pods.is_empty());
        // An editor's swap file does not cause a snapshot; a write does.
        std::fs::write(dir.path().join(".w.yaml.swp"), "x").unwrap();
        std::fs::write(dir.path().join("w.yaml"), POD.replace("NAME", "w")).unwrap();
        assert_eq!(recv(&mut rx).await.pods.len(), 1);
        // Replace by rename, as editors and config management do: a new UID.
        let tmp = dir.path().join(".w.yaml.new");
        std::fs::write(&tmp, POD.replace("NAME", "w").replace("image: b", "image: c")).unwrap();
        std::fs::rename(&tmp, dir.path().join("w.yaml")).unwrap();
        assert_eq!(recv(&mut rx).await.pods[0].spec.as_ref().unwrap().containers[0].image.as_deref(), Some("c"));
        std::fs::remove_file(dir.path().join("w.yaml")).unwrap();
        assert!(recv(&mut rx).await.pods.is_empty());
    }

    #[tokio::test]
    async fn a_burst_of_renames_is_one_scan() {
        let dir = tempfile::tempdir().unwrap();
        let staging = tempfile::tempdir_in(dir.path()).unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        let src = StaticPodSource::new(&manifests, "n", Duration::from_secs(3600));
        let (tx, mut rx) = mpsc::channel(64);
        tokio::spawn(src.run(tx, CancellationToken::new()));
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert!(first.pods.is_empty());
        for i in 0..20 {
            std::fs::write(staging.path().join(format!("p{i}.yaml")), POD.replace("NAME", &format!("p{i}"))).unwrap();
        }
        // The source task runs only once this (current-thread) test yields, with every event queued by then.
        for i in 0..20 {
            let f = format!("p{i}.yaml");
            std::fs::rename(staging.path().join(&f), manifests.join(&f)).unwrap();
        }
        let snap = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert_eq!(snap.pods.len(), 20);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(rx.try_recv().is_err(), "one snapshot for the whole burst");
    }
}
